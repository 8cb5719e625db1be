"""Solutions to notebook 06's exercises (checked by tests/test_solutions.py)."""
from __future__ import annotations

import itertools
import math

import torch


# 1. The sparse tree by hand ---------------------------------------------------------------
def sparse_paths_by_scan(rank_accuracy: list[list[float]], budget: int) -> list[tuple[int, ...]]:
    """Medusa's greedy construction without a heap: at each step scan every child of the chosen
    nodes (and the root) and add the one whose path product is largest (ties: the first found)."""
    chosen: list[tuple[int, ...]] = []

    def product(path):
        return math.prod(rank_accuracy[d][r] for d, r in enumerate(path))
    while len(chosen) < budget:
        candidates = [p + (r,) for p in [(), *chosen] if len(p) < len(rank_accuracy)
                      for r in range(len(rank_accuracy[len(p)])) if p + (r,) not in chosen]
        if not candidates:
            break
        chosen.append(max(candidates, key=product))
    return chosen


# 2. One-hot versus drawn -------------------------------------------------------------------
def acceptance_and_output(p: torch.Tensor, children: list[tuple[int, torch.Tensor | None]]):
    """For fixed children [(token, q or None for one-hot)], the exact probability that some child
    is accepted and the distribution of the emitted token (multi-step speculative sampling)."""
    out = torch.zeros_like(p, dtype=torch.float64)
    reach, residual, accepted = 1.0, p.double().clone(), 0.0
    for token, q in children:
        ratio = float(residual[token]) if q is None else min(1.0, float(residual[token]) / float(q[token]))
        out[token] += reach * ratio
        accepted += reach * ratio
        reach *= 1 - ratio
        residual = residual.clone()
        if q is None:
            residual[token] = 0
        else:
            residual = (residual - q.double()).clamp_min(0)
        if residual.sum() <= 0:
            break
        residual = residual / residual.sum()
    if reach > 0:
        out += reach * residual
    return accepted, out


def compare_one_hot_and_drawn(p: torch.Tensor, q: torch.Tensor, k: int = 2):
    """(P(accept) with the top-k of p's ranking under q as one-hot children, the emitted
    distribution; the same averaged over k children drawn i.i.d. from q)."""
    top = torch.argsort(q, descending=True, stable=True)[:k].tolist()
    one_hot = acceptance_and_output(p, [(t, None) for t in top])
    accept, emitted = 0.0, torch.zeros_like(p, dtype=torch.float64)
    for draws in itertools.product(range(len(q)), repeat=k):
        weight = math.prod(float(q[t]) for t in draws)
        if weight == 0:
            continue
        a, o = acceptance_and_output(p, [(t, q) for t in draws])
        accept += weight * a
        emitted += weight * o
    return one_hot, (accept, emitted)


# 3. A longer residual ----------------------------------------------------------------------
def head_gap(run_log: list[dict]) -> float:
    """Head 1's minus the last head's held-out top-1 at the end of a toy run (section 2's log)."""
    last = [e for e in run_log if "heldout" in e][-1]["heldout"]["top1"]
    return last[0] - last[-1]
