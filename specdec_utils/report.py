"""Results rendered from measurements: the run stamp, estimates with their spread, and the words that
compare them.

A number a learner reads is printed by the code that measured it. Notebooks never type a measured value
into markdown; they pass the values to these helpers, which render the sentence or table, and choose the
comparison word ("faster", "a tie within the spread", "slower") from the numbers and their spread, so the
words cannot contradict the figures (the habit of Jupyter Book's `glue` and R Markdown's inline code).

    STAMP = report.stamp(DEVICE)                        # first output of every notebook
    ratio = report.speedup(records, "greedy")           # paired bootstrap over prompts
    rows = report.summarize(records)                    # per method: tokens/s, speedup, tau, waste, ...
    report.say(f"Greedy speculative decoding is {report.verdict(ratio)}: {ratio:x}.")
    report.show_table(rows, columns)                    # a markdown table from dicts
    report.committed("data/bench/x.json")               # a committed run, device named
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .utils import REPO_ROOT, quick_mode

# --------------------------------------------------------------------------- the stamp
CPU_KINDS = ("AVX-512 BF16", "AVX2", "other")


def cpu_info() -> dict:
    """The CPU's model name and the vector extensions that decide which dtype is fast.

    kind: 'AVX-512 BF16' (native bfloat16 dot products: bf16 is fast), 'AVX2' (bf16 emulated: fp32 is the
    sensible dtype), or 'other' (another architecture, e.g. Apple silicon)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    kind = "AVX-512 BF16" if "avx512_bf16" in flags else "AVX2" if "avx2" in flags else "other"
    return {"model": model, "cores": os.cpu_count(), "flags": shown, "kind": kind}


def git_commit() -> str:
    """The short commit the notebook runs from, '+ local changes' when tracked files other than the notebooks and
    the figures they draw (what a run of the course writes) differ from it; 'unknown' outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    try:
        head = git("rev-parse", "--short=10", "HEAD")
        if head.returncode != 0:
            return "unknown"
        changed = [line for line in git("status", "--porcelain", "--untracked-files=no").stdout.splitlines()
                   if not line[3:].startswith(("notebooks/", "figures/")) and line[3:].strip()]
        return head.stdout.strip() + (" + local changes" if changed else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass
class Stamp:
    """What a notebook's outputs were measured on; `device_name` is how figures name the device."""
    date: str
    commit: str
    device: str
    device_name: str
    cpu: dict
    gpu: str | None
    versions: dict
    mode: str
    started: float = field(default_factory=time.perf_counter)

    def lines(self) -> list[str]:
        flags = ", ".join(self.cpu["flags"]) or "none of avx2/avx512"
        out = [f"run stamp    {self.date}, commit {self.commit}",
               f"CPU          {self.cpu['model']}, {self.cpu['cores']} cores; CPU kind: {self.cpu['kind']} ({flags})",
               f"GPU          {self.gpu or 'none'}; this run computes on: {self.device}",
               "versions     " + ", ".join(f"{k} {v}" for k, v in self.versions.items()),
               f"mode         {self.mode}"]
        return out

    def elapsed_minutes(self) -> float:
        return (time.perf_counter() - self.started) / 60


_CURRENT: Stamp | None = None


def stamp(device=None, *, show: bool = True) -> Stamp:
    """Print (and return) the stamp every notebook opens with: date, commit, CPU model and kind, GPU,
    library versions, quick or full mode. Also starts the clock that `finish()` reads."""
    global _CURRENT
    import torch
    import transformers

    from .utils import get_device
    device = torch.device(device) if device is not None else get_device()
    gpu = torch.cuda.get_device_name(device if device.type == "cuda" else 0) if torch.cuda.is_available() else None
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__}
    try:
        import triton
        versions["triton"] = triton.__version__
    except ImportError:
        pass
    cpu = cpu_info()
    if device.type == "cuda":
        device_name = gpu
    else:
        device_name = f"{cpu['model']}, {cpu['cores']} cores, CPU kind {cpu['kind']}"
    quick = quick_mode()
    _CURRENT = Stamp(date=_dt.datetime.now().strftime("%Y-%m-%d %H:%M"), commit=git_commit(), device=str(device),
                     device_name=device_name, cpu=cpu, gpu=gpu, versions=versions,
                     mode="quick (SPECDEC_QUICK=1: shortened measurements)" if quick else "full")
    if device.type == "cpu":
        _CURRENT.versions["torch threads"] = torch.get_num_threads()
    if show:
        print("\n".join(_CURRENT.lines()))
    return _CURRENT


