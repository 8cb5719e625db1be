"""The one decode loop (`engine.decode`, `methods.generate`) and every method it runs.

- greedy: every method's output is token-identical to the target's own greedy decoding, for drafts
  that agree often and rarely, several draft lengths, token budgets ending mid-round and an EOS
  inside a round (a seeded sample of those combinations), with policy parameters that make every
  stopping rule fire;
- sampling (marked `stat`): every method's output, whole sequences of several tokens, follows the
  target's exact distribution (enumerated on a tiny vocabulary, chi-square test), and the same test
  fails on planted bugs, one of them small (a residual mixed 5% with p) and seen through the token
  drawn after a rejection. Each test states the smallest bias it detects (total variation, 90% power
  at alpha 1e-3, worst direction), from `exactness.min_detectable_tv` run once on its exact distribution;
- per-round statistics add up; bad arguments fail with one clear message.
"""
import itertools
import math
import random
from collections import Counter

import pytest
import torch

from specdec_utils.core import policies, sampling
from specdec_utils.core.engine import DraftModelProposer, Proposal, RoundStats, Sampler, decode
from specdec_utils.core.medusa import MedusaHeads
from specdec_utils.core.methods import METHODS, POLICIES, generate, policy_parameters
from specdec_utils.core.stop_head import StopHead
from specdec_utils.exactness import ToyLM, chi_square_p_value, exact_distribution, sample_outputs, total_variation

from conftest import noisy_copy, random_model, random_prompt

pytestmark = pytest.mark.usefixtures("single_thread")

# the EAGLE methods and the block drafter read a Llama's layer features through a model built for it
# (tests/test_eagle.py and tests/test_block.py have their greedy, end-of-sequence and sampled checks); every other
# method runs here on both tiny families
EAGLE = ("eagle-chain", "eagle", "block", "block-confidence")
SPECULATIVE = [m for m in METHODS if m != "ar" and m not in EAGLE]


def method_params(method: str, hidden_size: int, reference=None) -> dict:
    """Parameters that make each policy's own stopping rule fire often on tiny models."""
    torch.manual_seed(0)
    return {"adaptive-dual": {"entropy_threshold": 4.0},
            "oracle": {"reference": reference},
            "entropy-stop": {"theta0": 0.0},
            "confidence-stop": {"threshold": 0.5},
            "adaedl": {"lam0": 0.5},
            "learned-stop": {"head": StopHead(hidden_size), "threshold": 0.3},
            # start confident, so that M2 loops back to M1 until the first rejections set the thresholds
            "hierarchical": {"theta1_0": 20.0, "theta2_0": 20.0, "max_small": 2},
            "hierarchical-noloop": {"theta1_0": 20.0, "max_small": 3},
            "medusa": {"tree": "cartesian", "topk": 3, "tree_nodes": 12},
            "draft-tree": {"width": 2, "tree_nodes": 10}}.get(method, {})


_HEADS = {}


def heads_for(target):
    """Medusa heads for `target` (ignored by the other methods): random residual blocks, so that the
    guesses differ from the target's next-token prediction."""
    if id(target) not in _HEADS:
        heads = MedusaHeads(target, 3)
        with torch.no_grad():
            for block in heads.blocks:
                torch.nn.init.normal_(block.weight, std=0.3, generator=torch.Generator().manual_seed(4))
        _HEADS[id(target)] = (target, heads)
    return _HEADS[id(target)][1]


_SMALL = {}


def other(drafts: dict, draft):
    """M1 for the hierarchical methods (ignored by the others): a noisy copy of M2, so that M2
    accepts some of its tokens and loops back to it."""
    if id(draft) not in _SMALL:
        _SMALL[id(draft)] = (draft, noisy_copy(draft, noise=0.02, seed=3))
    return _SMALL[id(draft)][1]


FAMILIES = ("tiny-llama", "tiny-gpt2")


@pytest.fixture(scope="module")
def families():
    """Per model family: a tiny target and its drafts, one close to it and one unrelated."""
    built = {}
    for family in FAMILIES:
        target = random_model(family, seed=0)
        built[family] = target, {"close": noisy_copy(target, noise=0.01, seed=2),
                                 "unrelated": random_model(family, seed=1)}
    return built


