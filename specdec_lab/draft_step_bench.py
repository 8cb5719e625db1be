"""What one draft step costs: the EAGLE head's against the draft model's and the target's (notebook 07).

A draft step is one token through the drafter with its cache: for `draft-m` a forward of its four layers, for
the EAGLE head one entry through its single layer plus the lm_head rows of its vocabulary. All run eagerly at a
realistic cache length; the target's eager step is the unit. On a GPU the head is also timed replayed from a CUDA
graph ("eagle-head, graphed"), which is how the engine runs its steps there by default. Median of
`--repeats` after warm-up, synchronised on a GPU, every model timed side by side in one run, spread printed.

    python -m specdec_lab.draft_step_bench --device cuda --out data/bench/draft_step_h200.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from specdec_utils.core.eagle import EAGLE_NAME
from specdec_utils.step_costs import step_costs
from specdec_utils.utils import command_line, device_summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    ap.add_argument("--context", type=int, default=128, help="tokens in the caches")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--head", default=EAGLE_NAME, help="the EAGLE head (a name under data/models or a folder)")
    ap.add_argument("--draft", default="draft-m", help="the draft model to compare with")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    result = step_costs(device, getattr(torch, args.dtype), args.context, args.repeats, args.head, args.draft,
                     graphed=True)
    record = {"device": device_summary(device), "dtype": args.dtype, "context": args.context,
              "repeats": args.repeats, "steps": result,
              "command": command_line("specdec_lab.draft_step_bench", argv)}
    for name, r in result.items():
        print(f"{name:<19} median {r['median_ms']:.2f} ms (p10 {r['p10_ms']:.2f}, p90 {r['p90_ms']:.2f})")
    ratio = result["eagle-head"]["median_ms"] / result["draft-m"]["median_ms"]
    print(f"EAGLE head step / draft-m step, both eager: {ratio:.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
