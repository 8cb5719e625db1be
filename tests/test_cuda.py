"""The recorded executor on a GPU (marked `cuda`: skipped without one; `make test-gpu` runs them on the GPU machine).

The CPU tests run the device round op by op, the same tensor operations a CUDA graph records; what only a recording
can break (a value frozen at capture, a pool reused, a buffer replaced under a graph) shows here. Every loop below is
run twice on the GPU, recorded (`graphs=True`: the round replayed from one CUDA graph) and op by op (`graphs=False`),
from the same random numbers, and both must give the same tokens, round for round; in float32 the greedy tokens are
also the target alone's through the engine, and a sampled draft's chain writes the engine's own sampled tokens
(a sampled tree reads a varying number of draws a round: the same seed must still give the same tokens)."""
import pytest
import torch

from specdec_utils.core.device_loop import DeviceExecutor, DeviceLoop, DeviceTreeLoop
from specdec_utils.core.methods import generate

from conftest import noisy_copy, random_eagle_head, random_model, random_prompt

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def models():
    target = random_model("tiny-llama", seed=0, vocab=16)
    draft, head = noisy_copy(target, noise=0.3, seed=1), random_eagle_head(target, 2)  # made on the CPU
    return target.cuda(), draft.cuda(), head.cuda()  # (the head follows its target object)


def prompts(n=3):
    return [random_prompt(length, seed=seed, vocab=16).cuda() for seed, length in zip(range(n), (2, 9, 17))]


LOOPS = {"ar": lambda t, d, h, **o: DeviceLoop(t, gamma=0, **o),
         "draft, gamma 4": lambda t, d, h, **o: DeviceLoop(t, draft=d, gamma=4, **o),
         "eagle-chain, gamma 5": lambda t, d, h, **o: DeviceLoop(t, head=h, gamma=5, **o),
         "eagle tree 4x3x10": lambda t, d, h, **o: DeviceTreeLoop(t, h, depth=4, topk=3, nodes=10, **o)}


@pytest.mark.parametrize("name", list(LOOPS))
def test_recorded_and_op_by_op_rounds_give_the_same_greedy_tokens(models, name):
    target, draft, head = models
    recorded, eager = (LOOPS[name](target, draft, head, graphs=graphs) for graphs in (True, False))
    for ids in prompts():
        reference = generate(target, ids, 150, method="ar").new_token_ids  # the engine: the target alone
        a, b = recorded.generate(ids, 150), eager.generate(ids, 150)
        assert recorded.graph is not None and a.new_token_ids == b.new_token_ids == reference, name
        assert a.accepted_per_round == b.accepted_per_round


@pytest.mark.parametrize("name", list(LOOPS))
def test_recorded_and_op_by_op_rounds_draw_the_same_sampled_tokens(models, name):
    target, draft, head = models
    recorded, eager = (LOOPS[name](target, draft, head, graphs=graphs, temperature=1.0, top_k=8)
                       for graphs in (True, False))
    for seed, ids in enumerate(prompts()):
        a = recorded.generate(ids, 150, generator=torch.Generator().manual_seed(seed))
        b = eager.generate(ids, 150, generator=torch.Generator().manual_seed(seed))
        assert a.new_token_ids == b.new_token_ids and a.accepted_per_round == b.accepted_per_round, (name, seed)


def test_the_recorded_executor_writes_the_engines_sampled_tokens(models):
    """`generate(..., executor=DeviceExecutor())` on the GPU: the round recorded, the engine's own draws (the same
    uniforms in the same order), up to the engine's first round that drafts fewer than gamma."""
    target, draft, _ = models
    executor = DeviceExecutor()
    for seed, ids in enumerate(prompts()):
        kwargs = {"method": "sampling", "draft": draft, "gamma": 4, "temperature": 1.0}
        engine = generate(target, ids, 60, generator=torch.Generator().manual_seed(seed), **kwargs)
        device = generate(target, ids, 60, generator=torch.Generator().manual_seed(seed), executor=executor, **kwargs)
        k = next((i for i, r in enumerate(engine.rounds) if r.drafted < 4), len(engine.rounds))
        n = sum(r.accepted + 1 for r in engine.rounds[:k])
        assert n >= 20 and device.new_token_ids[:n] == engine.new_token_ids[:n], seed
    assert all(loop.graph is not None for loop in executor.loops.values())


def test_a_recorded_loop_survives_its_buffers_growing(models):
    """A generation longer than the buffers: they are replaced and the round is recorded again on the new ones
    (a graph recorded on the old buffers would read freed memory)."""
    target, draft, head = models
    for name in ("draft, gamma 4", "eagle-chain, gamma 5", "eagle tree 4x3x10"):
        loop = LOOPS[name](target, draft, head, graphs=True, capacity=128)
        ids = prompts()[1]
        reference = generate(target, ids, 400, method="ar").new_token_ids
        assert loop.generate(ids, 400).new_token_ids == reference and loop.capacity > 128, name


@pytest.mark.slow
def test_draft_step_bench_times_the_heads_graph_beside_its_eager_step(monkeypatch):
    """On a GPU `graphed=True` adds the head's step replayed from a CUDA graph; the eager row records no graph."""
    from specdec_utils import step_costs
    made = []
    proposer = step_costs.EagleProposer

    def keep(head, *args, **kwargs):
        made.append(proposer(head, *args, **kwargs))
        return made[-1]
    monkeypatch.setattr(step_costs, "EagleProposer", keep)
    steps = step_costs.step_costs(torch.device("cuda"), torch.bfloat16, context=16, repeats=3, graphed=True)
    assert {"eagle-head", "eagle-head, graphed"} <= set(steps)
    assert [p.graphs for p in made] == [False, True] and len(made[0]._graphs) == 0 < len(made[1]._graphs)