def rerun_everything() -> bool:
    """The course's one switch for long sweeps: SPECDEC_RERUN=1 re-runs them in full on this machine. Without it
    a notebook re-measures a small sample live and shows the committed full run beside it (device named)."""
    return os.environ.get("SPECDEC_RERUN", "0").lower() not in ("", "0", "false", "no")


def finish() -> None:
    """The last cell of a notebook: how long this run took since its stamp."""
    if _CURRENT is None:
        raise RuntimeError("finish() needs stamp() to have run first (the notebook's first output)")
    print(f"this notebook ran for {_CURRENT.elapsed_minutes():.1f} minutes ({_CURRENT.mode.split(' ')[0]} mode) "
          f"on {_CURRENT.device_name}")


# --------------------------------------------------------------------------- estimates with spread
@dataclass(frozen=True)
class Estimate:
    """A measured value with the interval it is known to: `low`..`high`, from `how` (repeats or bootstrap)."""
    value: float
    low: float
    high: float
    how: str = ""

    def __format__(self, spec: str) -> str:
        """f"{e:.2f}" -> '1.43 (1.38-1.49)'; f"{e:.2fx}" -> '1.43x (1.38-1.49)'; f"{e:.1f%}" -> '43.0% (...)';
        an interval with a negative end reads '-0.12 (-0.17 to -0.07)'."""
        suffix, scale = "", 1.0
        if spec.endswith("x"):
            spec, suffix = spec[:-1], "x"
        elif spec.endswith("%"):
            spec, suffix, scale = spec[:-1], "%", 100.0
        spec = spec or ".2f"
        v, lo, hi = (format(t * scale, spec) for t in (self.value, self.low, self.high))
        dash = " to " if self.low < 0 or self.high < 0 else "-"   # "-0.17 to -0.07", not "-0.17--0.07"
        return f"{v}{suffix} ({lo}{dash}{hi})"

    def __str__(self) -> str:
        return format(self, "")

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


def from_repeats(values, how: str | None = None) -> Estimate:
    """Median of repeated measurements, with their min and max as the spread."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("from_repeats needs at least one value")
    return Estimate(statistics.median(values), min(values), max(values),
                    how or f"median of {len(values)} repeats, min-max")


def resample_indices(n: int, count: int, seed: int = 0) -> np.ndarray:
    """The indices that `count` calls of `random.Random(seed).choice` on a sequence of `n` items pick, in
    order, drawn in one go: `choice` keeps the top `n.bit_length()` bits of one 32-bit Mersenne Twister
    word and draws again while they are >= n; `getrandbits(32 * m)` hands out the same words, least
    significant first. (tests/test_report.py checks it against `choice` itself.)"""
    if n < 1:
        raise ValueError("resample_indices needs at least one item")
    rng, shift = random.Random(seed), 32 - n.bit_length()
    kept, have = [], 0
    while have < count:
        words_wanted = 2 * (count - have) + 64  # each word is kept with probability > 1/2
        words = np.frombuffer(rng.getrandbits(32 * words_wanted).to_bytes(4 * words_wanted, "little"), dtype="<u4")
        candidates = (words >> shift).astype(np.int64)
        kept.append(candidates[candidates < n])
        have += len(kept[-1])
    return np.concatenate(kept)[:count]


def bootstrap(items: list, statistic, *, resamples: int = 2000, level: float = 0.95, seed: int = 0,
              vectorized=None) -> Estimate:
    """Percentile bootstrap of `statistic(sample)` over `items` (prompts, generations): resample the items
    with replacement `resamples` times; the interval holds the middle `level` of the statistic.
    `vectorized`, when given, computes the same statistic for every resample at once from a
    [resamples, len(items)] array of item indices (speedup and tau use it: thousands of resamples in
    milliseconds instead of seconds)."""
    if not items:
        raise ValueError("bootstrap needs at least one item")
    picks = resample_indices(len(items), resamples * len(items), seed).reshape(resamples, len(items))
    if vectorized is not None:
        values = np.asarray(vectorized(picks), dtype=np.float64).tolist()
    else:
        values = [statistic([items[i] for i in row]) for row in picks.tolist()]
    stats = sorted(values)
    cut = int(round((1 - level) / 2 * resamples))
    return Estimate(statistic(items), stats[cut], stats[-cut - 1],
                    f"{level:.0%} bootstrap interval over {len(items)} items")


def _pooled_ratio(pairs) -> float:
    """sum(a) / sum(b) over the pairs (a, b). Raises when sum(b) is 0: the ratio is undefined, and a NaN would sort
    anywhere among `bootstrap`'s resampled values and corrupt its interval."""
    total = sum(b for _, b in pairs)
    if total == 0:
        raise ValueError(f"a ratio of totals needs sum(b) != 0; these {len(pairs)} items have sum(b) = 0 (no rounds)")
    return sum(a for a, _ in pairs) / total


