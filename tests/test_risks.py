"""Regression tests for risks found by a code review: CUDA graph pools dropped with their graphs (`graphs.GraphCache`),
the graphed step's mask under eager attention, EAGLE's rotary frequencies kept in float32, rollbacks that refuse to
keep more than the cache holds, a reused Medusa proposer, and the shipped-EAGLE cache that must not keep targets alive.
The CUDA-only tests (marked `cuda`) run on a GPU machine (`make test-gpu`)."""
import gc
import importlib.util
import weakref

import pytest
import torch

from specdec_utils import generate
from specdec_utils.core import eagle, methods
from specdec_utils.core.engine import Sampler, decode
from specdec_utils.core.plain_llama import PlainRunner
from specdec_utils.core.runner import ModelRunner
from specdec_utils.core.tree_drafting import MedusaPolicy, MedusaProposer
from specdec_utils.models import tiny_model

from conftest import random_eagle_head, random_model, random_prompt

pytestmark = pytest.mark.usefixtures("single_thread")

class _FakeGraph:
    """What the fake recorder returns: `replay()` runs the step again and writes into the recorded outputs."""

    def __init__(self, step, outputs):
        self.step, self.outputs = step, outputs

    def replay(self):
        fresh = self.step()
        for out, new in zip(self.outputs if isinstance(self.outputs, tuple) else (self.outputs,),
                            fresh if isinstance(fresh, tuple) else (fresh,)):
            out.copy_(new)


def _fake_cuda_graphs(monkeypatch) -> list:
    """Record "graphs" without CUDA: every pool handle is a new object, every recording notes the pool it was given.
    Returns the list of pools the recordings received, in order."""
    pools = []

    def record(step, pool=None, warmups=1):
        pools.append(pool)
        outputs = step()
        return _FakeGraph(step, outputs), outputs

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    for module in ("specdec_utils.core.graphs", "specdec_utils.core.runner", "specdec_utils.core.eagle",
                   "specdec_utils.core.plain_llama"):
        if importlib.util.find_spec(module) is not None:
            monkeypatch.setattr(importlib.import_module(module), "record_cuda_graph", record, raising=False)
    return pools


# --------------------------------------------------------------------------- 1. graph pools
def test_graph_cache_invalidate_drops_the_graphs_and_the_pool(monkeypatch):
    from specdec_utils.core.graphs import GraphCache
    pools = _fake_cuda_graphs(monkeypatch)
    cache = GraphCache()
    assert cache.pool is None and len(cache) == 0 and cache.captures == 0  # the pool is made on the first record
    cache["a"] = cache.record(lambda: torch.ones(2))
    first = cache.pool
    cache["b"] = cache.record(lambda: torch.zeros(2), warmups=3)
    assert first is not None and pools == [first, first] and set(cache) == {"a", "b"} and cache.captures == 2
    assert "a" in cache and cache.get("c") is None and cache["a"][0].outputs.tolist() == [1.0, 1.0]
    epoch = cache.epoch
    cache.invalidate()
    assert len(cache) == 0 and not cache and cache.pool is None and cache.epoch == epoch + 1
    cache["a"] = cache.record(lambda: torch.ones(2))
    assert cache.pool is not None and cache.pool is not first and pools[-1] is cache.pool  # a new pool
    assert cache.captures == 3


def test_eagle_proposer_takes_a_new_pool_when_its_head_cache_grows(monkeypatch):
    pools = _fake_cuda_graphs(monkeypatch)
    target = random_model("tiny-llama", seed=0)
    head = random_eagle_head(target, 2)
    proposer = eagle.EagleProposer(head, graphs=True)
    reference = eagle.EagleProposer(head, graphs=False)
    width = len(head.features) * head.hidden_size
    generator = torch.Generator().manual_seed(0)
    capacities = []
    with torch.no_grad():
        for _ in range(10):  # 10 x 30 entries: the head cache (256 entries at first) grows once
            start, n = proposer.cache.length, 30
            features = torch.randn(n, width, generator=generator)
            tokens = torch.randint(3, 256, (n,), generator=generator)
            positions = torch.arange(start, start + n)
            allowed = torch.ones(n, start + n, dtype=torch.bool).tril(start)
            h, logits = proposer.step(features, tokens, positions, allowed, own=False)
            h_ref, logits_ref = reference.step(features, tokens, positions, allowed, own=False)
            assert torch.allclose(h, h_ref, atol=1e-5, rtol=1e-4) and torch.allclose(logits, logits_ref, atol=1e-5,
                                                                                     rtol=1e-4)
            capacities.append(proposer.cache.k.shape[1])
    grown = capacities.index(capacities[-1])  # the first step on the grown buffers
    assert capacities[0] == 256 < capacities[-1] and 0 < grown
    assert len(pools) == 2  # one graph (budget 32, the target's features) recorded per buffer
    assert pools[0] is not None and pools[1] is not None
    assert pools[1] is not pools[0], "the head cache grew and its graphs were dropped, but the old pool was reused"


