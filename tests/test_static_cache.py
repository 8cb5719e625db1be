"""The preallocated KV cache (static_cache.py) and the runner's graphed step (runner.py), on the CPU.

The cache must give the model exactly what a DynamicCache gives it (same logits, bit for bit), roll
back in O(1) (no copy, no reallocation), survive reuse and growth, and every method of the engine
must produce the same tokens on it. The graphed forward (`static_forward`: write at slots, attend
over the whole buffer under a mask) runs here without the recording (`ModelRunner(..., graphs=True,
record=False)`), so its arithmetic is tested without a GPU; the recording itself is checked by the
CUDA-only test at the end (skipped without a GPU) and on the GPU by `engine_bench`, part 1."""
import subprocess
import sys

import pytest
import torch
from transformers import DynamicCache

from specdec_utils import generate
from specdec_utils.core import static_cache
from specdec_utils.core.engine import forward_uncached
from specdec_utils.core.kv_cache import cache_length, trim_cache
from specdec_utils.core.runner import ModelRunner, new_cache
from specdec_utils.core.static_cache import StaticKVCache
from specdec_utils.models import tiny_model

from conftest import noisy_copy, random_model, random_prompt

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def pair():
    target = random_model("tiny-llama", seed=0)
    return target, noisy_copy(target, noise=0.02, seed=1)


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


def test_one_buffer_holds_every_layer_and_the_plain_llamas_cache(pair):
    """The cache is one stacked buffer per kind (keys, values) whose slices are the layers' `keys`/`values`, before and
    after growing; the GPU engine's plain Llama keeps its cache in the same class; a tree's commit (`gather_cache`)
    moves the path in every layer at once, as moving it layer by layer would."""
    from specdec_utils.core.kv_cache import gather_cache
    from specdec_utils.core.plain_llama import PlainLlama
    target, _ = pair
    cache = StaticKVCache.for_model(target, 64)
    with torch.inference_mode():
        forward_uncached(target, random_prompt(150, seed=4), cache)  # grows past 128: every layer re-pointed
    assert cache.capacity == 256 and cache.keys.shape[0] == len(cache.layers)
    for i, layer in enumerate(cache.layers):
        assert layer.keys.data_ptr() == cache.keys[i].data_ptr()
        assert layer.values.data_ptr() == cache.values[i].data_ptr()
    per_layer = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    keep = torch.tensor([3, 5, 9])
    gather_cache(cache, 80, keep)
    for (keys, values), layer in zip(per_layer, cache.layers):
        for before, after in ((keys, layer.keys), (values, layer.values)):
            assert torch.equal(after[:, :, :80], before[:, :, :80])
            assert torch.equal(after[:, :, 80:83], before[:, :, 80 + keep])
    assert cache.length == 83
    core = PlainLlama(target, 1, 128)
    assert isinstance(core.cache, StaticKVCache) and core.keys is core.cache.keys and core.keys.shape[3] == 128
    core.keys[0, 0, 0, 5] = 1.0
    core.grow(200)
    assert core.capacity == core.keys.shape[3] == 256 and float(core.keys[0, 0, 0, 5, 0]) == 1.0


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


@pytest.mark.parametrize("method,kwargs", METHODS,
                         ids=[f"{m}-{'sampled' if 'temperature' in k else 'greedy'}" for m, k in METHODS])
def test_every_method_gives_the_same_tokens_on_the_static_cache(tiny, method, kwargs):
    target, draft, heads = tiny
    ids = random_prompt(9, seed=7, vocab=64)

    def run(target, draft, draft_small):
        return generate(target, ids, 24, method=method, draft=draft, draft_small=draft_small, heads=heads, gamma=3,
                        generator=torch.Generator().manual_seed(11), **kwargs).new_token_ids

    static = run(target, draft, draft)
    on_dynamic = [ModelRunner(model, cache="dynamic") for model in (target, draft, draft)]  # one runner per role
    dynamic = run(*on_dynamic)
    assert static == dynamic
    assert isinstance(on_dynamic[0].cache, DynamicCache)


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