@pytest.fixture(scope="module", params=FAMILIES)
def models(request, families):
    return families[request.param]


# --- greedy: token-identical to the target alone ------------------------------------------------

GAMMAS, BUDGETS = (1, 3, 5), (1, 7, 26)  # budgets: one token, ending mid-round, many rounds
PROMPT_LENGTHS = (1, 6, 13)  # prompt i: random_prompt(PROMPT_LENGTHS[i], seed=i)


def greedy_cases(method: str) -> list[tuple]:
    """A seeded sample of (family, draft, gamma, prompt, budget), 4 of the 108 combinations per method:
    each family with each draft (close, unrelated) once, with gamma, prompt and budget drawn at random;
    the first case runs the longest budget, so that the policy's own rule has rounds to fire in."""
    rng = random.Random(f"greedy {method}")
    cases = []
    for i, (family, draft) in enumerate(itertools.product(FAMILIES, ("close", "unrelated"))):
        budget = BUDGETS[-1] if i == 0 else rng.choice(BUDGETS)
        cases.append((family, draft, rng.choice(GAMMAS), rng.randrange(len(PROMPT_LENGTHS)), budget))
    return cases


@pytest.mark.parametrize("method", SPECULATIVE)
def test_greedy_output_equals_the_target_alone(families, method):
    stops = set()
    for case in greedy_cases(method):
        family, draft_kind, gamma, prompt, max_new_tokens = case
        target, drafts = families[family]
        draft = drafts[draft_kind]
        input_ids = random_prompt(PROMPT_LENGTHS[prompt], prompt)
        plain = generate(target, input_ids, max_new_tokens, method="ar")
        params = method_params(method, draft.get_output_embeddings().in_features, plain.new_token_ids)
        result = generate(target, input_ids, max_new_tokens, method=method, draft=draft, gamma=gamma,
                          params=params, draft_small=other(drafts, draft), heads=heads_for(target))
        assert result.new_token_ids == plain.new_token_ids, (method, case)
        check_round_statistics(result)
        stops |= {r.stop for r in result.rounds}
    own_reason = {"entropy-stop": "entropy", "confidence-stop": "confidence", "adaedl": "adaedl",
                  "learned-stop": "learned", "oracle": "oracle", "hierarchical": "middle unsure",
                  "hierarchical-noloop": "no loop-back"}.get(method)
    if own_reason:  # guards the test: the policy's own rule did stop rounds
        assert own_reason in stops


@pytest.mark.parametrize("method", SPECULATIVE)
def test_greedy_stops_at_an_eos_inside_a_round(models, method):
    target, drafts = models
    input_ids = random_prompt(5, 7)
    free_run = generate(target, input_ids, 30, method="ar").new_token_ids
    eos = next(token for i, token in enumerate(free_run) if i >= 6 and token not in free_run[:i])
    expected = free_run[:free_run.index(eos) + 1]
    for draft in drafts.values():
        params = method_params(method, draft.get_output_embeddings().in_features, expected)
        result = generate(target, input_ids, 30, method=method, draft=draft, gamma=4, eos_token_id=eos, params=params,
                          draft_small=other(drafts, draft), heads=heads_for(target))
        assert result.new_token_ids == expected


def check_round_statistics(result):
    rounds = result.rounds
    assert len(rounds) == result.target_calls
    assert sum(r.drafted for r in rounds) == result.drafted
    assert sum(r.accepted for r in rounds) == result.accepted == sum(result.accepted_per_position)
    assert sum(r.draft_calls for r in rounds) == result.draft_calls
    assert sum(r.new_tokens for r in rounds) == len(result.new_token_ids)
    for r in rounds:
        assert 0 <= r.accepted <= r.drafted
        if r.stop != "tree":  # a tree round drafts many nodes per forward (one per level, or none: Medusa)
            assert r.drafted <= r.draft_calls
        assert r.new_tokens <= r.accepted + 1
        assert min(r.draft_ms, r.verify_ms, r.bookkeeping_ms) >= 0
        assert r.stop in {"gamma", "budget", "no draft", "entropy", "confidence", "adaedl", "learned", "oracle",
                          "middle rejected", "middle unsure", "no loop-back", "tree"}
        if r.stop == "gamma":
            assert r.drafted == r.gamma


