"""Token trees (notebook 06): structure, one-pass verification with a 4D mask, the KV gather, Medusa
heads, and both tree methods: greedy identity with `ar`, sampled exactness, planted bugs."""
import random

import pytest
import torch

from specdec_utils import generate
from specdec_utils.core import sampling, tree_drafting
from specdec_utils.core import tree as trees
from specdec_utils.core.engine import Sampler
from specdec_utils.core.kv_cache import gather_cache
from specdec_utils.core.medusa import MedusaHeads, capture_hidden, load_heads
from specdec_utils.core.runner import forward_tree
from specdec_utils.exactness import chi_square_p_value, exact_distribution, sample_outputs
from specdec_utils.models import tiny_model

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread is fastest (see conftest)


def random_parents(T: int, rng: random.Random, kind: str = "random") -> torch.Tensor:
    if kind == "chain":
        return torch.arange(T) - 1
    if kind == "star":
        return torch.full((T,), -1)
    return torch.tensor([rng.randrange(-1, i) for i in range(T)])


def naive_mask(parents: list[int]) -> torch.Tensor:
    T = len(parents)
    mask = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


@pytest.mark.parametrize("kind", ["random", "chain", "star"])
def test_tree_mask_matches_walking_up_the_parents(kind):
    rng = random.Random(0)
    for T in (1, 2, 7, 40, 130):
        parents = random_parents(T, rng, kind)
        assert torch.equal(trees.tree_mask(parents), naive_mask(parents.tolist()))
        assert trees.depths(parents).tolist() == naive_mask(parents.tolist()).sum(-1).tolist()


def test_bad_parents_are_refused():
    with pytest.raises(ValueError, match="earlier node"):
        trees.check_parents(torch.tensor([-1, 1]))
    with pytest.raises(ValueError, match="no parent"):
        trees.rank_tree_parents([(0, 0)])


def test_templates():
    paths, parents = trees.rank_tree_parents(trees.cartesian_paths([2, 2]))
    assert paths == [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]
    assert parents.tolist() == [-1, -1, 0, 0, 1, 1]
    acc = [[0.6, 0.2, 0.1], [0.4, 0.2, 0.1]]
    sparse = trees.sparse_paths(acc, 4)
    assert sparse == [(0,), (0, 0), (1,), (0, 1)]  # 0.6, 0.24, 0.2, 0.12
    assert abs(trees.expected_accept_length(sparse, acc) - (1 + 0.6 + 0.24 + 0.2 + 0.12)) < 1e-12


def test_pruning_takes_subtrees_along():
    parents = torch.tensor([-1, -1, 0, 0, 2])
    prob = torch.tensor([0.9, 0.05, 0.5, 0.9, 0.9])
    kept = trees.prune_keep(prob, parents, torch.zeros(5), "confidence", 0.1)
    assert kept.tolist() == [True, False, True, True, True]
    # path products: 0.9, 0.05, 0.45, 0.81, 0.405
    assert trees.prune_keep(prob, parents, torch.zeros(5), "path", 0.42).tolist() == [True, False, True, True, False]
    # entropy: an unsure head (entropy 0.9 of the maximum) is held to a tenth of the bar
    frac = torch.tensor([0.0, 0.9, 0.0, 0.0, 0.0])
    assert trees.prune_keep(prob, parents, frac, "entropy", 0.4).tolist() == [True, True, True, True, True]
    nodes, new_parents = trees.subtree(torch.arange(5), parents, torch.tensor([True, False, True, True, False]))
    assert nodes.tolist() == [0, 2, 3] and new_parents.tolist() == [-1, 0, 0]


def test_one_tree_pass_equals_running_each_path_alone(tiny):
    """Every node's logits from the tree pass (cache + 4D mask + tree positions) equal a plain
    causal forward over prompt + that node's path."""
    target, _, _ = tiny
    rng = random.Random(1)
    prompt = torch.randint(3, 64, (1, 9), generator=torch.Generator().manual_seed(0))
    for kind in ("random", "chain", "star"):
        parents = random_parents(12, rng, kind)
        nodes = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(2))
        _, cache = forward_tree(target, prompt[:, :6], nodes[:0], parents[:0], None, num_logits=1)
        logits, cache = forward_tree(target, prompt, nodes, parents, cache, num_logits=13)
        mask = naive_mask(parents.tolist())
        for i in range(12):
            path = nodes[mask[i]]
            ref = target(input_ids=torch.cat([prompt, path[None]], 1)).logits[0, -1]
            assert torch.allclose(logits[1 + i], ref, atol=1e-4), (kind, i)
        assert torch.allclose(logits[0], target(input_ids=prompt).logits[0, -1], atol=1e-4)


