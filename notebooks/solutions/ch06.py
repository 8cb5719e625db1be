"""Solutions to notebook 06's exercises (checked by tests/test_solutions.py).

Each exercise has code and, in `ANSWERS`, its answer in words; `python notebooks/solutions/ch06.py` prints the
answers with the numbers the code computes (for exercise 3, from the committed training log of the shipped heads:
your own toy run in the lab notebook gives its own numbers, so they are computed, not typed here).
"""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import torch

ANSWERS = {
    1: "The 4-node sparse tree for a = [[5, 2], [3, 1]] / 10 is the paths (0,), (1,), (0, 0), (1, 0): head 1's two "
       "guesses, then head 2's best guess under each of them (path products 0.5, 0.2, 0.15, 0.06 beat (0, 1) at "
       "0.05). Its expected accepted length is 1 + 0.5 + 0.2 + 0.15 + 0.06 = 1.91 tokens per round (bonus "
       "included). Because a child's product never exceeds its parent's, scanning every child of the chosen nodes "
       "picks the same paths as the heap, so `sparse_paths_by_scan` and `tree.sparse_paths` give the same expected "
       "length at every budget (ties may order equal-product paths differently).",
    2: "(a) One-hot children (q's top-2: tokens 1 then 0) are accepted with probability p(1) + p(0) = 0.8: the walk "
       "asks 'is it token 1?' (probability 0.3), and if not, 'is it token 0?' under the residual. (b) Two children "
       "drawn i.i.d. from q are accepted less often (`compare_one_hot_and_drawn` computes it exactly: "
       "0.76): a draw can repeat a token, and min(1, p/q) is below 1 where q overrates a token. Both emit exactly p: "
       "the residual after each rejection makes every step an exact rejection sample.",
    3: "A guess further ahead is harder: head k must skip k tokens it cannot see, so its held-out top-1 falls with "
       "k. The shipped heads' committed log shows the fall at full scale (printed by this script: head 1 against "
       "head 3; section 1's table shows it on this machine's sample). In the lab notebook's 3-head toy run, look at "
       "`head_gap(run_log)` (head 1's top-1 minus the last head's) at the end. The loss is large: a tree gains little from depth 3 and beyond, which is why the sparse tree "
       "spends few nodes there.",
}


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


# 3. Further ahead --------------------------------------------------------------------------
def head_gap(run_log: list[dict]) -> float:
    """Head 1's minus the last head's held-out top-1 at the end of a toy run (the lab notebook's section 2 log)."""
    last = [e for e in run_log if "heldout" in e][-1]["heldout"]["top1"]
    return last[0] - last[-1]


def committed_head_fall(path: Path | None = None) -> list[float]:
    """Held-out top-1 of each shipped head after training (the committed log, all held-out prompts)."""
    path = path or Path(__file__).resolve().parents[2] / "data" / "models" / "medusa-heads" / "training_log.json"
    return json.loads(path.read_text())["eval"]["top1"]


if __name__ == "__main__":
    from specdec_utils.core import tree as trees
    acc = [[0.5, 0.2], [0.3, 0.1]]
    paths = sparse_paths_by_scan(acc, 4)
    print(f"1. sparse tree {paths}, expected accepted length {trees.expected_accept_length(paths, acc):.2f}")
    print("  ", ANSWERS[1])
    (one_hot, one_hot_out), (drawn, drawn_out) = compare_one_hot_and_drawn(torch.tensor([0.5, 0.3, 0.2]),
                                                                           torch.tensor([0.2, 0.6, 0.2]))
    print(f"2. P(some child accepted): one-hot {one_hot:.3f}, drawn {drawn:.3f}; emitted one-hot "
          f"{one_hot_out.tolist()}, drawn {[round(x, 6) for x in drawn_out.tolist()]}")
    print("  ", ANSWERS[2])
    top1 = committed_head_fall()
    print(f"3. committed heads, held-out top-1: head 1 {top1[0]:.3f}, head 3 {top1[2]:.3f} "
          f"(head 3 keeps {top1[2] / top1[0]:.0%} of head 1's)")
    print("  ", ANSWERS[3])