def test_ar_is_one_target_pass_per_token(models):
    target, _ = models
    result = generate(target, random_prompt(4, 0), 12, method="ar")
    assert result.target_calls == 12 and result.draft_calls == result.drafted == 0
    assert {r.stop for r in result.rounds} == {"no draft"}


def test_the_oracle_never_wastes_a_draft(models):
    target, drafts = models
    input_ids = random_prompt(6, 1)
    reference = generate(target, input_ids, 40, method="ar").new_token_ids
    oracle = generate(target, input_ids, 40, method="oracle", draft=drafts["close"], params={"reference": reference})
    fixed = generate(target, input_ids, 40, method="greedy", draft=drafts["close"], gamma=4)
    assert oracle.accepted == oracle.drafted > 0
    assert oracle.target_calls <= fixed.target_calls


# --- sampling: the output follows the target's distribution exactly ----------------------------

VOCAB, N_TOKENS, TRIALS = 5, 3, 3000
EOS = 4
MIN_P_VALUE = 1e-3
# 3,000 whole outputs (85 possible) detect TV >= 0.049. At top-p 0.8 only 2 outputs remain possible (this toy
# target is sharp: top-p keeps one token at most steps), so the top-p runs check little beyond that (TV 0.035).


@pytest.fixture(scope="module")
def toy():
    """A toy target, a draft that is neither close nor useless, and the target's exact distribution
    over its outputs of up to 3 tokens (ending early at EOS), at temperature 1 and with top-p."""
    target, draft = ToyLM(VOCAB, seed=0), ToyLM(VOCAB, seed=1, sharpness=1.0)
    prompt = torch.tensor([[1, 3, 2]])
    exact = {top_p: exact_distribution(target, prompt, N_TOKENS, Sampler(1.0, 0, top_p), {EOS}) for top_p in (1.0, 0.8)}
    return target, draft, prompt, exact


TOY_SMALL = ToyLM(VOCAB, seed=2, sharpness=1.5)  # M1 of the hierarchical methods


def run_method(toy, method, top_p=1.0, gamma=2, **overrides):
    target, draft, prompt, _ = toy
    params = method_params(method, 8) if method != "oracle" else {}
    if method == "adaedl":
        params["lam0"] = 0.7  # stops above 0.45 nats: the toy draft's entropies are at most log(5)
    params.update(overrides)
    stops = []

    def run(generator):
        result = generate(target, prompt, N_TOKENS, method=method, draft=draft, gamma=gamma, temperature=1.0,
                          top_p=top_p, eos_token_id=EOS, generator=generator, params=params, draft_small=TOY_SMALL)
        stops.extend(r.stop for r in result.rounds)
        return result.new_token_ids

    return sample_outputs(run, TRIALS, seed=0), stops


# ToyLM ignores attention masks and positions, so it cannot verify a tree: the tree methods have their
# own exactness tests on a tiny Llama (tests/test_tree.py, tests/test_eagle.py)
@pytest.mark.stat
@pytest.mark.parametrize("method", [m for m in METHODS
                                    if m not in ("oracle", "greedy", "medusa", "draft-tree", *EAGLE)])
def test_sampled_outputs_follow_the_target_distribution(toy, method):  # detects TV >= 0.049
    """Whole outputs of up to three tokens, jointly: Leviathan et al. 2023, Theorem 3.5, for every
    drafting policy (each decides from the draft's own tokens only)."""
    counts, stops = run_method(toy, method)
    exact = toy[3][1.0]
    assert chi_square_p_value(counts, exact) > MIN_P_VALUE, (method, total_variation(counts, exact))
    if method not in ("ar", "draft", "adaptive-hf", "adaptive-dual", "hierarchical", "hierarchical-noloop"):
        # (the hierarchical rules need longer outputs: tests/test_hierarchy.py)
        assert POLICIES[method].reason in stops  # the stopping rule really fired


@pytest.mark.stat
@pytest.mark.parametrize("method", ["sampling", "entropy-stop", "learned-stop", "hierarchical"])
def test_sampled_outputs_follow_the_target_distribution_with_top_p(toy, method):  # TV >= 0.035, 2 outputs
    counts, _ = run_method(toy, method, top_p=0.8, gamma=3)
    assert chi_square_p_value(counts, toy[3][0.8]) > MIN_P_VALUE


