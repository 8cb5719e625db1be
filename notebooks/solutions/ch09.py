"""Solutions to notebook 09's exercises (checked by tests/test_solutions.py). Run it to print the answers.

1. The bound, per gamma: the fitted alpha (about 0.66 on the committed graphed draft-s rows) with the step timings
   predicts tokens per second within a few percent for gamma 2 to 5, and too low for gamma 6, where the run measured
   its fastest result. The model goes wrong because acceptance is not i.i.d.: tokens come in easy and hard stretches,
   so long drafts are fully accepted more often than alpha^gamma says; and a round's costs are not the isolated step
   timings (the verification of k + 1 tokens and the host's work vary with k). The gamma-6 row is also one run on five
   prompts: its spread (notebook 09's lab page prints its interval) is wide enough to hold the prediction.
2. Attention over the buffer: at capacity 1024 a graphed step reads about 23.6 MB of K and V over 30 layers, about
   0.79 MB per layer, a quarter of a microsecond at 3.35 TB/s, against about 52 microseconds per attention call in the
   first profile (its attention kernels' GPU time over their calls). Bandwidth is not the bound: with one query token
   and 9 heads the attention kernel launches too few blocks to fill the GPU's SMs, and each block walks the whole
   buffer serially, so latency and occupancy bound it. Splitting the keys across programs (notebook 08's prefix split,
   flash-decoding) is one answer; a smaller buffer, as the fix did, another.
"""
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


def attention_call_us(run: dict) -> float:
    """Mean GPU time per attention-kernel call in a run's graphed profile, in microseconds."""
    rows = [r for r in run["profile"]["graphed"]["top_device_ops"] if "fmha" in r["op"] or "attention" in r["op"].lower()]
    return sum(r["self_device_ms"] for r in rows) / sum(r["count"] for r in rows) * 1e3


def answers() -> list[str]:
    """The numbers behind the answers above, computed from the committed runs."""
    bench = json.loads(BENCH.read_text())
    first = json.loads((BENCH.parent / "engine_gpu_h100_capacity1024.json").read_text())
    rows = graphed_draft_s_rows(bench)
    out = [f"1. fitted alpha {fit_alpha([(g, r['tau']) for g, r in rows.items()]):.2f}; "
           + "; ".join(f"gamma {g}: measured {m:.0f}, predicted {p:.0f} tok/s ({p / m - 1:+.0%})" for g, m, p in compare(bench))]
    per_layer = kv_bytes_per_step(1024, 30, 3, 64, 2) / 30
    out.append(f"2. capacity 1024: {kv_bytes_per_step(1024, 30, 3, 64, 2) / 1e6:.1f} MB per step, {per_layer / 1e6:.2f} MB "
               f"per layer = {per_layer / 3.35e12 * 1e6:.2f} us at 3.35 TB/s, against {attention_call_us(first):.0f} us per "
               f"attention call in the first profile; capacity 256: {kv_bytes_per_step(256, 30, 3, 64, 2) / 1e6:.1f} MB per step")
    return out


if __name__ == "__main__":
    print("\n".join(answers()))
