"""EAGLE heads (notebook 07): the training forward equals the decode-time forward, greedy `eagle-chain` and
`eagle` equal `ar`, sampled ones are exact (with a planted bug that fails), saving, loading and errors."""
import json

import pytest
import torch
from safetensors.torch import load_file

from specdec_utils import generate
from specdec_utils.core import eagle
from specdec_utils.core.engine import Sampler
from specdec_utils.core.hidden import capture_hidden
from specdec_utils.exactness import chi_square_p_value, exact_distribution, sample_outputs
from specdec_utils.models import tiny_model
from specdec_utils.utils import REPO_ROOT

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread is fastest (see conftest)


def tiny_target(vocab: int, seed: int):
    """A tiny Llama with an untied random output head (a tied one mostly repeats its last token)."""
    target = tiny_model("tiny-llama", vocab_size=vocab, seed=seed).eval()
    generator = torch.Generator().manual_seed(seed)
    target.lm_head.weight = torch.nn.Parameter(torch.randn(vocab, 64, generator=generator) / 8)
    return target


def random_head(target, seed: int = 0, **options):
    head = eagle.eagle_head_for(target, seed=seed, **options)
    with torch.no_grad():  # an untrained head is a near-copy of its inputs: make every part matter
        for p in head.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
    return head.eval()


def test_capture_layers_equals_output_hidden_states():
    target = tiny_target(64, 1)
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), capture_hidden(target, (0, 1, 2)) as captured:
        out = target(input_ids=ids, output_hidden_states=True)
    with torch.no_grad(), capture_hidden(target, "norm") as prenorm:
        target(input_ids=ids)
    h = out.hidden_states  # [0] = embeddings = input of layer 0; [1] = input of layer 1; [2] = post-norm
    assert torch.allclose(captured[0], torch.cat([h[0], h[1], prenorm[0]], -1))
    with pytest.raises(ValueError, match="layer indices"):
        with capture_hidden(target, (3,)):
            pass


@pytest.mark.parametrize("layer", ["eagle1", "eagle3"])
def test_training_forward_equals_decode_time_forward(layer):
    """Step k of `ttt_forward` at position j is what the proposer computes when the tokens after j+1 were
    drafted and accepted: same inputs, positions and attention (committed entries + own ancestors)."""
    target = tiny_target(64, 1)
    head = random_head(target, 3, layer=layer, vocab_ids=torch.arange(10, 50) if layer == "eagle3" else None)
    ids = torch.randint(3, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), capture_hidden(target, head.target_hidden) as feats:
        target(input_ids=ids)
    with torch.no_grad():
        outs = head.ttt_forward(feats[0], ids, steps=3)
        for j in (0, 4, 7):
            proposer = eagle.EagleProposer(head)
            proposer.observe_target(feats[0][0, :j + 1])
            h, logits = proposer._catch_up(ids[:, :j + 2])
            assert torch.allclose(h, outs[0][0, j], rtol=1e-4, atol=1e-4)
            for k in (1, 2):
                allowed = torch.ones(1, proposer.cache.length + 1, dtype=torch.bool)
                hs, _ = proposer.step(h[None], ids[0, j + 1 + k:j + 2 + k], torch.tensor([j + k]), allowed, own=True)
                h = hs[0]
                assert torch.allclose(h, outs[k][0, j], rtol=1e-4, atol=1e-4), (j, k)


CASES = [("eagle-chain", 3, {}), ("eagle-chain", 1, {}), ("eagle", 4, {"width": 2, "tree_nodes": 6}),
         ("eagle", 3, {"width": 3, "tree_nodes": 30}), ("eagle", 2, {"width": 1, "tree_nodes": 1})]


@pytest.mark.parametrize("method,gamma,params", CASES)
@pytest.mark.parametrize("layer", ["eagle1", "eagle3"])
def test_greedy_eagle_equals_ar(method, gamma, params, layer):
    accepted = 0
    for seed in (0, 1):
        target = tiny_target(4, seed)
        head = random_head(target, seed, layer=layer)
        for prompt_seed in range(3):
            ids = torch.randint(0, 4, (1, 3 + prompt_seed), generator=torch.Generator().manual_seed(prompt_seed))
            ref = generate(target, ids, 25, method="ar").new_token_ids
            out = generate(target, ids, 25, method=method, eagle=head, gamma=gamma, params=params)
            assert out.new_token_ids == ref
            accepted += out.accepted
    assert accepted > 5  # a vocabulary of 4: guesses are often right, paths get walked