@pytest.mark.stat
def test_the_exactness_check_fails_a_wrong_residual(toy, monkeypatch):
    """Planted bug 1: after a rejection, resample from p instead of the residual max(0, p - q)."""
    monkeypatch.setattr(sampling, "_residual_distribution", lambda target_row, draft_row: target_row)
    counts, _ = run_method(toy, "sampling")
    assert chi_square_p_value(counts, toy[3][1.0]) < 1e-10


RESIDUAL_PROMPT, RESIDUAL_TRIALS = torch.tensor([[1, 0, 0]]), 1000


def after_first_rejection(toy, trials=RESIDUAL_TRIALS):
    """Counts of the token emitted when the first round's only draft is rejected at RESIDUAL_PROMPT,
    where the toy draft is often rejected (P = 0.33) and the target's p puts 63% of its mass on tokens
    that the residual never emits (p <= q there), with the exact distribution of that token, the
    residual norm(max(0, p - q)) (computed here, not by the code under test)."""
    target, draft, _, _ = toy
    sampler = Sampler(1.0)
    with torch.no_grad():
        p, q = (sampler.probs(model(input_ids=RESIDUAL_PROMPT).logits[0, -1].double()) for model in (target, draft))
    residual = (p - q).clamp(min=0)
    counts = Counter()
    generator = torch.Generator().manual_seed(0)
    for _ in range(trials):
        result = generate(target, RESIDUAL_PROMPT, 2, method="sampling", draft=draft, gamma=1, temperature=1.0,
                          generator=generator)
        if result.rounds[0].drafted == 1 and result.rounds[0].accepted == 0:
            counts[result.new_token_ids[0]] += 1
    return counts, dict(enumerate((residual / residual.sum()).tolist()))


@pytest.mark.stat
def test_the_exactness_check_catches_a_residual_mixed_5_percent_with_p(toy, monkeypatch):
    """Planted bug 4, a small bias: after a rejection, draw from 0.95 norm(max(0, p - q)) + 0.05 p. The
    whole-output test misses it: at RESIDUAL_PROMPT the first token moves by TV 0.05 * P(reject) 0.33 *
    TV(p, residual) 0.63 = 0.010, where 3,000 whole outputs resolve TV 0.058 (p = 0.71 correct, 0.86 with
    the bug, run once). The token drawn after a rejection is a summary that sees it: 5% * 63% = 3.2% of
    that token's mass lands where the residual has none, about 10 impossible tokens among the ~330
    rejections of 1,000 generations (missed with probability e^-10). Correct code passes the same summary,
    which resolves TV >= 0.12 within the residual's support (3 tokens) and catches, with 90% power, any
    bug that puts >= 0.7% of that token's mass outside it (1 - (1 - 0.007)^330 >= 0.9)."""
    counts, residual = after_first_rejection(toy)
    assert chi_square_p_value(counts, residual) > MIN_P_VALUE, counts
    real = sampling._residual_distribution

    def mixed(target_row, draft_row):
        rest = real(target_row, draft_row)
        return 0.95 * rest / rest.sum() + 0.05 * target_row / target_row.sum()

    monkeypatch.setattr(sampling, "_residual_distribution", mixed)
    counts, residual = after_first_rejection(toy)
    assert chi_square_p_value(counts, residual) < 1e-10, counts


class PeekingProposer(DraftModelProposer):
    """Planted bug 2: a proposer that looks at the target. It keeps drafted tokens only while the
    target finds each at least as likely as the draft does, and drops the first one it would often
    reject: the target then emits its bonus token from p where exactness needs the residual draw."""

    def __init__(self, draft, target):
        super().__init__(draft)
        self.target = target

    def propose(self, tokens, gamma, policy, sampler, generator, index):
        proposal = super().propose(tokens, gamma, policy, sampler, generator, index)
        k = len(proposal.tokens)
        if not k:
            return proposal
        candidate = torch.cat([tokens, proposal.tokens[None]], dim=1)
        p = sampler.probs(self.target(input_ids=candidate).logits[0, tokens.shape[1] - 1:-1])
        keep = 0
        while keep < k and p[keep, proposal.tokens[keep]] >= proposal.probs[keep, proposal.tokens[keep]]:
            keep += 1
        return Proposal(proposal.tokens[:keep], proposal.probs[:keep], "peek", proposal.draft_calls, proposal.vocab)