def test_gather_keeps_the_accepted_path(tiny):
    target, _, _ = tiny
    prompt = torch.randint(3, 64, (1, 7), generator=torch.Generator().manual_seed(3))
    parents = torch.tensor([-1, -1, 0, 1, 3])
    nodes = torch.tensor([5, 6, 7, 8, 9])
    _, cache = forward_tree(target, prompt, nodes, parents, None, num_logits=6)
    cache = gather_cache(cache, 7, torch.tensor([1, 3, 4]))
    assert cache.get_seq_length() == 10
    out = target(input_ids=torch.tensor([[11]]), past_key_values=cache, use_cache=True).logits[0, -1]
    ref = target(input_ids=torch.cat([prompt, torch.tensor([[6, 8, 9, 11]])], 1)).logits[0, -1]
    assert torch.allclose(out, ref, atol=1e-4)


def test_medusa_heads_start_as_the_targets_next_token_predictor(tiny):
    target, _, _ = tiny
    heads = MedusaHeads(target, 4)  # fresh: residual blocks at zero
    ids = torch.randint(3, 64, (1, 11), generator=torch.Generator().manual_seed(4))
    with capture_hidden(target) as hidden:
        logits = target(input_ids=ids).logits[0]
    out = heads(hidden[0][0])
    assert out.shape == (11, 4, 64)
    for k in range(4):
        assert torch.allclose(out[:, k], logits, atol=1e-5)
    broken = MedusaHeads(target, 4, use_norm=False)  # the missing-norm bug: no norm, so not the target at step 0
    assert not torch.allclose(broken(hidden[0][0])[:, 0], logits, atol=1e-2)


def test_heads_save_and_load(tiny, tmp_path):
    target, _, heads = tiny
    heads.rank_accuracy = [[0.5, 0.2], [0.3, 0.1], [0.2, 0.1]]
    heads.save(tmp_path / "h")
    loaded = load_heads(tmp_path / "h", target)
    h = torch.randn(5, 64)
    assert torch.allclose(loaded(h), heads(h), atol=1e-2)  # saved in bf16
    assert loaded.rank_accuracy == heads.rank_accuracy
    with pytest.raises(ValueError, match="hidden size"):
        load_heads(tmp_path / "h", tiny_model("tiny-llama", vocab_size=32))
    with pytest.raises(ValueError, match="no Medusa heads"):
        load_heads(tmp_path / "nothing", target)


TREE_SETTINGS = [
    ("medusa", {"tree": "cartesian", "topk": 3, "tree_nodes": 20}),
    ("medusa", {"tree": [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)], "topk": 2}),
    ("medusa", {"tree": "cartesian", "topk": 2, "prune": "path", "threshold": 0.01}),
    ("medusa", {"tree": "cartesian", "topk": 4, "prune": "entropy", "threshold": 0.2, "tree_nodes": 12}),
    ("draft-tree", {"width": 2, "tree_nodes": 10}),
    ("draft-tree", {"width": 3, "tree_nodes": 40, "prune": "confidence", "threshold": 0.05}),
    ("draft-tree", {"width": 1, "tree_nodes": 4}),
]


@pytest.mark.parametrize("method,params", TREE_SETTINGS)
def test_greedy_trees_equal_the_target_alone(tiny, method, params):
    target, draft, heads = tiny
    gen = torch.Generator().manual_seed(5)
    for trial in range(6):
        ids = torch.randint(3, 64, (1, 4 + trial), generator=gen)
        ref = generate(target, ids, 25, method="ar").new_token_ids
        for gamma in (1, 3, 6):
            out = generate(target, ids, 25, method=method, draft=draft, heads=heads, gamma=gamma, params=params)
            assert out.new_token_ids == ref, (method, params, gamma)
            assert len(out.rounds) == out.target_calls