@pytest.mark.parametrize("method", ["eagle-chain", "eagle"])
def test_greedy_eagle_stops_at_an_eos_inside_a_round(method):
    target = tiny_target(4, 0)
    head = random_head(target, 0)
    ids = torch.tensor([[1, 2, 3, 0]])
    free_run = generate(target, ids, 30, method="ar").new_token_ids
    for eos in sorted(set(free_run[3:])):
        expected = free_run[:free_run.index(eos) + 1]
        for budget in (30, 2, 1):
            out = generate(target, ids, budget, method=method, eagle=head, gamma=4, eos_token_id=eos)
            assert out.new_token_ids == expected[:budget]


def test_a_reduced_vocabulary_head_stays_exact_in_greedy():
    target = tiny_target(64, 2)
    head = random_head(target, 1, vocab_ids=torch.arange(3, 40))
    ids = torch.tensor([[5, 9, 11, 4]])
    ref = generate(target, ids, 30, method="ar").new_token_ids
    for method in ("eagle-chain", "eagle"):
        assert generate(target, ids, 30, method=method, eagle=head).new_token_ids == ref


@pytest.fixture(scope="module")
def small_vocab():
    target = tiny_target(4, 1)
    head = random_head(target, 5)
    prompt = torch.tensor([[1, 3, 0]])
    return target, head, prompt, exact_distribution(target, prompt, 5, Sampler(1.0))


# 3,000 outputs of 5 tokens (1,024 possible) detect TV >= 0.071 (90% power at alpha 1e-3, worst direction;
# `exactness.min_detectable_tv`, as for the other tree methods)
@pytest.mark.stat
@pytest.mark.parametrize("method,params", [("eagle-chain", {}), ("eagle", {"width": 2, "tree_nodes": 8})])
def test_sampled_eagle_is_exact_over_whole_outputs(small_vocab, method, params):
    target, head, prompt, exact = small_vocab
    counts = sample_outputs(lambda g: generate(target, prompt, 5, method=method, eagle=head, gamma=3,
                                               temperature=1.0, generator=g, params=params).new_token_ids, 3000)
    assert chi_square_p_value(counts, exact) > 1e-3


@pytest.mark.stat
@pytest.mark.parametrize("method,params", [("eagle-chain", {}), ("eagle", {"width": 2, "tree_nodes": 6})])
def test_a_reduced_vocabulary_head_samples_exactly(small_vocab, method, params):
    """q is zero outside the draft vocabulary (tokens 0, 1, 3 here): the residual must supply token 2."""
    target, _, prompt, exact = small_vocab
    head = random_head(target, 7, vocab_ids=torch.tensor([0, 1, 3]))
    counts = sample_outputs(lambda g: generate(target, prompt, 5, method=method, eagle=head, gamma=3,
                                               temperature=1.0, generator=g, params=params).new_token_ids, 3000)
    assert chi_square_p_value(counts, exact) > 1e-3


@pytest.mark.stat
def test_planted_bug_chain_verified_against_the_wrong_q_fails(small_vocab, monkeypatch):
    """A chain drawn from the head's distribution q but verified as if drawn from the uniform one: accepted
    with min(1, 4p) instead of min(1, p/q). (Handing it over as one-hot would *not* be a bug: a token
    chosen without looking at the target's randomness and accepted with probability p stays exact, the
    rule that keeps top-k trees exact.)"""
    target, head, prompt, exact = small_vocab
    original = eagle.EagleProposer._chain

    def without_q(self, *args):
        proposal = original(self, *args)
        proposal.probs = torch.full_like(proposal.probs, 0.25)
        return proposal
    monkeypatch.setattr(eagle.EagleProposer, "_chain", without_q)
    counts = sample_outputs(lambda g: generate(target, prompt, 5, method="eagle-chain", eagle=head, gamma=3,
                                               temperature=1.0, generator=g).new_token_ids, 3000)
    assert chi_square_p_value(counts, exact) < 1e-6


