"""The preallocated KV cache (static_cache.py) and the graphed step's arithmetic (cuda_graphs.py), on the CPU.

The cache must give the model exactly what a DynamicCache gives it (same logits, bit for bit), roll
back in O(1) (no copy, no reallocation), survive reuse and growth, and every method of the engine
must produce the same tokens on it. The graphed forward (`static_forward`: write at slots, attend
over the whole buffer under a mask) runs here without the recording, so its arithmetic is tested
without a GPU; the recording itself is checked on the GPU (`engine_bench`, part 1)."""
import subprocess
import sys

import pytest
import torch
from transformers import DynamicCache

from specdec_utils import generate
from specdec_utils.core import static_cache
from specdec_utils.core.cuda_graphs import GraphRunner, enable_cuda_graphs
from specdec_utils.core.engine import forward_uncached
from specdec_utils.core.kv_cache import cache_length, trim_cache
from specdec_utils.core.static_cache import PreallocatedLayer, StaticKVCache
from conftest import noisy_copy, random_model, random_prompt

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def pair():
    target = random_model("tiny-llama", seed=0)
    return target, noisy_copy(target, noise=0.02, seed=1)


@pytest.fixture
def dynamic():
    static_cache.ENABLED = False
    yield
    static_cache.ENABLED = True


def test_same_logits_as_dynamic_cache_through_writes_and_rollbacks(pair):
    target, _ = pair
    ids = random_prompt(40, seed=3)
    static, dynamic = StaticKVCache.for_model(target, 8), DynamicCache()  # capacity 128: no growth here
    plan = [(10, 10), (14, 12), (19, 19), (23, 15), (24, 24), (30, 21), (40, 40)]  # (fed up to, roll back to)
    with torch.inference_mode():
        for end, keep in plan:
            a, static = forward_uncached(target, ids[:, :end], static, end - cache_length(static))
            b, dynamic = forward_uncached(target, ids[:, :end], dynamic, end - cache_length(dynamic))
            assert torch.equal(a, b)
            trim_cache(static, keep)
            trim_cache(dynamic, keep)
            assert cache_length(static) == cache_length(dynamic) == keep


def test_rollback_moves_a_pointer_and_copies_nothing(pair):
    target, _ = pair
    cache = StaticKVCache.for_model(target, 64)
    with torch.inference_mode():
        forward_uncached(target, random_prompt(50, seed=4), cache)
    pointers = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers]
    before = cache.layers[0].keys.clone()
    cache.rollback(20)
    assert cache.length == 20 == cache.get_seq_length()
    assert pointers == [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers]
    assert torch.equal(cache.layers[0].keys, before)  # stale entries stay until overwritten
    with torch.inference_mode():
        forward_uncached(target, random_prompt(25, seed=5), cache)  # writes positions 20..24
    assert cache.length == 25 and pointers[0][0] == cache.layers[0].keys.data_ptr()
    assert torch.equal(cache.layers[0].keys[:, :, :20], before[:, :, :20])
    assert not torch.equal(cache.layers[0].keys[:, :, 20:25], before[:, :, 20:25])


def test_growth_keeps_the_contents(pair):
    target, _ = pair
    ids = random_prompt(300, seed=6)
    cache = StaticKVCache.for_model(target, 1)
    assert cache.capacity == static_cache.CHUNK
    with torch.inference_mode():
        a, cache = forward_uncached(target, ids[:, :100], cache, 1)
        a2, cache = forward_uncached(target, ids, cache, 1)  # past the capacity: grows
        b, dynamic = forward_uncached(target, ids[:, :100], DynamicCache(), 1)
        b2, dynamic = forward_uncached(target, ids, dynamic, 1)
    assert cache.capacity >= 300 and cache.capacity % static_cache.CHUNK == 0
    assert torch.equal(a, b) and torch.equal(a2, b2)


def test_crop_and_bad_rollbacks():
    cache = StaticKVCache(2, 16)
    for layer in cache.layers:
        layer.length = 10
    cache.crop(-3)  # transformers >= 5.2x: remove 3
    assert cache.length == 7
    cache.crop(5)  # the legacy meaning (5.17 warns): keep 5
    assert cache.length == 5
    for bad in (-1, 6):
        with pytest.raises(ValueError, match=r"cannot roll a cache of 5 positions back to .*allowed: 0 <= length <= 5"):
            cache.rollback(bad)
    with pytest.raises(ValueError, match="num_layers >= 1 and capacity >= 1"):
        StaticKVCache(0, 16)


CARTESIAN = {"params": {"tree": "cartesian", "topk": 3}}
METHODS = [("ar", {}), ("greedy", {}), ("sampling", {"temperature": 1.0, "top_p": 0.9}), ("adaptive-hf", {}),
           ("entropy-stop", {}), ("hierarchical", {}), ("draft-tree", {}), ("medusa", CARTESIAN),
           ("draft-tree", {"temperature": 0.8}), ("medusa", {**CARTESIAN, "temperature": 1.0})]


