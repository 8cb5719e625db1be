"""What one drafting step costs next to the target's, measured side by side in one run (lessons 07 and 11): the
target's eager step is the unit; a draft model's step, an EAGLE head's step, the target's pass over k new tokens
and a block drafter's round are timed at a realistic cache length. Median and spread of `repeats` after warm-up,
synchronised on a GPU. A step's cost does not depend on the weights, only on the shapes."""
from __future__ import annotations

import statistics
import time

import torch

from .core.block import BlockPolicy, BlockProposer, block_drafter_for
from .core.eagle import EAGLE_NAME, EagleProposer, load_eagle
from .core.engine import Sampler
from .core.runner import ModelRunner
from .models import load_model


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(step, device, repeats: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


@torch.inference_mode()
def step_costs(device, dtype, context: int = 128, repeats: int = 200, head_name=EAGLE_NAME, draft_name="draft-m",
            verify=(), block_size: int = 0, markov_rank: int = 0, graphed: bool = False) -> dict:
    """Median and spread (ms) of one eager step of the target, `draft_name` and the EAGLE head at a cache of
    `context` tokens; with `verify` (token counts k) also the target's pass over k new tokens ("target xk"), and
    with `block_size` one round of a block drafter of that shape ("block-drafter": its one pass over the context
    and the walk of its block_size - 1 slots, `BlockProposer.propose`). A step's cost does not depend on the
    weights: the block drafter is an untrained one of the head's draft vocabulary. With `graphed` on a CUDA device also
    the head's step replayed from a CUDA graph ("eagle-head, graphed"), as the engine runs it there by default."""
    target, _ = load_model("smollm2-135m", device=device, dtype=dtype)
    draft, _ = load_model(draft_name, device=device, dtype=dtype)
    head = load_eagle(head_name, target)
    ids = torch.randint(3, 1000, (1, context), device=device, generator=None)
    out = {}
    runners = {}
    for name, model in (("target", target), (draft_name, draft)):
        runner = runners[name] = ModelRunner(model)
        runner.forward(ids)

        def step(runner=runner):
            runner.forward(torch.cat([ids, ids[:, :1]], 1))
            runner.rollback(context)
        out[name] = time_steps(step, device, repeats)
    features = torch.randn(context, len(head.features) * head.hidden_size, device=device, dtype=dtype)
    # eager, like the two models above; on a GPU also replayed from a CUDA graph, the proposer's default there
    graphed = graphed and device.type == "cuda"
    for name, graphs in (("eagle-head", False),) + ((("eagle-head, graphed", True),) if graphed else ()):
        proposer = EagleProposer(head, graphs=graphs)
        proposer.observe_target(features[:-1])
        h, _ = proposer._catch_up(ids)
        fed = proposer.cache.length

        def head_step(proposer=proposer, h=h, fed=fed):
            allowed = torch.ones(1, fed + 1, dtype=torch.bool, device=device)
            proposer.step(h[None], ids[0, :1], torch.tensor([fed], device=device), allowed, own=True)
            proposer.cache.length = fed
        out[name] = time_steps(head_step, device, repeats)
    runner = runners["target"]  # its cache holds the context already
    for k in verify:
        wide = torch.cat([ids, ids[:, :k]], 1)

        def verify_step(wide=wide):
            runner.forward(wide)
            runner.rollback(context)
        out[f"target x{k}"] = time_steps(verify_step, device, repeats)
    if block_size:
        drafter = block_drafter_for(target, block_size, vocab_ids=head.vocab_ids, markov_rank=markov_rank)
        block = BlockProposer(drafter)
        block.observe_target(features[:-1])
        policy = BlockPolicy(block_size - 1)

        def block_round():
            block.propose(ids, block_size - 1, policy, Sampler(), None, 0)
        out["block-drafter"] = time_steps(block_round, device, repeats)
    return {name: {"median_ms": statistics.median(t), "p10_ms": sorted(t)[len(t) // 10],
                   "p90_ms": sorted(t)[9 * len(t) // 10]} for name, t in out.items()}
