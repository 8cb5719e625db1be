"""Read, summarize and plot leaderboard boards (notebook 10): every method side by side, per device, dtype and mode,
Spec-Bench style.

A board is a bench JSON file, one per setting, named `data/bench/leaderboard_<device>_<dtype>[_graphed][_sampled].json`;
every record carries the device, dtype, library versions and date. `load` reads boards and checks that each has what
the table needs (`REQUIRED`, and `ar` records to measure speedups against); `setting` names what a board measured;
`summarize` gives one row per method: tokens/s, the speedup over `ar` measured in the same run with its 95% bootstrap
interval over prompts and the verdict word against `ar` ("faster", "slower" or "a tie within the spread", chosen from
the interval, never typed), tau (new tokens per target pass), waste (rejected draft tokens per output token), how many
prompts' greedy output equals `ar`'s (bf16 flips near-ties; float32 must match), and the speedup per prompt category.
The numbers come from `report.summarize`, the aggregation the bench CLI's table uses too. `plot` draws the speedups
with their intervals.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import report
from .utils import REPO_ROOT

BENCH_DIR = REPO_ROOT / "data" / "bench"
REQUIRED = ("method", "category", "new_tokens", "wall_s", "target_calls", "new_token_ids", "dtype", "device_name",
            "versions", "date")


class LeaderboardError(ValueError):
    """Bad input: a missing or malformed results file; the message is one line."""


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
                                   f"(python -m specdec_lab.bench --out)")
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


# --------------------------------------------------------------------------- plotting
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