def test_save_and_load_round_trip(tmp_path):
    target = tiny_target(64, 1)
    head = random_head(target, 2, vocab_ids=torch.arange(5, 45))
    head.save(tmp_path / "h")
    loaded = eagle.load_eagle(tmp_path / "h", target)
    assert loaded.layer == head.layer and loaded.features == head.features
    assert torch.equal(loaded.vocab_ids, head.vocab_ids)
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert torch.allclose(a.to(torch.bfloat16).float(), b.float()), name
    other = tiny_model("tiny-llama", vocab_size=32, seed=1)
    with pytest.raises(ValueError, match="trained for hidden size"):
        eagle.load_eagle(tmp_path / "h", other)
    with pytest.raises(ValueError, match="no EAGLE head"):
        eagle.load_eagle(tmp_path / "missing", target)


def test_eagle_methods_refuse_bad_input():
    target = tiny_target(64, 1)
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="eagle_head_for"):  # the shipped head fits the course's target only
        generate(target, ids, 5, method="eagle")
    with pytest.raises(ValueError, match="needs eagle="):
        generate(target, ids, 5, method="eagle-chain", eagle="eagle-head")
    other = tiny_target(64, 1)
    with pytest.raises(ValueError, match="another target"):
        generate(other, ids, 5, method="eagle", eagle=eagle.eagle_head_for(target))
    with pytest.raises(ValueError, match="layer must be"):
        eagle.eagle_head_for(target, layer="eagle2")
    with pytest.raises(ValueError, match="features must be"):
        eagle.eagle_head_for(target, features=(0, 9))
    with pytest.raises(ValueError, match="width"):
        generate(target, ids, 5, method="eagle", eagle=eagle.eagle_head_for(target), params={"width": 0})


def test_train_eagle_cli_trains_saves_and_goes_on_from_a_saved_head(tmp_path, capsys):
    from specdec_lab import train_eagle, write_corpus
    corpus = tmp_path / "corpus.pt"
    assert write_corpus.main(["--target", "tiny-llama", "--device", "cpu", "--tokens", "60", "--batch", "4",
                              "--new-tokens", "12", "--out", str(corpus), "--mix", "code=1"]) == 0
    common = ["--corpus", str(corpus), "--target", "tiny-llama", "--device", "cpu", "--batch-size", "2",
              "--max-len", "24", "--eval-prompts", "2", "--variants", "eagle3"]
    assert train_eagle.main([*common, "--steps", "2", "--out", str(tmp_path / "a")]) == 0
    assert train_eagle.main([*common, "--steps", "1", "--out", str(tmp_path / "b"), "--init", str(tmp_path / "a")]) == 0
    first = json.loads((tmp_path / "a" / "config.json").read_text())
    second = json.loads((tmp_path / "b" / "config.json").read_text())
    assert first["trained_steps"] == 2 and second["trained_steps"] == 3 and second["log"]["steps"] == 1
    assert second["log"]["continued_from"]["trained_steps"] == 2 and "curve" in second["log"]["continued_from"]
    a = load_file(str(tmp_path / "a" / "head.safetensors"))
    b = load_file(str(tmp_path / "b" / "head.safetensors"))
    assert torch.equal(a["vocab_ids"], b["vocab_ids"])
    assert any(not torch.equal(a[k], b[k]) for k in a if k != "vocab_ids")
    capsys.readouterr()
    for argv, message in (([*common, "--init", str(tmp_path)], "--init: one variant and a folder"),
                          ([*common[:-1], "eagle1,eagle3", "--init", str(tmp_path / "a")], "--init: one variant")):
        with pytest.raises(SystemExit):
            train_eagle.parse_args(argv)
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit, match="not trained with the 'eagle1' recipe"):
        train_eagle.main([*common[:-1], "eagle1", "--steps", "1", "--init", str(tmp_path / "a")])
    # the objectives' ablation: each variant once per objective, from the same seed, into one JSON
    ablation = tmp_path / "ablation.json"
    assert train_eagle.main([*common, "--steps", "1", "--objectives", "kl,lk", "--ablation", str(ablation)]) == 0
    runs = json.loads(ablation.read_text())["variants"]
    assert [r["variant"] for r in runs] == ["eagle3/kl", "eagle3/lk"]
    assert [r["recipe"]["objective"] for r in runs] == ["kl", "lk"]
    capsys.readouterr()
    for argv, message in (([*common, "--objectives", "kl,tv"], "unknown objective 'tv'; allowed: kl, lk, kl+lk"),
                          ([*common, "--objectives", "kl,lk", "--checkpoint", str(tmp_path / "c.pt")],
                           "--checkpoint: one variant and one objective")):
        with pytest.raises(SystemExit):
            train_eagle.parse_args(argv)
        assert message in capsys.readouterr().err