def test_greedy_trees_stop_at_eos_and_budget(tiny):
    target, draft, heads = tiny
    ids = torch.randint(3, 64, (1, 6), generator=torch.Generator().manual_seed(6))
    ref = generate(target, ids, 40, method="ar").new_token_ids
    eos = ref[9]
    stop = generate(target, ids, 40, method="ar", eos_token_id=eos).new_token_ids
    for method in ("medusa", "draft-tree"):
        params = {"tree": "cartesian", "topk": 3} if method == "medusa" else None
        out = generate(target, ids, 40, method=method, draft=target, heads=heads, eos_token_id=eos, params=params)
        assert out.new_token_ids == stop
        for budget in (1, 2, 7):
            out = generate(target, ids, budget, method=method, draft=target, heads=heads, params=params)
            assert out.new_token_ids == ref[:budget]


def test_a_perfect_draft_tree_accepts_whole_paths(tiny):
    target, _, _ = tiny
    ids = torch.randint(3, 64, (1, 6), generator=torch.Generator().manual_seed(7))
    out = generate(target, ids, 30, method="draft-tree", draft=target, gamma=4, params={"width": 2})
    assert out.tokens_per_target_call > 4  # 30 tokens in ceil(30 / 5) + prefill-free rounds
    assert all(r.detail["tree_nodes"] <= 32 for r in out.rounds)


# ---------------------------------------------------------------------- sampled: exactness
@pytest.fixture(scope="module")
def small_vocab():
    """A 4-token vocabulary, moderately sharp: the enumerable case of the exactness test."""
    target = tiny_model("tiny-llama", vocab_size=4, seed=1).eval()
    draft = tiny_model("tiny-llama", vocab_size=4, seed=2).eval()
    with torch.no_grad():
        target.model.norm.weight.fill_(5)
        draft.model.norm.weight.fill_(5)
    heads = MedusaHeads(target, 3)
    with torch.no_grad():
        for block in heads.blocks:
            torch.nn.init.normal_(block.weight, std=0.5)
    prompt = torch.tensor([[1, 3, 0]])
    sampler = Sampler(1.0)
    return target, draft, heads, prompt, sampler, exact_distribution(target, prompt, 5, sampler)


SAMPLED = [
    ("medusa", {"tree": "cartesian", "topk": 2, "tree_nodes": 10}),
    ("medusa", {"tree": "cartesian", "topk": 3, "prune": "confidence", "threshold": 0.3}),
    ("draft-tree", {"width": 2, "tree_nodes": 8}),
    ("draft-tree", {"width": 2, "sample_children": True}),
]


# 3,000 outputs of 5 tokens (1,024 possible) detect TV >= 0.071; with top-p 0.95 (82 possible), TV >= 0.061
# (90% power at alpha 1e-3, worst direction; computed once with `exactness.min_detectable_tv`)
@pytest.mark.stat
@pytest.mark.parametrize("method,params", SAMPLED)
def test_sampled_trees_are_exact_over_whole_outputs(small_vocab, method, params):
    target, draft, heads, prompt, sampler, exact = small_vocab
    counts = sample_outputs(lambda g: generate(target, prompt, 5, method=method, draft=draft, heads=heads,
                                               temperature=1.0, generator=g, params=params).new_token_ids, 3000)
    assert chi_square_p_value(counts, exact) > 1e-3


@pytest.mark.stat
@pytest.mark.parametrize("method,params", [
    ("medusa", {"tree": "sparse", "tree_nodes": 7, "prune": "entropy", "threshold": 0.4}),
    ("draft-tree", {"width": 3, "tree_nodes": 9, "prune": "path", "threshold": 0.2}),
])
def test_sampled_sparse_and_pruned_trees_are_exact_with_top_p(small_vocab, method, params):
    """The benchmark's shapes: Medusa's sparse tree (from rank accuracies) and pruned draft trees,
    with top-p 0.95 (the benchmark's) warping the target."""
    target, draft, heads, prompt, _, _ = small_vocab
    heads.rank_accuracy = [[0.5, 0.3, 0.1, 0.05], [0.4, 0.3, 0.2, 0.1], [0.3, 0.2, 0.2, 0.1]]
    exact = exact_distribution(target, prompt, 5, Sampler(1.0, top_p=0.95))
    assert len(exact) > 50  # top-p leaves many outputs possible (a tighter nucleus makes this toy deterministic)
    counts = sample_outputs(lambda g: generate(target, prompt, 5, method=method, draft=draft, heads=heads,
                                               temperature=1.0, top_p=0.95, generator=g,
                                               params=params).new_token_ids, 3000)
    assert chi_square_p_value(counts, exact) > 1e-3


