"""Tree attention in Triton (notebook 08): both kernels against the SDPA oracle on random trees and
prefixes (GQA, T = 1, P = 0, trees deeper than 64, the split-prefix reduction), bad input, the
transformers backend inside the engine. Without a GPU the kernels run in Triton's CPU interpreter."""
import random
import subprocess
import sys

import pytest
import torch

from specdec_utils import generate
from specdec_utils.core import tree_attention as ta
from specdec_utils.core.runner import forward_tree

pytestmark = pytest.mark.skipif(not ta.AVAILABLE, reason=ta.WHY or "triton unavailable")

# max |kernel - oracle| allowed: the oracle runs in fp32; bf16 keeps 8 mantissa bits (one rounding
# of outputs of size ~1 is 2^-8 = 0.004; the probabilities are rounded once more before P @ V)
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def make_parents(kind: str, T: int, rng: random.Random) -> torch.Tensor:
    if kind == "chain":
        return torch.arange(T) - 1
    if kind == "star":
        return torch.full((T,), -1)
    if kind == "deep":  # mostly a chain, with a few branches
        return torch.tensor([-1] + [i - 1 if rng.random() < 0.85 else rng.randrange(-1, i) for i in range(1, T)])
    if kind == "wide":  # shallow: parents among the first few nodes
        return torch.tensor([-1] + [rng.randrange(-1, min(i, 3)) for i in range(1, T)])
    return torch.tensor([-1] + [rng.randrange(-1, i) for i in range(1, T)])


def check(T, P, kind, H, H_kv, dtype, seed, splits=None, D=64):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    parents = make_parents(kind, T, rng)
    q = torch.randn(1, H, T, D, generator=gen).to(DEV, dtype)
    k = torch.randn(1, H_kv, P + T, D, generator=gen).to(DEV, dtype)
    v = torch.randn(1, H_kv, P + T, D, generator=gen).to(DEV, dtype)
    mask = ta.mask_from_parents(parents, P)
    ref = ta.reference(q, k, v, mask).float()
    for out in (ta._launch(q, k, v, None, parents.to(DEV, torch.int32), None, False, splits=splits),
                ta._launch(q, k, v, mask.to(DEV), None, None, True, splits=splits)):
        assert out.shape == q.shape and out.dtype == dtype
        err = (out.float() - ref).abs().max().item()
        assert err <= TOL[dtype], (T, P, kind, H, H_kv, dtype, splits, err)


CASES = [  # (T, P, kind, H, H_kv)
    (1, 0, "chain", 9, 3), (1, 40, "star", 9, 3), (5, 0, "random", 4, 4), (16, 7, "star", 9, 3),
    (23, 65, "wide", 8, 1), (40, 130, "random", 9, 3), (70, 20, "chain", 9, 3),   # 70 deep: past a 64-bit mask
    (100, 3, "deep", 4, 2), (130, 0, "random", 2, 2)]


