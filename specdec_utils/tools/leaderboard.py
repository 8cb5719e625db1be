"""The leaderboard (notebook 10): every method side by side, per device, dtype and mode, Spec-Bench style.

    python -m specdec_utils.tools.leaderboard                  # render the committed results
    python -m specdec_utils.tools.leaderboard --run --dtype bfloat16 [--cuda-graphs] [--temperature 1.0]
                                                         # measure on this machine first (the bench CLI), then render

Results are the bench CLI's JSON (`python -m specdec_utils.bench`), one file per setting, named
`data/bench/leaderboard_<device>_<dtype>[_graphed][_sampled].json`; every record carries the device,
dtype, library versions and date. Per setting the table gives tokens/s, the speedup over `ar` measured in
the same run with its 95% bootstrap interval over prompts and the verdict word against `ar` ("faster",
"slower" or "a tie within the spread", chosen from the interval, never typed), tau (new tokens per target
pass), waste (rejected draft tokens per output token), how
many prompts' greedy output equals `ar`'s (bf16 flips near-ties; float32 must match), and the speedup per
prompt category. The numbers come from `report.summarize`, the aggregation the bench CLI's table uses too.
`hf-assisted-heuristic` is Hugging Face's default assisted generation, whose confidence threshold (0.4 at first)
transformers re-fits after every round only when scikit-learn is installed: it is in requirements.txt now, and
boards measured without it ran the threshold fixed at 0.4 (`bench.run_method`). Bad input: one line on stderr,
status 2.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .. import report
from ..utils import REPO_ROOT

BENCH_DIR = REPO_ROOT / "data" / "bench"
GREEDY_METHODS = ("ar,greedy,adaptive-hf,adaptive-dual,entropy-stop,confidence-stop,adaedl,learned-stop,"
                  "hierarchical,medusa,draft-tree,eagle-chain,eagle,hf-assisted,hf-assisted-heuristic,hf-prompt-lookup")
SAMPLED_METHODS = "ar,sampling,entropy-stop,hierarchical,medusa,draft-tree,eagle-chain,eagle,hf-assisted"
REQUIRED = ("method", "category", "new_tokens", "wall_s", "target_calls", "new_token_ids", "dtype", "device_name",
            "versions", "date")


class LeaderboardError(ValueError):
    """Bad input: printed as one line by `main`."""


# --------------------------------------------------------------------------- reading
def load(paths) -> list[list[dict]]:
    """Read result files (each a bench JSON list of records); check that each has what the table needs."""
    runs = []
    for path in map(Path, paths):
        try:
            records = json.loads(path.read_text())
        except FileNotFoundError:
            raise LeaderboardError(f"no such results file: {path}") from None
        except json.JSONDecodeError as err:
            raise LeaderboardError(f"{path} is not JSON ({err.msg} at line {err.lineno})") from None
        if not isinstance(records, list) or not records or not all(isinstance(r, dict) for r in records):
            raise LeaderboardError(f"{path} must hold a non-empty list of bench records "
                                   f"(python -m specdec_utils.bench --out)")
        missing = [key for key in REQUIRED if key not in records[0]]
        if missing:
            raise LeaderboardError(f"{path} lacks {', '.join(missing)}: re-run it with the current bench CLI")
        if "ar" not in {r["method"] for r in records}:
            raise LeaderboardError(f"{path} has no `ar` records: a speedup needs the target alone in the same run")
        runs.append(records)
    return runs


def committed_files(directory: Path = BENCH_DIR) -> list[Path]:
    return sorted(directory.glob("leaderboard_*.json"))


# --------------------------------------------------------------------------- numbers
def setting(records: list[dict]) -> str:
    """What a run measured: device, dtype, eager or graphed, greedy or sampled; versions and date."""
    first = records[0]
    device = first["device_name"].split(" | ")[0]
    mode = "CUDA graphs" if first.get("cuda_graphs") else "eager"
    temperatures = {r.get("temperature", 0.0) for r in records if r["method"] != "greedy"}
    sampling = "greedy" if temperatures <= {0.0} else f"sampled at T = {max(temperatures)}"
    versions = ", ".join(f"{k} {v}" for k, v in first["versions"].items())
    return f"{device}, {first['dtype']}, {mode}, {sampling} ({versions}; {first['date']})"


def summarize(records: list[dict]) -> list[dict]:
    """One row per method, in the run's order: `report.summarize` against `ar` (tokens/s, the point `speedup`,
    `speedup_ci` with its paired bootstrap interval over prompts, `verdict`, `tau`, `waste`, `by_category`), plus
    `same_as_ar`: (prompts whose output equals `ar`'s, prompts) when both decode greedily, else None."""
    ar_tokens = {r["id"]: r["new_token_ids"] for r in records if r["method"] == "ar"}
    greedy_ar = all(r.get("temperature", 0.0) == 0 for r in records if r["method"] == "ar")
    rows = report.summarize(records, "ar")
    for row in rows:
        chosen = report.select(records, row["method"])
        greedy = all(r.get("temperature", 0.0) == 0 for r in chosen)
        row["same_as_ar"] = (sum(r["new_token_ids"] == ar_tokens.get(r["id"]) for r in chosen), len(chosen)) \
            if greedy and greedy_ar else None
    return rows


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


def plot(runs: list[list[dict]], path: Path | None = None):
    """Speedup over `ar` per method with its bootstrap interval, one panel per run; saved to `path` when given.
    Returns the figure."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.6 * len(runs)), squeeze=False, layout="constrained")
    for ax, records in zip(axes[:, 0], runs):
        rows = sorted(summarize(records), key=lambda r: -r["speedup"])
        colors = ["tab:grey" if r["method"] == "ar" else "tab:orange" if r["method"].startswith("hf-") else "tab:blue"
                  for r in rows]
        low = [max(0.0, r["speedup"] - r["speedup_ci"].low) for r in rows]
        high = [max(0.0, r["speedup_ci"].high - r["speedup"]) for r in rows]
        bars = ax.bar([r["method"] for r in rows], [r["speedup"] for r in rows], color=colors,
                      yerr=[low, high], capsize=2, error_kw={"lw": 0.8})
        ax.bar_label(bars, fmt="%.2f", fontsize=6, label_type="center", color="white")  # error bars sit on top
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_ylabel("speedup over ar\n(95% interval)")
        ax.set_title(setting(records), fontsize=8)
        ax.tick_params(axis="x", labelrotation=40, labelsize=7)
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


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
    parser = argparse.ArgumentParser(prog="python -m specdec_utils.tools.leaderboard",
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
            from ..utils import get_device
            from . import bench
            device = get_device()
            sampled = args.temperature > 0
            out = BENCH_DIR / result_name(device, args.dtype, args.cuda_graphs, sampled)
            import tempfile

            from ..prompts import eval_subset
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