def _reference_tree(self, tokens, h_root, logits_root, gamma, policy):
    """EAGLE-2's tree written node by node (the package's first version): the device-grown tree must equal it."""
    import math as m_

    from specdec_utils.core.tree import prune_keep, subtree
    from specdec_utils.core.tree_drafting import _entropy_frac
    head, m, base, width = self.head, tokens.shape[1] - 1, self.cache.length, policy.width
    tok, par, score, prob, ent = [], [], [], [], []
    entry, fed_parent, states, frontier = {}, [], {-1: (h_root, logits_root)}, [-1]
    for depth in range(1, gamma + 1):
        level = []
        for parent in frontier:
            h, logits = states[parent]
            logp = torch.log_softmax(logits.float(), -1)
            frac = float(_entropy_frac(logp))
            top = logp.topk(min(width, logp.shape[-1]))
            ids = top.indices if head.vocab_ids is None else head.vocab_ids[top.indices]
            for value, token in zip(top.values.tolist(), ids.tolist()):
                level.append(len(tok))
                tok.append(token), par.append(parent), score.append((score[parent] if parent >= 0 else 0.0) + value)
                prob.append(m_.exp(value)), ent.append(frac)
        if depth == gamma:
            break
        frontier = sorted(sorted(level, key=lambda c: (-score[c], c))[:width])
        for c in frontier:
            entry[c] = len(fed_parent)
            fed_parent.append(entry.get(par[c], -1))
        allowed = torch.zeros(len(frontier), base + len(fed_parent), dtype=torch.bool)
        allowed[:, :base] = True
        for i, c in enumerate(frontier):
            r = entry[c]
            while r >= 0:
                allowed[i, base + r], r = True, fed_parent[r]
        hs, lg = self.step(torch.stack([states[par[c]][0] for c in frontier]), torch.tensor([tok[c] for c in frontier]),
                           torch.full((len(frontier),), m + depth - 1), allowed, own=True)
        for i, c in enumerate(frontier):
            states[c] = (hs[i], lg[i])
    keep = torch.ones(len(tok), dtype=torch.bool)
    if len(tok) > policy.tree_nodes:
        keep = torch.zeros(len(tok), dtype=torch.bool)
        keep[sorted(range(len(tok)), key=lambda c: (-score[c], c))[:policy.tree_nodes]] = True
    keep &= prune_keep(torch.tensor(prob), torch.tensor(par), torch.tensor(ent), policy.prune, policy.threshold)
    return subtree(torch.tensor(tok), torch.tensor(par), keep)


@pytest.mark.parametrize("vocab_ids, prune", [(None, "none"), (torch.arange(3, 40), "none"), (None, "entropy")])
def test_the_device_grown_tree_equals_the_node_by_node_one(monkeypatch, vocab_ids, prune):
    """The proposer grows each level with tensor operations (one host read per round); written node by node,
    EAGLE-2's expand-and-rerank gives the same nodes and parents, round after round."""
    target = tiny_target(64, 2)
    head = random_head(target, 1, vocab_ids=vocab_ids)
    seen = []
    original = eagle.EagleProposer._tree

    def both(self, tokens, h_root, logits_root, gamma, policy):
        length = self.cache.length
        expected = _reference_tree(self, tokens, h_root, logits_root, gamma, policy)
        self.cache.length = length  # the reference fed its own entries: drop them
        proposal = original(self, tokens, h_root, logits_root, gamma, policy)
        seen.append(proposal.tokens.tolist() == expected[0].tolist()
                    and proposal.parents.tolist() == expected[1].tolist())
        return proposal
    monkeypatch.setattr(eagle.EagleProposer, "_tree", both)
    generate(target, torch.tensor([[5, 9, 11, 4]]), 40, method="eagle", eagle=head, gamma=5,
             params={"tree_nodes": 12, "width": 3, "prune": prune, "threshold": 0.05})
    assert len(seen) > 5 and all(seen)