@pytest.mark.stat
def test_the_exactness_check_fails_a_proposer_that_peeks_at_the_target(toy):
    target, draft, prompt, exact = toy

    def run(generator):
        return decode(target, PeekingProposer(draft, target), policies.DraftingPolicy(2), prompt, N_TOKENS,
                      Sampler(1.0), {EOS}, generator).new_token_ids

    counts = sample_outputs(run, TRIALS, seed=0)
    assert chi_square_p_value(counts, exact[1.0]) < 1e-10


LONG_VOCAB, LONG_TOKENS, LONG_TRIALS = 4, 6, 8000  # 8,000 outputs (4,096 possible) detect TV >= 0.047


@pytest.fixture(scope="module")
def long_toy():
    """Outputs of exactly 6 tokens on a 4-token vocabulary (4,096 of them). With 3-token outputs a
    round-level policy cannot matter: after the first round the budget leaves room for at most one
    draft. Here a policy that starts at gamma 1 and grows it changes what later rounds draft."""
    target, draft = ToyLM(LONG_VOCAB, seed=0), ToyLM(LONG_VOCAB, seed=1, sharpness=1.0)
    prompt = torch.tensor([[1, 0, 2]])
    return target, draft, prompt, exact_distribution(target, prompt, LONG_TOKENS, Sampler(1.0))


def long_counts(long_toy, make_run):
    target, draft, prompt, _ = long_toy
    drafted = []

    def run(generator):
        result = make_run(target, draft, prompt, generator)
        drafted.extend(r.drafted for r in result.rounds[1:])
        return result.new_token_ids

    return sample_outputs(run, LONG_TRIALS, seed=0), drafted


@pytest.mark.stat
@pytest.mark.parametrize("method", ["adaptive-hf", "adaptive-dual"])
def test_adaptive_gamma_keeps_sampling_exact_when_gamma_changes_the_rounds(long_toy, method):  # TV >= 0.047
    counts, drafted = long_counts(long_toy, lambda target, draft, prompt, generator: generate(
        target, prompt, LONG_TOKENS, method=method, draft=draft, params={"start": 1}, temperature=1.0,
        generator=generator))
    assert max(drafted) >= 2  # gamma grew past its start, and a later round drafted more than one token
    assert chi_square_p_value(counts, long_toy[3]) > MIN_P_VALUE, total_variation(counts, long_toy[3])


@pytest.mark.stat
def test_the_long_exactness_check_fails_a_proposer_that_peeks_at_the_target(long_toy):
    """The same check has the power to see a biased proposer at this size."""
    counts, _ = long_counts(long_toy, lambda target, draft, prompt, generator: decode(
        target, PeekingProposer(draft, target), policies.HeuristicGamma(1), prompt, LONG_TOKENS, Sampler(1.0),
        set(), generator))
    assert chi_square_p_value(counts, long_toy[3]) < 1e-10


class DropsTokenTwo(policies.DraftingPolicy):
    """Planted bug 3, refused by the engine: a stop rule that looks at the token it is about to drop.
    Drafting x ~ q and dropping it when x == 2 proposes tokens that are not distributed as q."""

    def stop_before(self, step):
        return step.token == 2


def test_a_sampled_stop_before_cannot_read_the_token_it_would_drop(toy):
    target, draft, prompt, _ = toy
    with pytest.raises(RuntimeError, match="drawn after stop_before"):
        generate(target, prompt, 3, method=DropsTokenTwo(2), draft=draft, temperature=1.0,
                 generator=torch.Generator().manual_seed(0))
    # greedy tokens are the argmax, no randomness to bias: the rule may read them
    greedy = generate(target, prompt, 3, method=DropsTokenTwo(2), draft=draft)
    assert greedy.new_token_ids == generate(target, prompt, 3, method="ar").new_token_ids


def test_oracle_refuses_sampling(toy):
    target, draft, prompt, _ = toy
    with pytest.raises(ValueError, match="'oracle' is greedy only"):
        generate(target, prompt, 3, method="oracle", draft=draft, temperature=1.0, params={"reference": [1, 2, 3]})