@pytest.mark.parametrize("T, P, kind, H, H_kv", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_both_kernels_equal_the_oracle(T, P, kind, H, H_kv, dtype):
    check(T, P, kind, H, H_kv, dtype, seed=T * 1000 + P)


@pytest.mark.parametrize("splits", [1, 2, 5])
def test_the_split_prefix_reduction(splits):
    """Flash-decoding: the prefix cut across programs, partial softmaxes merged (and more splits asked
    for than the prefix has tiles: the wrapper uses one per tile)."""
    check(20, 300, "random", 9, 3, torch.float32, seed=splits, splits=splits)
    check(3, 64, "chain", 2, 1, torch.float32, seed=7, splits=splits)  # more splits than tiles: empty ones


@pytest.mark.parametrize("kind", ["deep", "random"])
def test_without_tl_gather_the_walk_loads_each_parent(kind, monkeypatch):
    """A Triton without `tl.gather` (older releases; it decides 08's path on a Colab T4) takes the fallback walk,
    a load per ancestor step: the same answer. The default follows `HAS_GATHER`."""
    monkeypatch.setattr(ta, "HAS_GATHER", False)
    calls = []
    real = ta._tree_attention_kernel
    monkeypatch.setattr(ta, "_tree_attention_kernel", type("Spy", (), {
        "__getitem__": lambda self, grid: lambda *a, **kw: (calls.append(kw["GATHER"]), real[grid](*a, **kw))[1]})())
    check(40, 9, kind, 4, 2, torch.float32, seed=3)
    assert calls and not any(calls)  # the mask-free launch ran without gather (the masked one never walks)


def test_the_largest_tree_and_a_256_deep_chain():
    check(256, 5, "chain", 2, 1, torch.float32, seed=1, D=16)
    check(256, 0, "random", 2, 1, torch.float32, seed=2, D=16)


def test_the_check_catches_a_missing_ancestor():
    """A planted bug: a mask that forgets each node's grandparent. The comparison must fail."""
    rng = random.Random(0)
    parents = make_parents("chain", 12, rng)
    q, k = torch.randn(1, 2, 12, 16), torch.randn(1, 2, 20, 16)
    v = torch.randn_like(k)
    good = ta.mask_from_parents(parents, 8)
    bad = good.clone()
    for i in range(2, 12):
        bad[i, 8 + i - 2] = False
    ref = ta.reference(q, k, v, good)
    assert (ta.tree_attention_masked(q, k, v, good) - ref).abs().max() < TOL[torch.float32]
    assert (ta.tree_attention_masked(q, k, v, bad) - ref).abs().max() > 0.01


@pytest.mark.parametrize("T, P, kind, splits", [(1, 0, "chain", 1), (1, 37, "chain", 2), (6, 90, "chain", 2),
                                                 (11, 150, "random", 3), (11, 150, "random", 1), (30, 5, "wide", 4),
                                                 (6, 5, "chain", 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_block_attention_reads_the_prefix_from_the_device(T, P, kind, splits, dtype):
    """`block_attention` (the device loop's attention): the rows at slots P .. P+T-1 of a longer buffer, P read from a
    device tensor, the block mask [T, T]: equal to SDPA with the whole mask, whatever the slices (empty ones too)."""
    capacity = 300 if P < 10 else P + T + 19  # stale slots past the rows, never read (300: slices past the prefix)
    rng, gen = random.Random(T + P), torch.Generator().manual_seed(T * 31 + P)
    block = ta.mask_from_parents(make_parents(kind, T, rng), 0)
    q = torch.randn(1, 9, T, 64, generator=gen).to(DEV, dtype)
    k = torch.randn(1, 3, capacity, 64, generator=gen).to(DEV, dtype)
    v = torch.randn(1, 3, capacity, 64, generator=gen).to(DEV, dtype)
    full = torch.zeros(T, capacity, dtype=torch.bool)
    full[:, :P] = True
    full[:, P:P + T] = block
    ref = ta.reference(q, k[:, :, :P + T], v[:, :, :P + T], full[:, :P + T]).float()
    out = ta.block_attention(q, k, v, torch.tensor([P], device=DEV), block.to(DEV), splits)
    assert out.shape == q.shape and out.dtype == dtype
    assert (out.float() - ref).abs().max().item() <= TOL[dtype], (T, P, kind, splits, dtype)


def test_bad_input_gets_one_clear_error():
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match="earlier node"):
        ta.tree_attention(q, k, k, torch.tensor([-1, 1, 0]))
    with pytest.raises(ValueError, match=r"parents.*integer"):
        ta.tree_attention(q, k, k, torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"mask.*bool"):
        ta.tree_attention_masked(q, k, k, torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="multiple of the KV heads"):
        ta.tree_attention(torch.randn(1, 3, 3, 16), k, k, torch.tensor([-1, 0, 0]))
    with pytest.raises(ValueError, match="one dtype"):
        ta.tree_attention(q.half(), k, k, torch.tensor([-1, 0, 0]))
    with pytest.raises(ValueError, match=r"at most 256"):
        ta.tree_attention(torch.randn(1, 1, 257, 16), torch.randn(1, 1, 257, 16), torch.randn(1, 1, 257, 16),
                          torch.arange(257) - 1)
    with pytest.raises(ValueError, match=r"mask\[:, :P\].*True"):
        mask = ta.mask_from_parents(torch.tensor([-1, 0, 0]), 2)
        mask[1, 0] = False
        ta.tree_attention_masked(q, k, k, mask)
    with pytest.raises(ValueError, match=r"block_mask must be bool \[T, T\]"):
        ta.block_attention(q, k, k, torch.tensor([1]), torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="start must be one integer"):
        ta.block_attention(q, k, k, torch.tensor([1.0]), torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"backend 'flash'.*allowed: .*sdpa"):
        ta.use_backend(torch.nn.Linear(1, 1), "flash")


def test_without_triton_the_module_imports_and_says_why():
    code = ("import sys; sys.modules['triton'] = None\n"
            "from specdec_utils.core import tree_attention as ta\n"
            "import torch\n"
            "assert not ta.AVAILABLE and 'triton is not available' in ta.WHY, ta.WHY\n"
            "try:\n    ta.tree_attention(torch.zeros(1, 1, 1, 8), torch.zeros(1, 1, 1, 8), torch.zeros(1, 1, 1, 8),"
            " torch.tensor([-1]))\n"
            "except RuntimeError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: triton is not available" in out.stdout


@pytest.mark.parametrize("backend", ["tree_triton", "tree_triton_masked"])
def test_the_backend_runs_tree_verification_on_the_kernel(tiny, backend, monkeypatch):
    """A tree pass through the model on the kernel gives SDPA's logits; the kernel really ran (once
    per layer and pass), and the tree methods give SDPA's tokens."""
    target, draft, heads = tiny
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 64, (1, 9), generator=gen)
    parents = torch.tensor([-1, 0, 0, 1, -1, 4, 5, 6])
    nodes = torch.randint(0, 64, (8,), generator=gen)
    calls = []
    launch = ta._launch
    monkeypatch.setattr(ta, "_launch", lambda *a, **kw: calls.append(a[0].shape) or launch(*a, **kw))
    logits = {}
    for name in ("sdpa", backend):
        ta.use_backend(target, name)
        _, cache = forward_tree(target, prompt[:, :5], nodes[:0], parents[:0], None, num_logits=1)
        logits[name], _ = forward_tree(target, prompt, nodes, parents, cache, num_logits=9)
    layers = target.config.num_hidden_layers  # per layer: the 5-token prefix pass (a chain), then the tree pass
    assert [shape[2] for shape in calls] == [5] * layers + [4 + 8] * layers  # 4 uncached committed + 8 nodes
    assert (logits["sdpa"] - logits[backend]).abs().max() < 1e-4
    for method, params in (("medusa", {"tree": "cartesian", "topk": 3}), ("draft-tree", {"width": 2})):
        ids = torch.randint(3, 64, (1, 6), generator=gen)
        ta.use_backend(target, "sdpa")
        ref = generate(target, ids, 16, method=method, draft=draft, heads=heads, gamma=3, params=params)
        ta.use_backend(target, backend)
        out = generate(target, ids, 16, method=method, draft=draft, heads=heads, gamma=3, params=params)
        assert out.new_token_ids == ref.new_token_ids and out.target_calls == ref.target_calls
    ta.use_backend(target, "sdpa")


def test_the_pytorch_transcription_of_the_kernel_equals_the_oracle():
    """`tiled_reference` is what notebook 08 reads: online softmax over tiles, the parents walk."""
    rng = random.Random(4)
    for T, P, kind, block_n in ((1, 0, "chain", 4), (9, 13, "random", 4), (70, 33, "deep", 16), (30, 128, "star", 64)):
        parents = make_parents(kind, T, rng)
        q, k = torch.randn(1, 4, T, 8, dtype=torch.float64), torch.randn(1, 2, P + T, 8, dtype=torch.float64)
        v = torch.randn_like(k)
        ref = ta.reference(q, k, v, ta.mask_from_parents(parents, P))
        assert (ta.tiled_reference(q, k, v, parents, block_n) - ref).abs().max() < 1e-5  # the oracle runs in fp32


def test_unchecked_parents_with_a_cycle_end_the_walk_instead_of_hanging():
    """On the GPU parents are not validated (it would synchronise): a pointer that does not point
    backwards must end that node's walk (a wrong answer, never an endless loop)."""
    q, k = torch.randn(1, 2, 4, 16), torch.randn(1, 2, 9, 16)
    for bad in ([-1, 2, 1, 0], [0, 1, 2, 3], [-1, 7, 0, 1]):
        out = ta._launch(q, k, k, None, torch.tensor(bad, dtype=torch.int32), None, False)
        assert out.shape == q.shape and torch.isfinite(out).all()


def test_the_backend_leaves_other_key_layouts_to_sdpa():
    """Keys laid out otherwise than cache + queries (a preallocated cache), a batch, or no parents:
    SDPA's answer, not the kernel's."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    attention = ta._backend(use_mask=False)
    module = torch.nn.Module()
    module.is_causal, module.num_key_value_groups = True, 2
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 10, 16)
    parents = torch.tensor([-1, 0, 1], dtype=torch.int32)
    ref = sdpa_attention_forward(module, q, k, k, None)[0]
    for kwargs in ({"tree_parents": parents, "tree_key_length": 8}, {}):
        assert torch.equal(attention(module, q, k, k, None, **kwargs)[0], ref)
    on_kernel = attention(module, q, k, k, None, tree_parents=parents, tree_key_length=10)[0]
    oracle = ta.reference(q, k, k, ta.mask_from_parents(parents.long(), 7)).transpose(1, 2)
    assert (on_kernel - oracle).abs().max() < 1e-5 and (on_kernel - ref).abs().max() > 1e-3
