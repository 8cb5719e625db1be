"""Hierarchical drafting (notebook 05): the n-gram level, greedy identity with an n-gram M1, exact
sampling over 6-token outputs with loop-back at work, and planted bugs the exactness test catches."""
import pytest
import torch

from specdec_utils import generate
from specdec_utils.core.engine import Sampler, decode
from specdec_utils.core.hierarchy import HierarchicalProposer, HierarchyPolicy, NoLoopPolicy
from specdec_utils.core.ngram import NgramDraft
from specdec_utils.exactness import ToyLM, chi_square_p_value, exact_distribution, sample_outputs, total_variation

from conftest import TINY_VOCAB, noisy_copy, random_model, random_prompt

pytestmark = pytest.mark.usefixtures("single_thread")


# --- the n-gram level ---------------------------------------------------------------------------

def test_ngram_prefers_the_live_text_then_the_table_longest_context_first(tmp_path):
    table = NgramDraft.build([([5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 9], 0)], vocab_size=20, min_count=1)
    assert table.tables[3][(5, 6, 7)] == ([9, 8], [2, 1])  # most frequent first
    # the live text wins: after (1, 2, 3) came 4 earlier in this context
    assert table.lookup([1, 2, 3, 4, 0, 1, 2, 3]) == ([4], [1]) and table.last_source == "context-3"
    # no 3-token match in the text: the corpus trigram
    assert table.lookup([0, 5, 6, 7]) == ([9, 8], [2, 1]) and table.last_source == "table-3"
    # only a 2-token match in the text, before the corpus bigram
    assert table.lookup([3, 6, 11, 4, 6, 11]) == ([4], [1]) and table.last_source == "context-2"
    assert table.lookup([0, 1, 19]) is None and table.last_source is None
    logits = table.next_logits([0, 5, 6, 7])
    assert logits.shape == (20,) and torch.allclose(logits.softmax(-1)[[9, 8]], torch.tensor([2 / 3, 1 / 3]))
    table.save(tmp_path / "ngram", log={"note": "test"})
    loaded = NgramDraft.load(tmp_path / "ngram")
    assert loaded.tables == table.tables and loaded.vocab_size == 20
    with pytest.raises(FileNotFoundError, match="train_draft --names ngram"):
        NgramDraft.load(tmp_path / "missing")


def test_ngram_context_ties_go_to_the_most_recent():
    table = NgramDraft({3: {}, 2: {}}, vocab_size=10)
    assert table.lookup([1, 2, 3, 1, 2, 4, 1, 2]) == ([4, 3], [1, 1])


# --- greedy: token-identical to the target alone ------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    target = random_model("tiny-llama", seed=0)
    middle = noisy_copy(target, noise=0.01, seed=2)
    prompts = [random_prompt(length, seed) for seed, length in enumerate((2, 7, 12))]
    # an n-gram table of the target's own greedy continuations of other prompts
    corpus = []
    for seed in range(10, 40):
        prompt = random_prompt(4, seed)
        corpus.append((prompt[0].tolist() + generate(target, prompt, 24, method="ar").new_token_ids, 4))
    return target, middle, prompts, NgramDraft.build(corpus, TINY_VOCAB, min_count=1)


@pytest.mark.parametrize("method", ["hierarchical", "hierarchical-noloop"])
@pytest.mark.parametrize("params", [{}, {"theta1": 50.0, "theta2": 50.0, "max_small": 3, "gamma": 7},
                                    {"max_small": 0, "gamma": 1}])
def test_greedy_with_an_ngram_bottom_level_equals_the_target_alone(tiny, method, params):
    target, middle, prompts, table = tiny
    sources = set()
    for input_ids in prompts:
        for max_new_tokens in (1, 9, 30):
            plain = generate(target, input_ids, max_new_tokens, method="ar")
            result = generate(target, input_ids, max_new_tokens, method=method, draft=middle, draft_small=table,
                              gamma=params.get("gamma"), params={k: v for k, v in params.items() if k != "gamma"})
            assert result.new_token_ids == plain.new_token_ids, (method, params, max_new_tokens)
            for r in result.rounds:
                assert len(r.detail["sources"]) == r.drafted
                assert r.detail["small_accepted"] + r.detail["middle_tokens"] == r.drafted
                assert r.detail["small_forwards"] == 0  # a lookup, no forward pass
                sources |= set(r.detail["sources"][:r.accepted])
    if params.get("max_small", 4):
        assert "small" in sources  # the n-gram level's tokens did reach the output


