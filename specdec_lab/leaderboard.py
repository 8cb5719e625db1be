"""The leaderboard (notebook 10): every method side by side, per device, dtype and mode, Spec-Bench style.

    python -m specdec_lab.leaderboard                  # render the committed results
    python -m specdec_lab.leaderboard --run --dtype bfloat16 [--cuda-graphs] [--temperature 1.0]
                                                         # measure on this machine first (the bench CLI), then render

Results are the bench CLI's JSON (`python -m specdec_lab.bench`), one file per setting, named
`data/bench/leaderboard_<device>_<dtype>[_graphed][_sampled].json`; `--run` writes one. `specdec_utils.leaderboard`
reads, checks, summarizes and plots them (the lesson uses it); this module is the command line: one markdown table per
setting with the columns of `specdec_utils.leaderboard.summarize`, and with --out-dir the table and its figure.
`hf-assisted-heuristic` is Hugging Face's default assisted generation, whose confidence threshold (0.4 at first)
transformers re-fits after every round only when scikit-learn is installed: boards measured without it ran the
threshold fixed at 0.4 (`specdec_utils.measure.run_method`). Bad input: one line on stderr, status 2.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from specdec_utils.leaderboard import BENCH_DIR, LeaderboardError, committed_files, load, plot, setting, summarize

GREEDY_METHODS = ("ar,greedy,adaptive-hf,adaptive-dual,entropy-stop,confidence-stop,adaedl,learned-stop,"
                  "hierarchical,medusa,draft-tree,eagle-chain,eagle,hf-assisted,hf-assisted-heuristic,hf-prompt-lookup")
SAMPLED_METHODS = "ar,sampling,entropy-stop,hierarchical,medusa,draft-tree,eagle-chain,eagle,hf-assisted"


# --------------------------------------------------------------------------- rendering
def markdown(runs: list[list[dict]]) -> str:
    """The leaderboard as markdown: one table per run."""
    parts = []
    for records in runs:
        rows = summarize(records)
        categories = list(rows[0]["by_category"])
        prompts = len({r["id"] for r in records})
        counts = sorted({len({r["id"] for r in records if r["category"] == c}) for c in categories})
        per_category = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        longest = max(r["new_tokens"] for r in records)
        parts.append(f"### {setting(records)}\n\n{prompts} held-out prompts, up to {longest} new tokens each; "
                     f"speedups against `ar` in the same run, with a 95% bootstrap interval over the prompts; "
                     f"a per-category column rests on {per_category} prompt(s)\n")
        head = ["method", "tokens/s", "speedup (95% interval)", "vs ar", "tau", "waste", "= ar's tokens", *categories]
        parts.append("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for row in sorted(rows, key=lambda r: -r["speedup"]):
            same = f"{row['same_as_ar'][0]}/{row['same_as_ar'][1]}" if row["same_as_ar"] else "-"
            waste = f"{row['waste']:.2f}" if row["waste"] is not None else "-"
            ci = row["speedup_ci"]
            speedup = f"**{row['speedup']:.2f}x** (baseline)" if row["method"] == "ar" else \
                f"**{row['speedup']:.2f}x** ({ci.low:.2f}-{ci.high:.2f})"
            by_category = [f"{row['by_category'][c]:.2f}x" if row["by_category"][c] is not None else "-"
                           for c in categories]
            cells = [f"`{row['method']}`", f"{row['tok_per_s']:.1f}", speedup, row["verdict"], f"{row['tau']:.2f}",
                     waste, same, *by_category]
            parts.append("| " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts)


# --------------------------------------------------------------------------- command line
def slug(text: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia_h100_80gb_hbm3': lower case, runs of other characters as one '_'."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "unknown"


def result_name(device, dtype: str, graphed: bool, sampled: bool) -> str:
    """The results file of a `--run`: `leaderboard_<machine>_<dtype>[_graphed][_sampled].json`, the machine named by
    the whole GPU name (`gpu_nvidia_h100_80gb_hbm3`) or the CPU's vector capability (`cpu_avx512`). The committed
    H100 boards predate the whole-name rule and are named `gpu_h100`."""
    import torch
    if device.type == "cuda":
        machine = "gpu_" + slug(torch.cuda.get_device_name(device))
    elif device.type == "cpu":
        machine = "cpu_" + slug(torch.backends.cpu.get_cpu_capability())
    else:
        machine = slug(device.type)
    return f"leaderboard_{machine}_{dtype}{'_graphed' if graphed else ''}{'_sampled' if sampled else ''}.json"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_lab.leaderboard",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path,
                        help="result files (default: the committed data/bench/leaderboard_*.json)")
    parser.add_argument("--run", action="store_true", help="measure on this machine first, with the bench CLI")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--cuda-graphs", action="store_true")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: the greedy board; > 0: the sampled one")
    parser.add_argument("--per-category", type=int, default=2, choices=range(1, 11), metavar="N",
                        help="held-out prompts per category for --run (default 2: 10 prompts)")
    parser.add_argument("--max-new-tokens", type=int, default=64, choices=range(1, 1025), metavar="N",
                        help="new tokens per prompt for --run (default 64)")
    parser.add_argument("--out-dir", type=Path, default=None, help="write leaderboard.md and leaderboard.png here")
    args = parser.parse_args(argv)
    try:
        files = list(args.files)
        if args.run:
            from specdec_utils.utils import get_device

            from . import bench
            device = get_device()
            sampled = args.temperature > 0
            out = BENCH_DIR / result_name(device, args.dtype, args.cuda_graphs, sampled)
            import tempfile

            from specdec_utils.prompts import eval_subset
            with tempfile.TemporaryDirectory() as folder:
                prompts = Path(folder) / "prompts.jsonl"
                prompts.write_text("".join(json.dumps(row) + "\n" for row in eval_subset(args.per_category)))
                code = bench.main(["--methods", SAMPLED_METHODS if sampled else GREEDY_METHODS, "--dtype", args.dtype,
                                   "--temperature", str(args.temperature), "--out", str(out),
                                   "--max-new-tokens", str(args.max_new_tokens), "--prompts", str(prompts),
                                   *(["--cuda-graphs"] if args.cuda_graphs else [])])
            if code:
                return code
            files.append(out)
        files = files or committed_files()
        if not files:
            raise LeaderboardError(f"no results: {BENCH_DIR} holds no leaderboard_*.json; measure with --run")
        runs = load(files)
    except LeaderboardError as err:
        print(f"leaderboard: error: {err}", file=sys.stderr)
        return 2
    text = markdown(runs)
    print(text)
    if args.out_dir is not None:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "leaderboard.md").write_text(text)
        plot(runs, args.out_dir / "leaderboard.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