def ratio_interval(pairs: list, **kw) -> Estimate:
    """sum(a) / sum(b) over items (a, b), e.g. tokens and drafting rounds per prompt (tau), with its percentile
    bootstrap interval over the items (`bootstrap`)."""
    return bootstrap(pairs, _pooled_ratio, **kw)


def paired_difference(a: list, b: list, **kw) -> Estimate:
    """ratio(a) - ratio(b) for two measurements of the same items (pairs (tokens, rounds) per prompt, in the same
    order), bootstrapped over the items jointly: the interval of the difference, not of each side, so a shared
    hard prompt counts once (two runs on the same prompts are a paired design)."""
    if len(a) != len(b):
        raise ValueError(f"paired_difference: {len(a)} against {len(b)} items; both sides need the same items")
    return bootstrap(list(zip(a, b)), lambda r: _pooled_ratio([x for x, _ in r]) - _pooled_ratio([y for _, y in r]),
                     **kw)


def _running_total(per_item: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """Each resample's total, added left to right as Python's `sum` over the resampled records adds."""
    return np.cumsum(per_item[picks], axis=1)[:, -1]


# --------------------------------------------------------------------------- aggregating bench records
# Bench records (`python -m specdec_utils.bench`, `bench.run_benchmark`) hold one prompt and one method each.
# Every number the course reports over them is pooled here, once: totals over the records first, then the ratio
# (total tokens / total seconds, not a mean of per-prompt rates). The bench CLI's table, the leaderboard, README's
# tables and the bootstrap statistics below all call these.
def select(records: list[dict], method: str | None = None, category: str | None = None) -> list[dict]:
    """The records of `method` (every method when None), of `category` only when given."""
    return [r for r in records if method in (None, r["method"]) and category in (None, r.get("category"))]


def by_method(records: list[dict], category: str | None = None) -> dict[str, list[dict]]:
    """Each method's records (in the run's order of methods), of `category` only when given."""
    groups: dict[str, list[dict]] = {}
    for r in select(records, category=category):
        groups.setdefault(r["method"], []).append(r)
    return groups


def tokens_per_second(records: list[dict]) -> float:
    """Total new tokens / total wall seconds of these records."""
    return sum(r["new_tokens"] for r in records) / sum(r["wall_s"] for r in records)


def tokens_per_target_call(records: list[dict]) -> float | None:
    """tau: total new tokens / total target forward passes; None when a record does not count them."""
    if not all("target_calls" in r for r in records):
        return None
    return sum(r["new_tokens"] for r in records) / sum(r["target_calls"] for r in records)


def round_fit(records: list[dict]) -> tuple[float, float]:
    """Each prompt's wall time against its number of rounds (`target_calls`), fitted by least squares over the
    records: (ms per round, the slope; ms per prompt outside the rounds, the intercept: the prefill among it)."""
    xs = [r["target_calls"] for r in records]
    ys = [r["wall_s"] * 1e3 for r in records]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    if spread == 0:
        raise ValueError("round_fit needs records with different numbers of rounds")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / spread
    return slope, my - slope * mx


def _drafted_known(records: list[dict]) -> bool:
    return all(r.get("drafted", -1) >= 0 for r in records)  # -1: the method does not report it


def waste_per_token(records: list[dict]) -> float | None:
    """Rejected draft tokens per output token, sum(drafted - accepted) / sum(new tokens); None when a record
    does not say what it drafted (`drafted` -1, e.g. Hugging Face's prompt lookup). 0 for `ar`."""
    if not _drafted_known(records):
        return None
    return sum(r["drafted"] - r["accepted"] for r in records) / sum(r["new_tokens"] for r in records)


def acceptance_rate(records: list[dict]) -> float | None:
    """Accepted / drafted draft tokens; None when unknown or when nothing was drafted."""
    if not _drafted_known(records) or not sum(r["drafted"] for r in records):
        return None
    return sum(r["accepted"] for r in records) / sum(r["drafted"] for r in records)


def draft_calls_per_token(records: list[dict]) -> float | None:
    """Draft forward passes per output token; None when a record does not count them."""
    if not all("draft_calls" in r for r in records):
        return None
    return sum(r["draft_calls"] for r in records) / sum(r["new_tokens"] for r in records)


def _per_prompt(records: list[dict], method: str) -> dict:
    chosen = {}
    for r in records:
        if r["method"] == method:
            chosen.setdefault(r.get("id", len(chosen)), []).append(r)
    if not chosen:
        raise ValueError(f"no records of method {method!r}; methods present: "
                         f"{', '.join(dict.fromkeys(r['method'] for r in records))}")
    return chosen


def speedup(records: list[dict], method: str, baseline: str = "ar", *, resamples: int = 2000) -> Estimate:
    """Speedup of `method` over `baseline` measured in the same run (total tokens / total seconds of each),
    with a paired bootstrap over prompts: a prompt drawn brings both methods' records."""
    mine, base = _per_prompt(records, method), _per_prompt(records, baseline)
    prompts = [p for p in mine if p in base]
    if not prompts:
        raise ValueError(f"{method!r} and {baseline!r} share no prompt: a speedup needs both on the same prompts")

    def ratio(sample):
        return (tokens_per_second([r for p in sample for r in mine[p]])
                / tokens_per_second([r for p in sample for r in base[p]]))

    def totals(groups, key):
        return np.array([sum(r[key] for r in groups[p]) for p in prompts], dtype=np.float64)
    tokens_m, seconds_m, tokens_b, seconds_b = (totals(mine, "new_tokens"), totals(mine, "wall_s"),
                                                totals(base, "new_tokens"), totals(base, "wall_s"))

    def ratios(picks):
        return ((_running_total(tokens_m, picks) / _running_total(seconds_m, picks))
                / (_running_total(tokens_b, picks) / _running_total(seconds_b, picks)))
    return bootstrap(prompts, ratio, resamples=resamples, vectorized=ratios)


def tau(records: list[dict], method: str, *, resamples: int = 2000) -> Estimate:
    """New tokens per target forward pass (tau), bootstrapped over prompts."""
    mine = _per_prompt(records, method)

    def value(sample):
        return tokens_per_target_call([r for p in sample for r in mine[p]])
    prompts = list(mine)
    if not all("target_calls" in r for p in prompts for r in mine[p]):
        return bootstrap(prompts, value, resamples=resamples)  # None throughout: nothing to vectorize
    tokens, calls = (np.array([sum(r[key] for r in mine[p]) for p in prompts], dtype=np.float64)
                     for key in ("new_tokens", "target_calls"))

    def values(picks):
        return _running_total(tokens, picks) / _running_total(calls, picks)
    return bootstrap(prompts, value, resamples=resamples, vectorized=values)


# --------------------------------------------------------------------------- words from numbers
TIE = "a tie within the spread"


def verdict(ratio: Estimate, higher: str = "faster", lower: str = "slower", *, at: float = 1.0) -> str:
    """The word for a ratio against `at` (1.0: the baseline): `higher` when its whole interval lies above,
    `lower` when below, otherwise a tie within the spread."""
    if ratio.low > at:
        return higher
    if ratio.high < at:
        return lower
    return TIE


def rates_by_repeat(records: list[dict]) -> dict[tuple[str, int], float]:
    """Tokens per second of each (method, repeat) of a board that was run more than once (a record without a
    `repeat` counts as repeat 0)."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        groups.setdefault((r["method"], r.get("repeat", 0)), []).append(r)
    return {key: tokens_per_second(rs) for key, rs in groups.items()}


def over_repeats(records: list[dict], method: str, baseline: str,
                 rates: dict[tuple[str, int], float] | None = None) -> tuple[Estimate, Estimate]:
    """`method` over `baseline`, measured two ways on a repeated board: (the median of the repeats' ratios of tokens
    per second with their min-max, the paired bootstrap over prompts with the repeats pooled). `rates`: the board's
    `rates_by_repeat`, when the caller already has it."""
    rates = rates_by_repeat(records) if rates is None else rates
    repeats = sorted({k for m, k in rates if m == method} & {k for m, k in rates if m == baseline})
    return (from_repeats([rates[(method, k)] / rates[(baseline, k)] for k in repeats]),
            speedup(records, method, baseline))


def verdict_both(pair: tuple[Estimate, Estimate], higher: str = "faster", lower: str = "slower") -> str:
    """The word for a ratio measured both ways (`over_repeats`): `higher` / `lower` only when the repeats' min-max and
    the bootstrap interval over prompts both clear 1, otherwise a tie."""
    runs, prompts = pair
    return verdict(Estimate(runs.value, min(runs.low, prompts.low), max(runs.high, prompts.high)), higher, lower)


def compare(a: Estimate, b: Estimate, higher: str = "higher", lower: str = "lower") -> str:
    """`a` against `b`: `higher`/`lower` only when their intervals do not overlap, else a tie."""
    if a.low > b.high:
        return higher
    if a.high < b.low:
        return lower
    return TIE


def rank(estimates: dict, *, higher_is_better: bool = True) -> list[list[str]]:
    """Group names into tiers: each tier holds the best remaining name and every name tied with it
    (intervals overlapping). Differences inside the spread are ties, not ranks."""
    order = sorted(estimates, key=lambda k: estimates[k].value, reverse=higher_is_better)
    tiers = []
    while order:
        best = estimates[order[0]]
        tier = [k for k in order if compare(estimates[k], best) == TIE]
        tiers.append(tier)
        order = [k for k in order if k not in tier]
    return tiers


def ranking(estimates: dict) -> str:
    """The tiers of `rank` as text: '=' joins names tied with their tier's best; '>' only where every name of
    the upper tier is separated from every name of the lower one, '≥' where some still overlap."""
    tiers = rank(estimates)
    text = " = ".join(f"`{m}`" for m in tiers[0])
    for upper, lower in zip(tiers, tiers[1:]):
        apart = all(compare(estimates[a], estimates[b]) != TIE for a in upper for b in lower)
        text += (" > " if apart else " ≥ ") + " = ".join(f"`{m}`" for m in lower)
    return text


def summarize(records: list[dict], baseline: str = "ar", *, methods=None, intervals: bool = True) -> list[dict]:
    """One row per method (`methods`, default every method in the run's order), pooled over its records:

    - `tok_per_s`, `tau`, `acceptance`, `waste`, `draft_calls_per_token` (None where the records do not say);
    - `speedup`: tokens/s over `baseline`'s in the same run (the point value; None without a baseline);
    - `speedup_ci`: the same ratio as an `Estimate` with its paired bootstrap interval over prompts (`speedup`),
      and `verdict`, the word it earns (`verdict`); '-' and a point interval for the baseline itself.
      `intervals=False` skips the bootstrap (both None), for a quick table;
    - `by_category`: the speedup per prompt category (None where the method or the baseline has no record)."""
    groups = by_method(records)
    base = groups.get(baseline)
    categories = list(dict.fromkeys(r.get("category") for r in records))
    per_category = {c: by_method(records, c) for c in categories}
    rows = []
    for method in methods or groups:
        if method not in groups:
            raise ValueError(f"no records of method {method!r}; methods present: {', '.join(groups)}")
        mine = groups[method]
        rate = tokens_per_second(mine)
        row = {"method": method, "tok_per_s": rate, "speedup": rate / tokens_per_second(base) if base else None,
               "speedup_ci": None, "verdict": "-", "tau": tokens_per_target_call(mine),
               "acceptance": acceptance_rate(mine), "waste": waste_per_token(mine),
               "draft_calls_per_token": draft_calls_per_token(mine), "by_category": {}}
        if intervals:  # `speedup` says so when the run lacks the baseline
            if method == baseline:
                row["speedup_ci"] = Estimate(1.0, 1.0, 1.0, "baseline")
            else:
                row["speedup_ci"] = speedup(records, method, baseline)
                row["verdict"] = verdict(row["speedup_ci"])
        if base:
            row["by_category"] = {c: tokens_per_second(g[method]) / tokens_per_second(g[baseline])
                                  if method in g and baseline in g else None for c, g in per_category.items()}
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- rendering
def _in_notebook() -> bool:
    return "ipykernel" in sys.modules


def say(text: str) -> None:
    """Show a sentence (markdown) rendered from measured values: as markdown in a notebook, as text elsewhere;
    nothing for an empty one (a note that has nothing to say)."""
    if not text:
        return
    if _in_notebook():
        from IPython.display import Markdown, display
        display(Markdown(text))
    else:
        print(text)


def box(title: str, lines: list[str]) -> None:
    """A "what we measured" box: a title and bullet lines, rendered from the values."""
    say(f"> **{title}**\n>\n" + "\n".join(f"> - {line}" for line in lines))


def table(rows: list[dict], columns: dict | list | None = None) -> str:
    """A markdown table from dicts; `columns` maps a key to its header (or lists keys). Floats get 2 digits,
    Estimates their interval."""
    if not rows:
        raise ValueError("table needs at least one row")
    columns = columns or list(dict.fromkeys(k for row in rows for k in row))  # every key of any row, in order
    if not isinstance(columns, dict):
        columns = {c: c for c in columns}

    def cell(v):
        if isinstance(v, float):
            return f"{v:.2f}"
        return "-" if v is None else str(v)
    lines = ["| " + " | ".join(columns.values()) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(k)) for k in columns) + " |" for row in rows]
    return "\n".join(lines)


def show_table(rows: list[dict], columns: dict | list | None = None, caption: str | None = None) -> None:
    say((f"{caption}\n\n" if caption else "") + table(rows, columns))


# --------------------------------------------------------------------------- committed runs
def committed(path, *, show: bool = True) -> list[dict]:
    """Load a committed benchmark JSON (a list of bench records) and name where it was measured."""
    path = Path(path)
    if not path.is_absolute():
        path = REPO_ROOT / path
    try:
        records = json.loads(path.read_text())
    except FileNotFoundError:
        shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
        raise FileNotFoundError(f"no committed results at {shown}") from None
    if show:
        print(f"committed run {path.name}: {describe(records)}")
    return records


def describe(records) -> str:
    """Device, dtype, versions and date of a run's records (as far as they say)."""
    first = records[0] if isinstance(records, list) else records
    parts = [first.get("device_name", first.get("device", "device not recorded")).split(" | ")[0]]
    if "dtype" in first:
        parts.append(first["dtype"])
    if first.get("cuda_graphs"):
        parts.append("CUDA graphs")
    if "versions" in first:
        parts.append(", ".join(f"{k} {v}" for k, v in first["versions"].items()))
    if "date" in first:
        parts.append(str(first["date"]))
    return "; ".join(parts)


def speedup_rows(records: list[dict], baseline: str = "ar", methods=None) -> list[dict]:
    """One row per method: tokens/s, speedup over `baseline` with its bootstrap interval, the verdict word,
    and tau: the table every benchmark in the course reports."""
    rows = []
    for summary in summarize(records, baseline, methods=methods):
        method = summary["method"]
        row = {"method": f"`{method}`", "tokens/s": summary["tok_per_s"]}
        if method == baseline:
            row.update({"speedup": "1 (baseline)", "verdict": "-"})
        else:
            row.update({"speedup": f"{summary['speedup_ci']:.2fx}", "verdict": summary["verdict"]})
        if summary["tau"] is not None and method != baseline:
            row["tau"] = f"{tau(records, method):.2f}"
        rows.append(row)
    return rows