def _planted_counts(small_vocab, monkeypatch, plant):
    target, draft, heads, prompt, sampler, exact = small_vocab
    plant(monkeypatch)
    counts = sample_outputs(lambda g: generate(target, prompt, 5, method="draft-tree", draft=draft, temperature=1.0,
                                               generator=g, params={"width": 2}).new_token_ids, 3000)
    return chi_square_p_value(counts, exact)


@pytest.mark.stat
def test_planted_bug_no_residual_after_a_rejection_fails(small_vocab, monkeypatch):
    """Trying the next sibling against the full p (not p minus the rejected candidate)."""
    p = _planted_counts(small_vocab, monkeypatch,
                        lambda mp: mp.setattr(sampling, "residual", lambda p, q: p))
    assert p < 1e-6


@pytest.mark.stat
def test_planted_bug_top_k_children_verified_as_if_sampled_fails(small_vocab, monkeypatch):
    """Deterministic top-k children handed to the verifier with the draft's q as if they had been
    drawn from it: accepted with min(1, p/q) instead of p."""
    original = tree_drafting.DraftTreeProposer.propose

    def with_q(self, tokens, gamma, policy, sampler, generator, index):
        proposal = original(self, tokens, gamma, policy, sampler, generator, index)
        if len(proposal.tokens):
            proposal.probs = torch.full((len(proposal.tokens), 4), 0.25)
        return proposal
    p = _planted_counts(small_vocab, monkeypatch,
                        lambda mp: mp.setattr(tree_drafting.DraftTreeProposer, "propose", with_q))
    assert p < 1e-6


@pytest.mark.stat
def test_typical_acceptance_is_not_exact(small_vocab):
    target, draft, heads, prompt, sampler, exact = small_vocab
    counts = sample_outputs(lambda g: generate(target, prompt, 5, method="medusa", heads=heads, temperature=1.0,
                                               generator=g, params={"tree": "cartesian", "topk": 2,
                                                                    "acceptance": "typical"}).new_token_ids, 3000)
    assert chi_square_p_value(counts, exact) < 1e-6


# ---------------------------------------------------------------------- errors
def test_tree_methods_refuse_bad_input(tiny):
    target, draft, heads = tiny
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match=r"'medusa'.*heads"):
        generate(target, ids, 5, method="medusa")
    other = tiny_model("tiny-llama", vocab_size=64, seed=1).eval()
    with pytest.raises(ValueError, match="another target"):
        generate(other, ids, 5, method="medusa", heads=heads)
    with pytest.raises(ValueError, match=r"'draft-tree'.*draft"):
        generate(target, ids, 5, method="draft-tree")
    with pytest.raises(ValueError, match=r"prune.*one of.*path"):
        generate(target, ids, 5, method="draft-tree", draft=draft, params={"prune": "magic"})
    with pytest.raises(ValueError, match=r"tree_nodes.*>= 1"):
        generate(target, ids, 5, method="medusa", heads=heads, params={"tree_nodes": 0})
    with pytest.raises(ValueError, match="rank accuracies"):
        generate(target, ids, 5, method="medusa", heads=MedusaHeads(target, 2))
    with pytest.raises(ValueError, match="sample_children"):
        generate(target, ids, 5, method="draft-tree", draft=draft, params={"sample_children": True,
                                                                          "prune": "path"})
    with pytest.raises(ValueError, match=r"'width'.*allowed: .*tree_nodes"):
        generate(target, ids, 5, method="medusa", heads=heads, params={"width": 2})