def test_greedy_stops_at_eos_and_respects_the_budget(tiny):
    target, middle, prompts, table = tiny
    free_run = generate(target, prompts[1], 30, method="ar").new_token_ids
    eos = next(token for i, token in enumerate(free_run) if i >= 5 and token not in free_run[:i])
    for method in ("hierarchical", "hierarchical-noloop"):
        result = generate(target, prompts[1], 30, method=method, draft=middle, draft_small=table, eos_token_id=eos,
                          params={"theta1": 50.0, "theta2": 50.0})
        assert result.new_token_ids == free_run[:free_run.index(eos) + 1]


def test_hierarchical_needs_both_drafts_and_says_so(tiny):
    target, middle, prompts, table = tiny
    with pytest.raises(ValueError, match="needs draft_small=... \\(M1"):
        generate(target, prompts[0], 5, method="hierarchical", draft=middle)
    with pytest.raises(ValueError, match="needs a draft model"):
        generate(target, prompts[0], 5, method="hierarchical", draft_small=table)
    with pytest.raises(ValueError, match="draft_small must be a model or an n-gram table"):
        generate(target, prompts[0], 5, method="hierarchical", draft=middle, draft_small="draft-s")
    with pytest.raises(ValueError, match="share the output vocabulary"):
        generate(target, prompts[0], 5, method="hierarchical", draft=middle,
                 draft_small=NgramDraft({3: {}, 2: {}}, vocab_size=TINY_VOCAB + 1))
    with pytest.raises(ValueError, match="max_small must be an integer >= 0"):
        generate(target, prompts[0], 5, method="hierarchical", draft=middle, draft_small=table,
                 params={"max_small": -1})


# --- sampling: exact over whole 6-token outputs ------------------------------------------------

VOCAB, N_TOKENS, TRIALS, MIN_P_VALUE = 4, 6, 6000, 1e-3
# 6,000 outputs (4,096 possible) detect TV >= 0.053 (90% power at alpha 1e-3, worst direction; computed once
# with `exactness.min_detectable_tv` on the exact distribution)


@pytest.fixture(scope="module")
def toy():
    """Target, M2 and M1 (a toy model, or an n-gram table of toy-target samples), and the target's
    exact distribution over its 4,096 outputs of 6 tokens."""
    target = ToyLM(VOCAB, seed=0)
    middle = ToyLM(VOCAB, seed=1, sharpness=1.0)
    small = ToyLM(VOCAB, seed=2, sharpness=1.5)
    prompt = torch.tensor([[1, 0, 2]])
    generator = torch.Generator().manual_seed(5)
    corpus = [(list(range(3)) + generate(target, prompt, 8, method="ar", temperature=1.0, generator=generator)
               .new_token_ids, 3) for _ in range(40)]
    table = NgramDraft.build(corpus, VOCAB, min_count=1)
    return target, middle, {"model": small, "ngram": table}, prompt, exact_distribution(
        target, prompt, N_TOKENS, Sampler(1.0))


def sampled(toy, make_policy, small="model", proposer=HierarchicalProposer, trials=TRIALS):
    target, middle, smalls, prompt, _ = toy
    stops, loops = [], []

    def run(generator):
        result = decode(target, proposer(smalls[small], middle), make_policy(), prompt, N_TOKENS,
                        Sampler(1.0), set(), generator, "hierarchical")
        stops.extend(r.stop for r in result.rounds)
        loops.extend(r.detail.get("pre_verifications", 0) for r in result.rounds)
        return result.new_token_ids

    return sample_outputs(run, trials, seed=0), stops, loops