class _CharTokenizer:
    """Enough of a tokenizer for eagle_tau.measure: characters as ids, no EOS."""
    eos_token_id = None

    def __call__(self, text, return_tensors="pt"):
        return type("Encoded", (), {"input_ids": torch.tensor([[3 + ord(c) % 40 for c in text]])})()


def test_eagle_tau_measures_every_head_and_shape_and_checks_them_against_ar(monkeypatch):
    from specdec_lab import eagle_tau
    monkeypatch.setattr(eagle_tau, "format_prompt", lambda tokenizer, row: row["prompt"])
    target = tiny_target(48, seed=2)
    heads = {"a": random_head(target, seed=1), "b": random_head(target, seed=2)}
    shapes = [eagle_tau.parse_shape(s) for s in ("chain3", "tree3x2x4")]
    rows = [{"id": f"p{i}", "category": "facts", "prompt": text} for i, text in enumerate(["hello there", "a b c d"])]
    out = eagle_tau.measure(target, _CharTokenizer(), heads, shapes, rows, 10, log=lambda *a, **k: None)
    assert set(out["runs"]) == {"a/chain3", "a/tree3x2x4", "b/chain3", "b/tree3x2x4"}
    for run in out["runs"].values():
        assert run["new"] == [10, 10] and run["same_as_ar"] == [True, True]
        assert all(2 <= p <= 11 for p in run["passes"])  # the prefill, then at least one token per pass


def test_eagle_tau_parses_shapes_and_heads_and_refuses_bad_ones():
    from specdec_lab import eagle_tau
    assert eagle_tau.parse_shape("chain6") == {"name": "chain6", "method": "eagle-chain", "gamma": 6, "params": {}}
    assert eagle_tau.parse_shape("tree7x10x60")["params"] == {"width": 10, "tree_nodes": 60}
    assert eagle_tau.parse_shape("tree7x10x60")["gamma"] == 7
    for bad in ("chain0", "tree3x2", "tree3x0x4", "star6"):
        with pytest.raises(ValueError, match="allowed chainG or treeDxWxN"):
            eagle_tau.parse_shape(bad)
    assert eagle_tau.parse_heads("x=eagle-head, y=/tmp/h") == {"x": "eagle-head", "y": "/tmp/h"}
    with pytest.raises(ValueError, match="LABEL=NAME_OR_PATH"):
        eagle_tau.parse_heads("eagle-head")
    assert eagle_tau.main(["--shapes", "tree3", "--out", "/dev/null"]) == 2


def test_eagle_tau_summary_pools_tokens_over_passes():
    from specdec_utils import measure
    result = {"prompts": ["p0", "p1"], "runs": {"a/chain2": {"head": "a", "shape": "chain2", "new": [8, 4],
                                                             "passes": [2, 4], "same_as_ar": [True, False]}}}
    (row,) = measure.decoded_taus(result)
    assert row["tau"].value == pytest.approx(12 / 6) and (row["same_as_ar"], row["prompts"]) == (1, 2)
    assert row["tau_round"].value == pytest.approx(10 / 4)  # the prefill's pass and its token left out
    assert row["tau"].low >= 1.0 and row["tau"].high <= 4.0  # the two prompts' own tau bound every resample


def test_eagle_tau_describes_shapes():
    from specdec_lab import eagle_tau
    from specdec_utils import measure
    assert measure.describe_shape(eagle_tau.parse_shape("chain6")) == "`eagle-chain`, gamma 6"
    assert measure.describe_shape(eagle_tau.parse_shape("tree7x10x60")) == "`eagle`, tree 7x10x60"


def test_eagle_tau_difference_is_paired_over_prompts():
    from specdec_lab import eagle_tau
    # b is a exactly 0.5 tokens per round worse on every prompt, prompts of very different difficulty
    result = {"prompts": ["p0", "p1", "p2"], "runs": {
        "a/x": {"new": [21, 41, 11], "passes": [11, 11, 11]}, "b/x": {"new": [16, 36, 6], "passes": [11, 11, 11]}}}
    gap = eagle_tau.difference(result, "a/x", "b/x")
    assert gap.value == pytest.approx(0.5) and gap.low == pytest.approx(0.5) and gap.high == pytest.approx(0.5)