def test_model_runner_and_plain_runner_take_a_new_pool_after_their_graphs_are_dropped(monkeypatch):
    """Whatever drops a runner's graphs (its cache grown) drops its pool with them; captures, replays and the epoch
    count as before."""
    pools = _fake_cuda_graphs(monkeypatch)
    target = random_model("tiny-llama", seed=0)
    for make in (lambda: ModelRunner(target, graphs=True, record=False), lambda: PlainRunner(target, graphs=True,
                                                                                               record=False)):
        runner = make()
        runner.record = True  # record through the fake recorder: no CUDA here
        pools.clear()
        prompt = random_prompt(9, seed=1)
        with torch.inference_mode():
            runner.begin(prompt.shape[1])
            runner.forward(prompt)
            ids = torch.cat([prompt, random_prompt(1, seed=2)], 1)
            runner.forward(ids)
            assert runner.captures == 1 and len(pools) == 1 and pools[0] is not None and runner.epoch == 0
            runner.rollback(prompt.shape[1])
            runner.begin(400)  # a longer prompt to come: the buffers grow, the graphs are dropped
            assert runner.epoch == 1 and len(runner.graphs) == 0
            runner.forward(prompt)
            runner.forward(ids)
        assert runner.captures == 2 and len(pools) == 2 and pools[1] is not None and pools[1] is not pools[0]
        assert runner.replays == 2


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_cache_records_again_after_invalidation_on_cuda():
    from specdec_utils.core.graphs import GraphCache
    cache = GraphCache()
    x = torch.arange(4.0, device="cuda")
    cache["double"] = cache.record(lambda: x * 2)
    x.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    graph, out = cache["double"]
    graph.replay()
    assert out.tolist() == [2.0, 4.0, 6.0, 8.0]
    old_pool = cache.pool
    cache.invalidate()
    del graph, out
    gc.collect()
    torch.cuda.synchronize()
    y = torch.ones(8, device="cuda")  # new buffers, as after a cache grew
    cache["triple"] = cache.record(lambda: y * 3)
    assert cache.pool is not None and cache.pool != old_pool
    graph, out = cache["triple"]
    y.fill_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [6.0] * 8 and cache.captures == 2


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_eagle_on_cuda_past_the_head_caches_first_buffers_equals_ar(monkeypatch):
    """EAGLE's head steps replayed from CUDA graphs, across a head cache that grows past its first 256 entries
    (its graphs and their pool dropped, new ones recorded on the new buffers), give the target's greedy tokens."""
    target = random_model("tiny-llama", seed=0, vocab=64)
    head = random_eagle_head(target, 2)  # made on the CPU (its random offsets are), then moved with the target
    target, head = target.cuda(), head.cuda()
    capacities = []
    reserve = eagle._HeadCache.reserve

    def spy(self, head, needed):
        grown = reserve(self, head, needed)
        capacities.append(self.k.shape[1])
        return grown

    monkeypatch.setattr(eagle._HeadCache, "reserve", spy)
    ids = torch.randint(3, 64, (1, 9), generator=torch.Generator().manual_seed(3)).cuda()
    reference = generate(target, ids, 300, method="ar").new_token_ids
    for method in ("eagle", "eagle-chain"):
        capacities.clear()
        result = generate(target, ids, 300, method=method, eagle=head)
        assert result.new_token_ids == reference, method
        assert capacities[0] == 256 < max(capacities), capacities[-1]  # the head cache grew mid-generation


# --------------------------------------------------------------------------- 2. the graphed step's mask
def test_graphed_step_under_eager_attention_equals_the_eager_runner():
    model = random_model("tiny-llama", seed=0)
    model.set_attn_implementation("eager")
    prompt = random_prompt(12, seed=4)
    ids = torch.cat([prompt, random_prompt(3, seed=5)], 1)
    graphed, eager = ModelRunner(model, graphs=True, record=False), ModelRunner(model)
    with torch.inference_mode():
        for runner in (graphed, eager):
            runner.begin(prompt.shape[1])
        assert torch.allclose(graphed.forward(prompt), eager.forward(prompt), atol=1e-5, rtol=0)
        a, b = graphed.forward(ids, 3), eager.forward(ids, 3)
    assert graphed.replays == 1 and eager.replays == 0  # the 3-token step ran the graphed (whole-buffer) step
    assert (a - b).abs().max() <= 1e-5, f"graphed step under eager attention differs by {(a - b).abs().max():.3g}"


def test_graphed_step_keeps_sdpa_and_refuses_attention_that_cannot_take_a_4d_mask():
    model = random_model("tiny-llama", seed=0)
    prompt = random_prompt(12, seed=4)
    ids = torch.cat([prompt, random_prompt(3, seed=5)], 1)
    graphed, eager = ModelRunner(model, graphs=True, record=False), ModelRunner(model)
    with torch.inference_mode():
        graphed.forward(prompt), eager.forward(prompt)
        assert torch.allclose(graphed.forward(ids, 3), eager.forward(ids, 3), atol=1e-5, rtol=0)
    model.config._attn_implementation_internal = "flash_attention_2"  # what set_attn_implementation would set
    if model.config._attn_implementation != "flash_attention_2":
        pytest.skip("this transformers version keeps the attention implementation elsewhere")
    with pytest.raises(ValueError, match=r'set_attn_implementation\("sdpa"\)'):
        ModelRunner(model, graphs=True, record=False)
    PlainRunner(model, graphs=True, record=False)  # its own attention: any implementation the model has
    ModelRunner(model)  # eager: transformers builds its own mask