def graphed(*models):
    """CPU runners that run the graphed step's arithmetic (`static_forward`) without recording it."""
    return [ModelRunner(model, graphs=True, record=False) for model in models]


@pytest.mark.parametrize("method,kwargs", [("ar", {}), ("greedy", {}), ("sampling", {"temperature": 1.0})])
def test_the_graphed_step_gives_the_eager_tokens_and_reuses_its_caches(pair, method, kwargs):
    target, draft = pair
    prompts = [random_prompt(n, seed=n) for n in (7, 15, 11)]
    runners = graphed(target, draft)

    def run(target, draft):
        return [generate(target, p, 30, method=method, draft=draft, gamma=4,
                         generator=torch.Generator().manual_seed(5), **kwargs).new_token_ids for p in prompts]

    eager = run(target, draft)
    first = run(*runners)
    caches, shapes, replays = [r.cache for r in runners], [set(r.graphs) for r in runners], runners[0].replays
    again = run(*runners)
    assert first == eager and again == eager
    assert [r.cache is not None for r in runners] == [True, method != "ar"]
    assert [r.cache for r in runners] == caches and [r.epoch for r in runners] == [0, 0]  # one cache each, reused
    assert [set(r.graphs) for r in runners] == shapes  # the second pass found every step already prepared
    assert len(runners[0].graphs) >= (1 if method == "ar" else 2) and runners[0].replays > replays
    assert all(key[2:] == (runners[0].cache.capacity, 0) for key in runners[0].graphs)
    assert runners[0].captures == 0  # record=False: nothing recorded


@pytest.mark.parametrize("method", ["ar", "greedy"])
def test_a_cache_that_grows_mid_generation_drops_its_graphs(pair, method):
    """A first buffer holds what the first forward feeds + CHUNK positions, rounded up to a multiple of
    CHUNK (the target's first forward is the prompt and the first round's drafts); asking for more new
    tokens than that makes the cache grow into new buffers mid-generation: every graph of the old ones
    is dropped (the epoch moves on), the steps after it are prepared again on the new buffers (keyed by
    the new capacity), and the tokens are the eager ones."""
    target, draft = pair
    prompt, new_tokens = random_prompt(static_cache.CHUNK - 8, seed=12), static_cache.CHUNK + 16
    eager = generate(target, prompt, new_tokens, method=method, draft=draft, gamma=4).new_token_ids
    runners = graphed(target, draft)
    result = generate(runners[0], prompt, new_tokens, method=method, draft=runners[1], gamma=4)
    assert result.new_token_ids == eager
    runner = runners[0]
    assert runner.cache.capacity > 2 * static_cache.CHUNK and runner.epoch >= 1
    assert runner.graphs and all(key[2:] == (runner.cache.capacity, runner.epoch) for key in runner.graphs)
    assert runner.forwards == result.target_calls and runner.replays > 0
    # a new generation keeps the grown buffers and the graphs recorded on them
    epoch, graphs = runner.epoch, set(runner.graphs)
    assert generate(runners[0], prompt, new_tokens, method=method, draft=runners[1], gamma=4).new_token_ids == eager
    assert runner.epoch == epoch and graphs <= set(runner.graphs)  # kept (and maybe a few more shapes)