def test_eagle_tau_best_per_head_keeps_chains_within_the_cap():
    from specdec_lab import eagle_tau
    shapes = [eagle_tau.parse_shape(s) for s in ("chain6", "chain8", "tree2x2x3")]
    runs = {"h/chain6": [20, 10], "h/chain8": [40, 10], "h/tree2x2x3": [37, 10]}  # new tokens, passes (one prompt)
    result = {"prompts": ["p0"], "heads": {"h": {}}, "shapes": shapes,
              "runs": {k: {"head": "h", "shape": k.split("/")[1], "new": [n], "passes": [p], "same_as_ar": [True]}
                       for k, (n, p) in runs.items()}}
    best = {b["method"]: b for b in eagle_tau.best_per_head(result)}
    assert best["eagle-chain"]["shape"] == "chain6" and best["eagle-chain"]["tau_round"].value == pytest.approx(19 / 9)
    assert best["eagle"]["shape"] == "tree2x2x3" and best["eagle"]["tau_round"].value == pytest.approx(4.0)


def test_by_position_pools_the_simulated_rounds_position_counts():
    """The trainers' per-position counts (`theory.position_counts` of `theory.simulate_rounds`, the engine's rounds):
    position k + 1 is reached by the rounds that drafted it after k accepted drafts; the counts add up to the rounds'
    tokens, a hand-made matrix gives its known counts, and `by_position` pools them over prompts."""
    from specdec_lab.train_eagle import by_position
    from specdec_utils.theory import position_counts, simulate_rounds
    T, F = True, False
    matches = torch.tensor([[T, T, F], [F, F, F], [F, F, F], [T, F, F], [F, F, F], [T, F, F], [F, F, F]])
    # 7 tokens, the first from the prefill: m=0 drafts 3, accepts 2 (next m=3); m=3 has room for 2 drafts (7 - 4 - 1),
    # accepts 1 (m=5); m=5 has room for none (its one draft plus the target's token would pass the 7th token)
    rounds = simulate_rounds(matches, 3)
    assert [tuple(r) for r in rounds] == [(3, 2, 3), (2, 1, 2), (0, 0, 1)]
    reached, accepted = position_counts(rounds, 3)
    assert (reached, accepted) == ([2, 2, 1], [2, 1, 0])
    assert sum(accepted) == sum(r.new_tokens for r in rounds) - len(rounds) == 7 - 1 - 3
    generator = torch.Generator().manual_seed(0)
    pairs = []
    for _ in range(20):
        inside = torch.arange(30)[:, None] + 1 + torch.arange(5) < 30
        m = (torch.rand(30, 5, generator=generator) < 0.6) & inside
        rounds = simulate_rounds(m, 5)
        reached, accepted = position_counts(rounds, 5)
        assert sum(accepted) == sum(r.new_tokens for r in rounds) - len(rounds)
        assert reached[0] == sum(r.drafted > 0 for r in rounds) and sum(r.new_tokens for r in rounds) == 30 - 1
        pairs.append((reached, accepted))
    pooled = by_position(pairs)
    assert pooled["reached"][0] >= pooled["reached"][-1] and all(0.4 < r < 0.8 for r in pooled["rate"][:3])
    json.dumps(pooled)  # plain ints: the trainers write these counts to JSON


def test_head_facts_name_a_head_without_private_paths(tmp_path):
    """What a committed run records about its head: a name under data/models as given, a folder inside the
    repository by its path there, any other folder by its own name (never a path of the machine it ran on)."""
    import shutil
    from types import SimpleNamespace

    head = SimpleNamespace(trained_steps=7)
    shipped = eagle.MODELS_DIR / eagle.EAGLE_NAME
    by_name = eagle.head_facts(head, eagle.EAGLE_NAME)
    assert by_name["from"] == eagle.EAGLE_NAME and by_name["trained_steps"] == 7
    assert len(by_name["weights_sha256"]) == 16
    inside = eagle.head_facts(head, str(shipped))
    assert inside == dict(by_name, **{"from": str(shipped.relative_to(REPO_ROOT))})
    shutil.copytree(shipped, tmp_path / "my-head")
    outside = eagle.head_facts(head, str(tmp_path / "my-head"))
    assert outside == dict(by_name, **{"from": "my-head"})  # same weights, same hash
