"""Solutions to notebook 09's exercises (checked by tests/test_solutions.py)."""
from __future__ import annotations

import random


# 1. How sure is a category's speedup? --------------------------------------------------------
def bootstrap_speedup(records: list[dict], method: str, category: str, n: int = 1000, seed: int = 0):
    """5th and 95th percentiles of (method's tokens/s) / (ar's tokens/s) over prompts of `category`
    resampled with replacement; both methods are summed over the same resampled prompts."""
    by_prompt = {}
    for r in records:
        if r["category"] == category and r["method"] in (method, "ar"):
            by_prompt.setdefault(r["id"], {})[r["method"]] = (r["new_tokens"], r["wall_s"])
    prompts = [p for p, m in by_prompt.items() if len(m) == 2]
    if not prompts:
        raise ValueError(f"no prompt of category {category!r} has both {method!r} and 'ar'")
    rng = random.Random(seed)
    ratios = []
    for _ in range(n):
        sample = [rng.choice(prompts) for _ in prompts]
        ours = sum(by_prompt[p][method][0] for p in sample) / sum(by_prompt[p][method][1] for p in sample)
        ar = sum(by_prompt[p]["ar"][0] for p in sample) / sum(by_prompt[p]["ar"][1] for p in sample)
        ratios.append(ours / ar)
    ratios.sort()
    return ratios[int(0.05 * (n - 1))], ratios[int(0.95 * (n - 1))]


# 2. A fair HF baseline -----------------------------------------------------------------------
def loop_overhead_ms(records: list[dict], ours: str = "greedy", theirs: str = "hf-assisted") -> float:
    """Extra wall time per target call of `theirs` over `ours`, in ms, if a call's model time is equal."""
    def per_call(method):
        chosen = [r for r in records if r["method"] == method]
        return sum(r["wall_s"] for r in chosen) / sum(r["target_calls"] for r in chosen)
    return (per_call(theirs) - per_call(ours)) * 1e3


if __name__ == "__main__":
    import json
    from pathlib import Path
    bench = Path(__file__).resolve().parents[2] / "data" / "bench"
    records = json.loads((bench / "leaderboard_gpu_h100_bfloat16.json").read_text())
    for category in ("facts", "lists", "stories", "code", "instructions"):
        print(category, [round(x, 2) for x in bootstrap_speedup(records, "greedy", category)])
    for name in ("leaderboard_gpu_h100_bfloat16.json", "leaderboard_gpu_h100_bfloat16_graphed.json"):
        print(name, f"{loop_overhead_ms(json.loads((bench / name).read_text())):.2f} ms per target call")