POLICIES = {"fixed": lambda: HierarchyPolicy(gamma=5, max_small=2, theta1=0.9, theta2=1.0),  # loop-back fires and not
            # adaptive thresholds
            "adaptive": lambda: HierarchyPolicy(gamma=5, max_small=3, theta1_0=1.0, theta2_0=1.2),
            "noloop": lambda: NoLoopPolicy(gamma=5, max_small=3, theta1=0.9)}


# every policy with the toy model as M1, and the n-gram table as M1 under the policy that loops back; the other
# two pairs of policy and M1 are left out for CI time (each pair is 6,000 generations)
@pytest.mark.stat
@pytest.mark.parametrize("policy, small", [("fixed", "model"), ("adaptive", "model"), ("noloop", "model"),
                                           ("fixed", "ngram")], ids=lambda v: v)
def test_sampled_outputs_follow_the_target_distribution(toy, small, policy):
    make_policy = POLICIES[policy]
    counts, stops, loops = sampled(toy, make_policy, small)
    assert chi_square_p_value(counts, toy[4]) > MIN_P_VALUE, total_variation(counts, toy[4])
    assert "middle rejected" in stops  # both levels rejected tokens ...
    if make_policy().loop_back:
        assert "middle unsure" in stops and max(loops) >= 2  # ... and M2 looped back to M1


class UsesSmallRows(HierarchicalProposer):
    """Planted bug: hand the target M1's distributions as the proposal of the tokens M1 drafted."""

    def pre_verify(self, small_tokens, small_rows, logits, sampler, generator):
        new, n_accepted, rows, confidence = super().pre_verify(small_tokens, small_rows, logits, sampler, generator)
        return new, n_accepted, small_rows[:n_accepted] + rows[n_accepted:], confidence


class DropsTheCorrection(HierarchicalProposer):
    """Planted bug: after M2 rejects, commit M1's accepted tokens without M2's
    correction. The survivors are then conditioned on a rejection that came after them."""

    def pre_verify(self, small_tokens, small_rows, logits, sampler, generator):
        new, n_accepted, rows, confidence = super().pre_verify(small_tokens, small_rows, logits, sampler, generator)
        if n_accepted < len(small_tokens):
            return new[:n_accepted], n_accepted, rows[:n_accepted], confidence[:n_accepted]
        return new, n_accepted, rows, confidence


@pytest.mark.stat
@pytest.mark.parametrize("proposer", [UsesSmallRows, DropsTheCorrection])
def test_the_exactness_check_fails_planted_hierarchy_bugs(toy, proposer):
    counts, _, _ = sampled(toy, lambda: HierarchyPolicy(gamma=5, max_small=3, theta1=0.9, theta2=1.0),
                           proposer=proposer)
    assert chi_square_p_value(counts, toy[4]) < 1e-10


def test_thresholds_are_running_means_of_rejected_entropies():
    policy = HierarchyPolicy(theta1_0=0.5, theta2_0=0.7)
    policy.middle_rejected(1.0)
    policy.middle_rejected(2.0)
    assert policy.theta1 == 1.5
    middle = {"middle_entropies": [0.1, 0.4, 0.9]}  # M2's entropy at each pending token, from the proposer
    policy.observe(type("S", (), {"accepted": 1, "drafted": 3, "detail": middle})())
    policy.observe(type("S", (), {"accepted": 3, "drafted": 3, "detail": middle})())  # all accepted: nothing to learn
    assert policy.theta2 == 0.4
    fixed = HierarchyPolicy(theta1=0.3, theta2=0.2)
    fixed.middle_rejected(5.0)
    assert (fixed.theta1, fixed.theta2) == (0.3, 0.2)


def test_a_hierarchy_policy_object_runs_with_both_drafts(tiny):
    target, middle, prompts, table = tiny
    plain = generate(target, prompts[2], 20, method="ar").new_token_ids
    result = generate(target, prompts[2], 20, method=HierarchyPolicy(max_small=2, theta1=50.0, theta2=50.0),
                      draft=middle, draft_small=table)
    assert result.new_token_ids == plain and result.method == "hierarchical"
    with pytest.raises(ValueError, match="policy 'hierarchical-noloop' needs draft_small"):
        generate(target, prompts[2], 20, method=NoLoopPolicy(), draft=middle)
