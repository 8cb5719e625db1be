"""How fast can one decode step of the target be? The course's graphed step against leaner ones (GPU only).

    python -m specdec_lab.step_bench --out data/bench/step_gpu_h100.json

One target step (1 token; 5 tokens: a gamma-4 verification) at a few cache lengths, four ways:

* `engine, eager` and `engine, graphed`: the course's `ModelRunner` (notebook 09): transformers' Llama forward on
  the `StaticKVCache`, eager or replayed from a CUDA graph; the graphed step attends over the whole preallocated
  cache under a mask;
* `plain torch, graphed`: the same weights in the plain-torch decoder of `write_corpus` (fused q/k/v and gate/up
  projections, attention over the cache rounded up to 64 slots), one CUDA graph per step;
* `compiled, graphed`: that decoder's step through `torch.compile` (Inductor fuses the norms, the rotary
  embedding, SiLU and the residual adds into a few kernels), then recorded as a CUDA graph.

Each is timed as the median of `--repeats` runs of `--iters` back-to-back steps (CUDA events), with the spread;
kernels per step are counted by the profiler on one un-graphed step. The bandwidth floor is the weights' bytes
over the GPU's copy bandwidth (measured here with a device-to-device copy).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys

import torch
import transformers

from specdec_utils.core.graphs import record_cuda_graph
from specdec_utils.core.runner import ModelRunner, attention_backends
from specdec_utils.models import load_model
from specdec_utils.utils import REPO_ROOT, command_line

from .write_corpus import WINDOW, StaticDecoder


def _cuda_ms(fn, iters: int, repeats: int) -> list[float]:
    """ms per call of `fn`, `repeats` times: CUDA events around `iters` back-to-back calls."""
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / iters)
    return out


def kernels_in(fn) -> int:
    """CUDA kernels one call of `fn` launches (the profiler's device-side kernel events)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def summary(times: list[float]) -> dict:
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "runs": len(times)}


def engine_step(target, cache_len: int, n: int, graphs: bool):
    """A callable running one engine step of `n` tokens at `cache_len` (rolled back after each call)."""
    runner = ModelRunner(target, graphs=graphs)
    ids = torch.randint(0, 1000, (1, cache_len), device="cuda")
    runner.begin(cache_len + n)
    runner.forward(ids)
    fed = torch.cat([ids, torch.randint(0, 1000, (1, n), device="cuda")], 1)

    def step():
        runner.forward(fed, n)
        runner.rollback(cache_len)
    return step


class PlainStep:
    """One step of `n` tokens of the plain-torch decoder at cache length `cache_len`, optionally compiled,
    replayed from a CUDA graph (`graph()`) or run as is (`eager()`)."""

    def __init__(self, target, cache_len: int, n: int, compiled: bool):
        self.window = -(-(cache_len + n) // WINDOW) * WINDOW  # the cache, rounded up to whole windows
        self.dec = StaticDecoder(target, batch=1, max_len=self.window, graphs=False)
        self.ids = torch.randint(0, 1000, (1, n), device="cuda")
        self.slots = torch.arange(cache_len, cache_len + n, device="cuda")
        self.logits = None
        forward = self.dec.forward
        with attention_backends(self.dec.device):
            self.dec.prefill([torch.randint(0, 1000, (cache_len,)).tolist()])
            self.reference = forward(self.ids, self.slots, self.window).float()  # plain torch, un-graphed
        self.forward = torch.compile(forward, dynamic=False) if compiled else forward
        self._graph = None

    def eager(self):
        with attention_backends(self.dec.device):
            self.logits = self.forward(self.ids, self.slots, self.window)

    def graph(self):
        """`eager()` replayed from a CUDA graph, recorded on the first call by the package's recorder (3 warm-ups,
        its own pool); `self.logits` is then the graph's output tensor, overwritten by every replay."""
        if self._graph is None:
            self._graph, _ = record_cuda_graph(self.eager, warmups=3)
        self._graph.replay()


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write counted)."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = statistics.median(_cuda_ms(lambda: b.copy_(a), 5, 5))
    return 2 * a.numel() / (ms / 1e3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO_ROOT / "data" / "bench" / "step_gpu_h100.json"))
    ap.add_argument("--cache-lengths", default="128,512")
    ap.add_argument("--tokens", default="1,5")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--ways", default="engine-eager,engine-graphed,plain-graphed,compiled-graphed")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.exit(2, "step_bench: needs a CUDA GPU (the committed JSON is the H100 run)\n")
    torch.manual_seed(0)
    target, _ = load_model("smollm2-135m", device="cuda", dtype=torch.bfloat16)
    weights = sum(p.numel() * p.element_size() for p in target.parameters())
    bandwidth = copy_bandwidth()
    res = {"device": torch.cuda.get_device_name(), "dtype": "bfloat16", "date": datetime.date.today().isoformat(),
           "torch": torch.__version__, "transformers": transformers.__version__, "iters": args.iters,
           "repeats": args.repeats, "weight_bytes": weights, "copy_bandwidth_bytes_per_s": bandwidth,
           "floor_ms": weights / bandwidth * 1e3, "command": command_line("specdec_lab.step_bench", argv),
           "steps": []}
    print(f"weights {weights / 1e6:.0f} MB, copy bandwidth {bandwidth / 1e12:.2f} TB/s: floor "
          f"{res['floor_ms']:.3f} ms", flush=True)
    with torch.inference_mode():
        for cache_len in map(int, args.cache_lengths.split(",")):
            for n in map(int, args.tokens.split(",")):
                for way in args.ways.split(","):
                    entry = {"way": way, "cache_len": cache_len, "tokens": n}
                    try:
                        if way.startswith("engine"):
                            eager = engine_step(target, cache_len, n, graphs=False)
                            fn = eager if way == "engine-eager" else engine_step(target, cache_len, n, graphs=True)
                            entry["kernels"] = kernels_in(eager)
                        else:
                            step = PlainStep(target, cache_len, n, compiled=way.startswith("compiled"))
                            entry["kernels"] = kernels_in(step.eager)
                            fn = step.graph
                            fn()
                            entry["max_abs_logit_diff"] = float((step.logits.float() - step.reference).abs().max())
                        for _ in range(5):
                            fn()
                        entry.update(summary(_cuda_ms(fn, args.iters, args.repeats)))
                    except Exception as err:  # noqa: BLE001 (a way that fails is recorded, the others go on)
                        entry["error"] = f"{type(err).__name__}: {err}"[:500]
                    res["steps"].append(entry)
                    print(json.dumps(entry), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