def test_a_target_drafting_for_itself_needs_two_runners(pair):
    target, _ = pair
    prompt = random_prompt(11, seed=13)
    reference = generate(target, prompt, 25, method="ar").new_token_ids
    for draft_runner in (ModelRunner(target), *graphed(target)):  # the same model, a runner (a cache) of its own
        target_runner = graphed(target)[0] if draft_runner.graphed else ModelRunner(target)
        result = generate(target_runner, prompt, 25, method="greedy", draft=draft_runner, gamma=4)
        assert result.new_token_ids == reference and result.accepted == result.drafted > 0
    assert generate(target, prompt, 25, method="greedy", draft=target, gamma=4).new_token_ids == reference  # models
    for runner in (ModelRunner(target), *graphed(target)):
        for method in ("greedy", "draft-tree", "hierarchical"):
            with pytest.raises(ValueError, match=r"^two models of this generation share one ModelRunner"):
                generate(runner, prompt, 25, method=method, draft=runner, draft_small=ModelRunner(target), gamma=4)
    shared = ModelRunner(target)  # M1 and M2 of a hierarchy sharing one cache
    with pytest.raises(ValueError, match=r"^two models of this generation share one ModelRunner"):
        generate(target, prompt, 25, method="hierarchical", draft=shared, draft_small=shared)


def test_forwards_that_return_a_hidden_state_run_eagerly(tiny):
    """Medusa reads the target's hidden states: a replay runs no Python hooks, so those forwards run eagerly."""
    target, _, heads = tiny
    ids = random_prompt(9, seed=9, vocab=64)
    eager = generate(target, ids, 20, method="medusa", heads=heads, gamma=3, **CARTESIAN).new_token_ids
    runner, = graphed(target)
    assert generate(runner, ids, 20, method="medusa", heads=heads, gamma=3, **CARTESIAN).new_token_ids == eager
    assert runner.forwards > 0 and runner.replays == 0
    more = random_prompt(11, seed=10, vocab=64)
    runner.begin(9)
    with torch.inference_mode():
        runner.forward(more[:, :9], 1)                                 # the prefill: eager
        logits, hidden = runner.forward(more[:, :10], 1, hidden="norm")  # a hidden state asked for: eager
        assert runner.replays == 0 and hidden.shape[-1] == target.config.hidden_size
        again = runner.forward(more, 1)                                # none asked for: replayed
    assert runner.replays == 1 and again.shape == logits.shape


def test_graphs_need_a_cuda_gpu_and_the_static_cache(pair):
    from specdec_utils.exactness import ToyLM
    with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA GPU; this one is on cpu"):
        ModelRunner(pair[0], graphs=True)
    for model, cache in ((pair[0], "dynamic"), (ToyLM(8), "static")):
        with pytest.raises(ValueError, match="CUDA graphs need the static cache of a transformers decoder"):
            ModelRunner(model, graphs=True, cache=cache, record=False)
    with pytest.raises(ValueError, match="cache must be one of static, dynamic, got 'paged'"):
        ModelRunner(pair[0], cache="paged")
    with pytest.raises(ValueError, match="ModelRunner takes a model, got a ModelRunner"):
        ModelRunner(ModelRunner(pair[0]))


def test_the_bench_counts_the_forwards_of_its_runners(pair):
    """`--cuda-graphs` hands the engine one runner per model: a replay runs no hooks, so the bench
    counts a runner's forwards from the runner. The counts, tokens and per-round sums must be those of
    the same run on the plain models (the hooks' counts); Hugging Face's method runs on the models."""
    from transformers import AutoTokenizer

    from specdec_utils import measure
    from specdec_utils.models import ensure_target_cache
    tokenizer = AutoTokenizer.from_pretrained(ensure_target_cache())
    target = random_model("tiny-llama", seed=0, vocab=len(tokenizer))
    draft, small = noisy_copy(target, noise=0.02, seed=1), noisy_copy(target, noise=0.05, seed=2)
    rows = [{"id": "story", "prompt": "Once upon a time"}]
    methods = ["ar", "greedy", "hierarchical", "hf-assisted"]

    def run(target, draft, small):
        records = measure.run_benchmark(target, draft, tokenizer, rows, methods, 12, 3, 0.0, 1.0, 0, "float32", "cpu",
                                      draft_small=small, warmup=False)
        return {r["method"]: {key: r[key] for key in ("new_token_ids", "target_calls", "draft_calls", "small_calls",
                                                       "drafted", "accepted", "rounds", "cuda_graphs")}
                for r in records}

    plain = run(target, draft, small)
    runners = graphed(target, draft, small)
    assert run(*runners) == plain
    assert all(runner.replays > 0 for runner in runners)
    assert plain["greedy"]["target_calls"] == plain["greedy"]["rounds"] and plain["hierarchical"]["small_calls"] > 0
    assert plain["hf-assisted"]["target_calls"] > 0 and not plain["ar"]["cuda_graphs"]