# --- the policies' own rules --------------------------------------------------------------------

def stats(gamma, drafted, accepted, stop="gamma"):
    return RoundStats(gamma, drafted, accepted, stop, drafted, accepted + 1, 0.0, 0.0, 0.0)


def test_heuristic_gamma_is_plus_two_after_a_full_round_else_minus_one():
    policy = policies.HeuristicGamma(4)
    trace = []
    for drafted, accepted in [(4, 4), (6, 6), (8, 3), (7, 0), (6, 6), (8, 0)]:
        assert policy.round_gamma() == drafted
        policy.observe(stats(drafted, drafted, accepted))
        trace.append(policy.gamma)
    assert trace == [6, 8, 7, 6, 8, 7]
    policy = policies.HeuristicGamma(1)
    policy.observe(stats(1, 1, 0))
    assert policy.gamma == 1


def test_dual_signal_gamma():
    policy = policies.DualSignalGamma(4, entropy_threshold=1.0, gamma=5)
    policy.round_gamma()
    policy.entropies = [0.5, 0.5, 0.5, 0.5]
    policy.observe(stats(4, 4, 4))            # acceptance 1.0 > 0.8: +1
    assert policy.gamma == 5
    policy.round_gamma()
    policy.entropies = [0.1] * 5
    policy.observe(stats(5, 5, 5))            # capped at gamma
    assert policy.gamma == 5
    policy.round_gamma()
    policy.entropies = [3.0] * 5
    policy.observe(stats(5, 5, 1))            # 0.2 < 0.3: -1
    assert policy.gamma == 4
    policy.round_gamma()
    policy.entropies = [0.2] * 4
    policy.observe(stats(4, 4, 2))            # 0.5, confident: +1
    assert policy.gamma == 5
    policy.round_gamma()
    policy.entropies = [2.0] * 5
    policy.observe(stats(5, 5, 3))            # 0.6, unsure: unchanged
    assert policy.gamma == 5


def test_entropy_stop_threshold_is_the_mean_rejected_entropy():
    policy = policies.EntropyStop(theta0=0.0)
    assert policy.theta == 0.0
    for entropies, accepted, expected in [([1.0, 2.0, 3.0], 1, 2.0), ([0.5, 0.7], 2, 2.0), ([4.0], 0, 3.0)]:
        policy.round_gamma()
        policy.entropies = entropies
        policy.observe(stats(10, len(entropies), accepted))
        assert policy.theta == pytest.approx(expected)
    fixed = policies.EntropyStop(theta=1.5)
    fixed.round_gamma()
    fixed.entropies = [3.0]
    fixed.observe(stats(10, 1, 0))
    assert fixed.theta == 1.5


