"""Where a device-loop round's GPU time goes: kernels per round and GPU milliseconds, on a CUDA GPU.

    python -m specdec_lab.round_profile --loops ar@round,chain5@round,tree5x3x10@round@triton --out p.json

Each loop is KIND@COMPILE[@ATTENTION]: KIND `ar`, `chainG` (the EAGLE head's chain, gamma G) or `treeDxKxN` (EAGLE's
device tree); COMPILE `round` (the whole round compiled), `steps` (each pass) or `none`; ATTENTION `sdpa` (default)
or `triton` (notebook 08's kernel). For each: `DeviceLoop.anatomy` (the recorded round and its parts, replayed back
to back between CUDA events), then one round run un-recorded under the CUDA profiler: how many kernels, their summed
GPU time and the most expensive ones. Timings depend on shapes, not on weights, so the target is a randomly
initialised Llama of SmolLM2-135M's shape (no download, no ferried weights) with the shipped EAGLE head."""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import time

import torch

from specdec_utils.utils import command_line


def smollm2_shaped(dtype=torch.bfloat16):
    """A random-weight `LlamaForCausalLM` with SmolLM2-135M-Instruct's configuration, on the GPU."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, hidden_act="silu")
    return LlamaForCausalLM(config).to("cuda", dtype).eval()


def build(spec: str, target, head, capacity: int):
    from specdec_utils.core.device_loop import DeviceLoop, DeviceTreeLoop
    parts = spec.split("@")
    if len(parts) not in (2, 3) or parts[1] not in ("round", "steps", "none"):
        raise ValueError(f"a loop is KIND@COMPILE[@ATTENTION] (e.g. tree5x3x10@round@triton), got {spec!r}")
    kind, mode, attention = (parts + ["sdpa"])[:3]
    options = dict(capacity=capacity, compile={"round": "round", "steps": True, "none": False}[mode],
                   attention=attention)
    if kind == "ar":
        return DeviceLoop(target, gamma=0, **options)
    if kind.startswith("chain") and kind[5:].isdigit():
        return DeviceLoop(target, head=head, gamma=int(kind[5:]), **options)
    if kind.startswith("tree"):
        depth, topk, nodes = (int(v) for v in kind[4:].split("x"))
        return DeviceTreeLoop(target, head, depth=depth, topk=topk, nodes=nodes, **options)
    raise ValueError(f"a loop's kind is ar, chainG or treeDxKxN, got {kind!r}")


def profile(loop, repeats: int = 300, top: int = 40) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    anatomy = loop.anatomy(repeats=repeats)
    prompt = torch.arange(8, device="cuda")
    loop._begin(prompt)
    for _ in range(3):
        loop.round_fn()
    loop._begin(prompt)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        loop.round_fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by = collections.defaultdict(lambda: [0, 0.0])
    for e in kernels:
        by[e.name[:90]][0] += 1
        by[e.name[:90]][1] += getattr(e, "device_time_total", None) or e.cuda_time_total
    ranked = sorted(by.items(), key=lambda kv: -kv[1][1])[:top]
    return {"anatomy_ms": anatomy, "kernels": len(kernels), "kernel_us": round(sum(v[1] for v in by.values()), 1),
            "top": [{"kernel": name, "calls": calls, "us": round(us, 1)} for name, (calls, us) in ranked]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loops", default="ar@round,chain5@round,tree5x3x10@round")
    ap.add_argument("--capacity", type=int, default=256)
    ap.add_argument("--eagle", default="eagle-head")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.exit(2, "round_profile: needs a CUDA GPU (it times recorded rounds and reads the CUDA profiler)\n")
    from specdec_utils.core.eagle import load_eagle
    target = smollm2_shaped()
    head = load_eagle(args.eagle, target)
    out = {"device": torch.cuda.get_device_name(), "dtype": "bfloat16", "torch": torch.__version__,
           "date": datetime.date.today().isoformat(), "capacity": args.capacity,
           "command": command_line("specdec_lab.round_profile", argv),
           "loops": {}}
    with torch.no_grad():
        for spec in args.loops.split(","):
            try:
                loop = build(spec, target, head, args.capacity)
            except ValueError as err:
                ap.exit(2, f"round_profile: {err}\n")
            t0 = time.perf_counter()
            loop.prepare()
            result = {"prepare_s": round(time.perf_counter() - t0, 1), **profile(loop)}
            out["loops"][spec] = result
            print(spec, json.dumps({k: v for k, v in result.items() if k != "top"}), flush=True)
            with open(args.out, "w") as f:  # after every loop: a run cut short keeps what it measured
                json.dump(out, f, indent=1)
            del loop
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