@pytest.mark.slow
def test_shipped_heads_on_the_real_target():
    """The committed heads load onto the offline target, are trained, carry their rank accuracies, and
    both tree methods reproduce the target's greedy output on a real prompt (float32)."""
    from specdec_utils.models import load_model
    target, tokenizer = load_model("smollm2-135m", device="cpu", dtype=torch.float32)
    draft = load_model("draft-s", device="cpu", dtype=torch.float32)[0]
    heads = load_heads("medusa-heads", target)
    assert heads.num_heads == 4 and heads.trained_steps >= 1000
    assert len(heads.rank_accuracy) == 4 and all(len(row) == 10 for row in heads.rank_accuracy)
    assert heads.rank_accuracy[0][0] > heads.rank_accuracy[3][0] > 0
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    reference = generate(target, ids, 20, method="ar").new_token_ids
    for method, params in (("medusa", {"tree_nodes": 16}), ("draft-tree", {"width": 2, "tree_nodes": 12})):
        out = generate(target, ids, 20, method=method, heads=heads, draft=draft, params=params)
        assert out.new_token_ids == reference, method


def test_medusa_schedule_and_training_on_a_tiny_model(tiny):
    """The heads' recipe: warm-up to the peak, cosine to eta_min; its bug (a cosine 15 steps long,
    eta_min 0) leaves the rate at 0. A few steps of `train_heads` lower the distillation loss."""
    from specdec_lab.train_medusa import parse_args
    from specdec_utils.core.medusa import lr_at, train_heads
    assert lr_at(0, 1000, 3e-4, 500) == pytest.approx(3e-4 / 500)
    assert lr_at(499, 1000, 3e-4, 500) == pytest.approx(3e-4)
    assert lr_at(999, 1000, 3e-4, 500, 1e-5) == pytest.approx(1e-5, rel=1e-3)
    assert lr_at(600, 1000, 3e-4, 500, 0.0, cosine_steps=15) == 0.0
    target = tiny[0]
    heads = MedusaHeads(target, 2)
    ids = torch.randint(3, 64, (4, 12), generator=torch.Generator().manual_seed(8))
    with torch.no_grad(), capture_hidden(target) as hidden:
        logits = target(input_ids=ids).logits
    batch = (hidden[0], logits, torch.ones_like(ids))
    log = train_heads(heads, lambda: batch, 30, peak_lr=1e-2, warmup=3, log_every=29)
    assert log[-1]["loss"] < 0.8 * log[0]["loss"] and heads.trained_steps == 30
    with pytest.raises(SystemExit):
        parse_args(["--steps", "0"])



def naive_allowed(parents: list[int], committed: int, n_new: int, fed: int) -> torch.Tensor:
    """Query by query, key by key: a fed committed token sees the committed keys up to its own position; node i sees
    every committed key and the nodes met walking up from i."""
    T = len(parents)
    rows = [("token", committed - n_new + r) for r in range(n_new)] + [("node", i) for i in range(fed, T)]
    allow = torch.zeros(len(rows), committed + T, dtype=torch.bool)
    for r, (kind, at) in enumerate(rows):
        if kind == "token":
            allow[r, :at + 1] = True
            continue
        allow[r, :committed] = True
        while at >= 0:
            allow[r, committed + at] = True
            at = parents[at]
    return allow


@pytest.mark.parametrize("kind", ["random", "chain", "star"])
def test_tree_allowed_matches_the_mask_written_key_by_key(kind):
    """`tree_allowed` is the one mask of a tree pass (the runners' forward_tree, the device tree's rows, EAGLE's head
    steps, the Triton oracle's `mask_from_parents`): bool, or additive in a float dtype."""
    rng = random.Random(3)
    for T in (1, 2, 7, 40):
        parents = random_parents(T, rng, kind)
        ancestry = trees.tree_mask(parents)
        for committed, n_new, fed in ((5, 1, 0), (9, 4, 0), (3, 3, 0), (6, 0, 0), (6, 0, T // 2), (1, 0, T - 1),
                                      (0, 0, 0)):
            expected = naive_allowed(parents.tolist(), committed, n_new, fed)
            assert torch.equal(trees.tree_allowed(ancestry, committed, n_new, fed), expected)
            for dtype in (torch.float32, torch.bfloat16):
                additive = trees.tree_allowed(ancestry, committed, n_new, fed, dtype)
                assert additive.dtype == dtype and torch.equal(additive == 0, expected)
                assert torch.equal(additive != 0, additive == torch.finfo(dtype).min)