def test_an_unknown_threshold_name_fails_in_one_line():
    from specdec_utils.core.hierarchy import HierarchyPolicy
    with pytest.raises(TypeError, match="unexpected keyword argument 'tau0'"):
        policies.EntropyStop(tau0=1.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'tau2_0'"):
        HierarchyPolicy(tau2_0=1.0)
    with pytest.raises(ValueError, match=r"^unknown parameter 'tau' for method 'entropy-stop'; allowed: theta, "
                                         r"theta0$"):
        generate(ToyLM(5), torch.tensor([[1, 2]]), 2, method="entropy-stop", draft=ToyLM(5, seed=1),
                 params={"tau": 1.0})


def test_confidence_refit_minimises_fpr_plus_three_fnr():
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        scores = torch.rand(30, generator=generator).tolist()
        labels = (torch.rand(30, generator=generator) < torch.tensor(scores)).long().tolist()
        if len(set(labels)) < 2:
            continue
        chosen = policies.min_cost_threshold(scores, labels)

        def cost(t):
            positive = [s >= t for s in scores]
            tpr = sum(p and y for p, y in zip(positive, labels)) / sum(labels)
            fpr = sum(p and not y for p, y in zip(positive, labels)) / (len(labels) - sum(labels))
            return fpr + 3 * (1 - tpr)

        assert cost(chosen) == pytest.approx(min(cost(t) for t in scores))


def test_confidence_stop_collects_judged_tokens_only():
    policy = policies.ConfidenceStop(refit=False)
    policy.round_gamma()
    policy.round_probs = [0.9, 0.8, 0.3, 0.7]
    policy.observe(stats(10, 4, 1))
    assert policy.probs == [0.9, 0.8] and policy.matches == [1, 0]


def test_adaedl_bound_and_threshold_update():
    policy = policies.AdaEDL(lam0=0.5, gamma=4)
    step = type("Step", (), {"position": 1, "entropy": 1.0})()
    assert policy.stop_before(step) == (1 - math.sqrt(0.2) < 0.5)
    step.position = 0
    assert not policy.stop_before(step)  # the first token of a round is always drafted
    policy.observe(stats(4, 4, 1))        # acceptance 0.25 -> smoothed 0.575 < 0.9: lam rises
    assert policy.smoothed_acceptance == pytest.approx(0.5 * 0.9 + 0.5 * 0.25)
    assert policy.lam == pytest.approx(0.9 * 0.5 + 0.1 * 0.51)


# --- bad arguments ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"method": "fast"}, r"method 'fast'.*allowed: .*draft"),
    ({"method": "entropy-stop", "params": {"tua": 1}}, r"'tua'.*allowed: .*theta"),
    ({"method": "greedy", "params": {"tau": 1}}, r"'tau'.*'greedy'.*allowed: none"),
    ({"method": "greedy", "draft": None}, r"'greedy'.*draft"),
    ({"method": "oracle"}, r"'reference'"),
    ({"method": "learned-stop"}, r"'learned-stop'.*stop head"),
    ({"method": "greedy", "gamma": 0}, r"gamma.*>= 1"),
    ({"method": "greedy", "gamma": True}, r"gamma.*>= 1"),
    ({"method": ["greedy"]}, r"method \['greedy'\]"),
    ({"method": "ar", "params": {"tau": 1}}, r"'ar'.*no params"),
    ({"method": "entropy-stop", "params": "tau=1"}, r"params.*dict"),
    ({"method": policies.EntropyStop(), "params": {"tau": 1}}, r"params.*method name"),
    ({"method": policies.Oracle(reference=[1, 2]), "temperature": 1.0}, r"'oracle'.*greedy only"),
    ({"method": "oracle", "params": {"reference": 5}}, r"reference.*list"),
    ({"method": "sampling", "temperature": 1e-46}, r"temperature.*>= 1e-6"),
    ({"method": "sampling", "temperature": 1.0, "top_k": True}, r"top_k.*>= 0"),
    ({"method": "greedy", "eos_token_id": "eos"}, r"eos_token_id.*token id"),
])
def test_bad_arguments_give_one_clear_message(families, kwargs, message):
    target, drafts = families["tiny-llama"]  # the checks do not depend on the model: one family is enough
    arguments = {"draft": drafts["close"], **kwargs}
    with pytest.raises(ValueError, match=message):
        generate(target, random_prompt(3, 0), 5, **arguments)


def test_float_input_ids_and_a_larger_draft_vocabulary_give_one_clear_message():
    target = random_model("tiny-llama", seed=0)
    with pytest.raises(ValueError, match="input_ids must hold integer token ids"):
        generate(target, random_prompt(3, 0).float(), 5, method="ar")
    bigger = random_model("tiny-llama", seed=1, vocab=2 * target.config.vocab_size)
    with pytest.raises(ValueError, match="draft and target must share the output vocabulary"):
        for seed in range(20):  # until the draft proposes an id past the target's vocabulary
            generate(target, random_prompt(3, seed), 8, method="greedy", draft=bigger, gamma=4)


def test_eos_may_be_a_tensor_or_numpy_id(models):
    import numpy as np
    target, drafts = models
    prompt = random_prompt(3, 0)
    plain = generate(target, prompt, 12, method="ar").new_token_ids
    eos = plain[4]
    for given in (torch.tensor(eos), np.int64(eos), [eos], {eos}):
        result = generate(target, prompt, np.int64(12), method="greedy", draft=drafts["close"], eos_token_id=given)
        assert result.new_token_ids == plain[:plain.index(eos) + 1]


def test_policy_parameters_are_listed():
    assert policy_parameters("entropy-stop") == ["theta", "theta0"]
    assert policy_parameters("greedy") == []
