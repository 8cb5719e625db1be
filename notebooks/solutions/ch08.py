"""Solutions to notebook 08's exercises (checked by tests/test_solutions.py)."""
from __future__ import annotations

import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "data" / "bench" / "engine_gpu_h100.json"


# 1. The bound, per gamma ---------------------------------------------------------------------
def expected_tau(alpha: float, gamma: int) -> float:
    """Tokens per target pass with an i.i.d. acceptance rate alpha: 1 + alpha + ... + alpha^gamma."""
    return float(gamma + 1) if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def fit_alpha(rows: list[tuple[int, float]]) -> float:
    """The alpha (to 0.001) whose expected tau best fits measured (gamma, tau) pairs, least squares."""
    grid = [i / 1000 for i in range(1000)]
    return min(grid, key=lambda a: sum((expected_tau(a, g) - tau) ** 2 for g, tau in rows))


def predicted_tok_per_s(alpha: float, gamma: int, c_verify: float, c_draft: float, c_loop: float) -> float:
    """Tokens per second when a round costs c_verify + gamma * c_draft + c_loop milliseconds."""
    return expected_tau(alpha, gamma) / (c_verify + gamma * c_draft + c_loop) * 1e3


def graphed_draft_s_rows(bench: dict) -> dict[int, dict]:
    """The committed run's graphed greedy draft-s rows, by gamma."""
    return {row["gamma"]: row for row in bench["loop"].values()
            if row["mode"] == "graphed" and row["method"].startswith("greedy draft-s")}


def compare(bench: dict) -> list[tuple[int, float, float]]:
    """(gamma, measured tok/s, predicted tok/s): alpha fitted to all rows, c_verify and c_draft from the
    step timings, c_loop fitted on the gamma-4 row."""
    rows = graphed_draft_s_rows(bench)
    alpha = fit_alpha([(g, r["tau"]) for g, r in rows.items()])
    c_verify, c_draft = bench["step"]["target 5 tokens"]["graphed_ms"], bench["step"]["draft-s 1 token"]["graphed_ms"]
    c_loop = rows[4]["ms_per_round"] - c_verify - 4 * c_draft
    return [(g, rows[g]["tok_per_s"], predicted_tok_per_s(alpha, g, c_verify, c_draft, c_loop)) for g in sorted(rows)]


# 2. Attention over the buffer ----------------------------------------------------------------
def kv_bytes_per_step(capacity: int, layers: int, kv_heads: int, head_dim: int, bytes_per_value: int) -> int:
    """Bytes of K and V one graphed step reads: every position of the buffer, every layer."""
    return 2 * layers * kv_heads * capacity * head_dim * bytes_per_value


if __name__ == "__main__":
    bench = json.loads(BENCH.read_text())
    rows = graphed_draft_s_rows(bench)
    print("fitted alpha:", fit_alpha([(g, r["tau"]) for g, r in rows.items()]))
    for gamma, measured, predicted in compare(bench):
        print(f"gamma {gamma}: measured {measured:6.1f} tok/s, predicted {predicted:6.1f}")
    for capacity in (1024, 256):
        size = kv_bytes_per_step(capacity, 30, 3, 64, 2)
        print(f"capacity {capacity}: {size / 1e6:.1f} MB per step, {size / 3e12 * 1e6:.1f} µs at 3 TB/s")