@pytest.mark.parametrize("tool", ["engine_bench", "step_bench"])
def test_gpu_benchmarks_refuse_without_a_gpu(tool):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    out = subprocess.run([sys.executable, "-m", f"specdec_lab.{tool}"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith(f"{tool}: needs a CUDA GPU")


def test_plain_decoder_step_as_the_step_benchmark_runs_it_matches_the_model():
    """step_bench times the plain-torch decoder's forward at a cache length: on the CPU, the same call gives the
    model's own logits for the fed tokens (the benchmark also records the compiled step's difference from it)."""
    from specdec_lab.write_corpus import StaticDecoder
    model = tiny_model("tiny-llama", vocab_size=256, seed=0).eval()
    ids = torch.randint(0, 256, (1, 21), generator=torch.Generator().manual_seed(0))
    dec = StaticDecoder(model, batch=1, max_len=64, graphs=False)
    with torch.no_grad():
        dec.prefill([ids[0, :16].tolist()])
        logits = dec.forward(ids[:, 16:], torch.arange(16, 21), 64)
        expected = model(ids).logits[0, -1]
    torch.testing.assert_close(logits[0], expected, atol=1e-4, rtol=1e-4)


def test_non_transformers_models_keep_their_own_caches(pair):
    from specdec_utils.exactness import ToyLM
    assert new_cache(ToyLM(8), 5) is None and new_cache(pair[0], 5, "dynamic") is None
    assert isinstance(new_cache(pair[0], 5), StaticKVCache)


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


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_recorded_cuda_graphs_give_the_eager_tokens():
    """The real thing: steps recorded into CUDA graphs and replayed give the eager tokens, for the target
    alone, with a draft, with the target drafting for itself (two runners), and across a cache that grows
    mid-generation (its graphs dropped and recorded again on the new buffers)."""
    device = torch.device("cuda")
    target = random_model("tiny-llama", seed=0)
    draft = noisy_copy(target, noise=0.02, seed=1).to(device)
    target = target.to(device)
    short, long = random_prompt(9, seed=14).to(device), random_prompt(static_cache.CHUNK - 8, seed=15).to(device)
    runners = {"target": ModelRunner(target, graphs=True), "draft": ModelRunner(draft, graphs=True),
               "self": ModelRunner(target, graphs=True)}
    for prompt, new_tokens in ((short, 40), (long, static_cache.CHUNK + 16)):  # the long one outgrows the buffers
        reference = generate(target, prompt, new_tokens, method="ar").new_token_ids
        assert generate(runners["target"], prompt, new_tokens, method="ar").new_token_ids == reference
        for draft_model, draft_runner in ((draft, runners["draft"]), (target, runners["self"])):
            eager = generate(target, prompt, new_tokens, method="greedy", draft=draft_model, gamma=4).new_token_ids
            assert eager == reference
            result = generate(runners["target"], prompt, new_tokens, method="greedy", draft=draft_runner, gamma=4)
            assert result.new_token_ids == reference
            if draft_model is target:
                assert result.accepted == result.drafted > 0
    runner = runners["target"]
    assert runner.captures > 0 and runner.replays > runner.captures
    assert runner.epoch >= 1 and runner.cache.capacity > 2 * static_cache.CHUNK  # the long prompt grew the cache
    assert runner.graphs and all(key[2:] == (runner.cache.capacity, runner.epoch) for key in runner.graphs)
    captures, reference = runner.captures, generate(target, short, 40, method="ar").new_token_ids
    assert generate(runner, short, 40, method="ar").new_token_ids == reference
    assert runner.captures == captures  # a new generation replays the graphs it already has