@pytest.mark.parametrize("method,kwargs", METHODS, ids=[f"{m}-{'sampled' if 'temperature' in k else 'greedy'}" for m, k in METHODS])
def test_every_method_gives_the_same_tokens_on_the_static_cache(tiny, method, kwargs):
    target, draft, heads = tiny
    ids = random_prompt(9, seed=7, vocab=64)

    def run():
        return generate(target, ids, 24, method=method, draft=draft, draft_small=draft, heads=heads, gamma=3,
                        generator=torch.Generator().manual_seed(11), **kwargs).new_token_ids

    static = run()
    static_cache.ENABLED = False
    try:
        dynamic = run()
    finally:
        static_cache.ENABLED = True
    assert static == dynamic


def test_a_rollback_that_forgets_is_caught(pair, monkeypatch):
    """Planted bugs: rollback does not move the pointer, or keeps one rejected position. Either the
    next forward fails or the output departs from the target's own greedy output."""
    target, draft = pair
    ids = random_prompt(12, seed=8)
    reference = generate(target, ids, 30, method="ar").new_token_ids
    assert generate(target, ids, 30, method="greedy", draft=draft, gamma=4).new_token_ids == reference
    original = StaticKVCache.rollback
    for bug in (lambda self, length: None, lambda self, length: original(self, min(length + 1, self.length))):
        monkeypatch.setattr(StaticKVCache, "rollback", bug)
        try:
            out = generate(target, ids, 30, method="greedy", draft=draft, gamma=4).new_token_ids
        except RuntimeError:
            out = None
        assert out != reference


@pytest.mark.parametrize("method,kwargs", [("ar", {}), ("greedy", {}), ("sampling", {"temperature": 1.0})])
def test_the_graphed_step_gives_the_eager_tokens_and_reuses_its_caches(pair, method, kwargs):
    target, draft = pair
    prompts = [random_prompt(n, seed=n) for n in (7, 15, 11)]

    def run():
        return [generate(target, p, 30, method=method, draft=draft, gamma=4,
                         generator=torch.Generator().manual_seed(5), **kwargs).new_token_ids for p in prompts]

    eager = run()
    runners = [GraphRunner(m, capture=False) for m in (target, draft)]
    for model, runner in zip((target, draft), runners):
        model._specdec_graphs = runner
    try:
        first = run()
        shapes = [len(r.graphs) for r in runners]
        again = run()
    finally:
        for model in (target, draft):
            del model._specdec_graphs
    assert first == eager and again == eager
    assert [len(r.caches) for r in runners] == [1, 1 if method != "ar" else 0]  # one pooled cache each, reused
    assert [len(r.graphs) for r in runners] == shapes  # the second pass found every step already prepared
    assert len(runners[0].graphs) >= (1 if method == "ar" else 2)


def test_hooked_forwards_run_eagerly(tiny):
    """Medusa reads the target's hidden states through a forward hook: a replay would not call it."""
    target, _, heads = tiny
    ids = random_prompt(9, seed=9, vocab=64)
    eager = generate(target, ids, 20, method="medusa", heads=heads, gamma=3, **CARTESIAN).new_token_ids
    runner = target._specdec_graphs = GraphRunner(target, capture=False)
    try:
        assert generate(target, ids, 20, method="medusa", heads=heads, gamma=3, **CARTESIAN).new_token_ids == eager
        cache = runner.new_cache(9)
        with torch.inference_mode():
            forward_uncached(target, ids, cache)
            handle = target.model.norm.register_forward_hook(lambda *args: None)
            assert runner.forward(cache, ids[:, :1], 1) is None
            handle.remove()
            assert runner.forward(cache, ids[:, :1], 1) is not None
    finally:
        del target._specdec_graphs


def test_cuda_graphs_refuse_a_cpu_model(pair):
    with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA GPU; this one is on cpu"):
        enable_cuda_graphs(pair[0])


def test_engine_bench_refuses_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    out = subprocess.run([sys.executable, "-m", "specdec_utils.tools.engine_bench"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith("engine_bench: needs a CUDA GPU")


def test_non_transformers_models_keep_their_own_caches():
    from specdec_utils.exactness import ToyLM
    assert static_cache.new_cache(ToyLM(8), 5) is None
    assert isinstance(PreallocatedLayer(4), PreallocatedLayer)


def test_a_cache_made_in_inference_mode_keeps_working_outside_it(pair):
    """transformers' DynamicCache concatenates (new tensors each time); ours writes in place, so its
    buffers must not be inference tensors, whatever mode the first forward ran in."""
    target, _ = pair
    ids = random_prompt(20, seed=10)
    with torch.inference_mode():
        a, cache = forward_uncached(target, ids[:, :10], None)
    with torch.no_grad():
        b, cache = forward_uncached(target, ids, cache, 1)
        _, dynamic = forward_uncached(target, ids[:, :10], DynamicCache())
        reference, dynamic = forward_uncached(target, ids, dynamic, 1)
    assert torch.equal(b, reference)
    with torch.inference_mode():
        trim_cache(cache, 15), trim_cache(dynamic, 15)
        c, cache = forward_uncached(target, ids, cache, 1)
        reference, _ = forward_uncached(target, ids, dynamic, 1)
    assert torch.equal(c, reference) and cache.length == 20