# --------------------------------------------------------------------------- 6. dynamo's recompile limit
def test_the_compiled_steps_recompile_limit_is_raised_around_its_calls_only():
    import torch._dynamo.config as dynamo_config

    from specdec_utils.core import plain_llama
    limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    before = getattr(dynamo_config, limit)
    with plain_llama.recompile_room(True):
        assert getattr(dynamo_config, limit) == max(before, 64)
    assert getattr(dynamo_config, limit) == before
    with plain_llama.recompile_room(False):
        assert getattr(dynamo_config, limit) == before


# --------------------------------------------------------------------------- 3. EAGLE's rotary frequencies
def _inv_freq(head) -> torch.Tensor:
    theta = eagle._rope_theta(head.target.config)
    return 1.0 / theta ** (torch.arange(0, head.head_dim, 2).float() / head.head_dim)


def test_eagle_inv_freq_stays_float32_in_a_bf16_head(tmp_path):
    target = tiny_model("tiny-llama", vocab_size=256, seed=0).eval().to(torch.bfloat16)
    head = eagle.eagle_head_for(target)
    assert head.q.weight.dtype == torch.bfloat16
    assert head.inv_freq.dtype == torch.float32, f"inv_freq is {head.inv_freq.dtype} in a bf16 head"
    assert torch.equal(head.inv_freq, _inv_freq(head))
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        head.to(dtype)
        assert head.inv_freq.dtype == torch.float32 and torch.equal(head.inv_freq, _inv_freq(head)), dtype
    head.to(torch.bfloat16).save(tmp_path / "head")
    loaded = eagle.load_eagle(tmp_path / "head", target)
    assert loaded.q.weight.dtype == torch.bfloat16 and loaded.inv_freq.dtype == torch.float32
    assert torch.equal(loaded.inv_freq, _inv_freq(loaded))
    assert "inv_freq" not in loaded.state_dict()  # still not saved


# --------------------------------------------------------------------------- 4. rollbacks
@pytest.mark.parametrize("kind", ["runner", "plain"])
def test_a_rollback_past_the_cache_raises_and_keep_at_most_clamps(kind):
    model = random_model("tiny-llama", seed=0)
    runner = ModelRunner(model) if kind == "runner" else PlainRunner(model)
    with torch.inference_mode():
        runner.begin(8)
        runner.forward(random_prompt(8, seed=1))
    assert runner.length == 8
    with pytest.raises(ValueError, match="holds 8"):
        runner.rollback(9)
    assert runner.length == 8
    runner.keep_at_most(12)  # clamps: keeps what it has
    assert runner.length == 8
    runner.keep_at_most(5)
    assert runner.length == 5
    runner.rollback(5)
    runner.rollback(2)
    assert runner.length == 2
    with pytest.raises(ValueError):
        runner.rollback(-1)


def test_a_reused_medusa_proposer_drafts_its_first_round_as_a_fresh_one(tiny):
    target, _, heads = tiny
    first, second = random_prompt(6, seed=1, vocab=64), random_prompt(7, seed=2, vocab=64)

    def run(proposer, ids):
        policy = MedusaPolicy(gamma=3, tree="cartesian", topk=2, tree_nodes=8)
        return decode(target, proposer, policy, ids, 12, Sampler(0.0), set())

    reused = MedusaProposer(heads)
    run(reused, first)
    again, fresh = run(reused, second), run(MedusaProposer(heads), second)
    rounds = [[(r.drafted, r.accepted, r.stop) for r in result.rounds] for result in (again, fresh)]
    assert rounds[0][0] == rounds[1][0], f"round 1 of a reused proposer {rounds[0][0]}, of a fresh one {rounds[1][0]}"
    assert rounds[0] == rounds[1] and again.new_token_ids == fresh.new_token_ids


# --------------------------------------------------------------------------- 5. the shipped-EAGLE cache
def test_the_shipped_eagle_cache_does_not_keep_a_target_alive(monkeypatch):
    loads = []

    def load(name, target):
        loads.append(name)
        return eagle.eagle_head_for(target)

    monkeypatch.setattr(eagle, "load_eagle", load)
    target = random_model("tiny-llama", seed=0)
    ids = random_prompt(5, seed=1)
    before = len(methods._SHIPPED_EAGLE)
    expected = generate(target, ids, 6, method="ar").new_token_ids
    assert generate(target, ids, 6, method="eagle-chain").new_token_ids == expected
    assert generate(target, ids, 6, method="eagle").new_token_ids == expected
    assert len(loads) == 1 and len(methods._SHIPPED_EAGLE) == before + 1  # loaded once per target, then cached
    alive = weakref.ref(target)
    del target
    gc.collect()
    assert alive() is None, "the shipped-EAGLE cache keeps its target alive"
    assert len(methods._SHIPPED_EAGLE) == before
