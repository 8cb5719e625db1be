"""Token trees (notebook 06): their structure, how to build and prune them, and the attention masks of a tree pass.

A tree of T candidate tokens is a `parents` array: `parents[i] < i` is the index of node i's
parent, -1 for a child of the root (the newest committed token, which no cache holds yet). One target
forward runs the uncached committed tokens and all T nodes at once: node i sits at position
L - 1 + depth(i) (L = committed tokens) and attends to the whole committed prefix, its ancestors and
itself, through a 4D attention mask (`tree_mask`, by vectorised ancestor propagation, placed after the prefix by
`tree_allowed`).
That forward is `runner.forward_tree`: row 0 of the logits it returns is the root's next-token distribution,
row 1 + i node i's.

Verification (`verify.py`) walks the tree from the root, greedy or with SpecInfer's exact
sampling; a chain is the tree whose parents are `arange(k) - 1` (`chain_parents`).

After acceptance, `kv_cache.gather_cache` moves the accepted path's keys and values into place right
after the prefix and drops the rest: no recomputation.

This module is pure structure (torch tensors in, tensors out): it runs no model and touches no cache.
"""
from __future__ import annotations

import math

import torch


# --------------------------------------------------------------------------- structure
def check_parents(parents: torch.Tensor) -> None:
    if parents.ndim != 1 or parents.dtype.is_floating_point:
        raise ValueError(f"parents must be a 1-D integer tensor, got shape {tuple(parents.shape)} {parents.dtype}")
    idx = torch.arange(len(parents), device=parents.device)
    if bool(((parents < -1) | (parents >= idx)).any()):
        raise ValueError("parents[i] must be -1 (a child of the root) or an earlier node's index (< i)")


def tree_mask(parents: torch.Tensor) -> torch.Tensor:
    """mask[i, j] = True when node j is node i or one of its ancestors: bool [T, T].
    Vectorised ancestor propagation: every node follows its parent pointer one level per step,
    so the loop runs depth(tree) times, each step over all nodes at once."""
    T = len(parents)
    idx = torch.arange(T, device=parents.device)
    mask = torch.zeros(T, T, dtype=torch.bool, device=parents.device)
    mask[idx, idx] = True
    pointer = parents.clone()
    while bool((pointer >= 0).any()):
        alive = pointer >= 0
        mask[idx[alive], pointer[alive]] = True
        pointer = torch.where(alive, parents[pointer.clamp_min(0)], pointer)
    return mask


def chain_parents(k: int) -> torch.Tensor:
    """The parents of a chain of k tokens: each node's parent is the one before it."""
    return torch.arange(k) - 1


def is_chain(parents: torch.Tensor | None) -> bool:
    """True for None (a proposal without a tree) and for parents = arange(T) - 1."""
    if parents is None:
        return True
    return bool((parents.cpu() == torch.arange(len(parents)) - 1).all())


def depths(parents: torch.Tensor) -> torch.Tensor:
    """depth[i] = 1 for children of the root, parent's depth + 1 below."""
    return tree_mask(parents).sum(-1)


# --------------------------------------------------------------------------- the masks of a tree pass
def tree_allowed(ancestry: torch.Tensor, committed: int, n_new: int = 0, fed: int = 0,
                 dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """The mask of a tree pass: which keys each query sees, bool [n_new + T - fed, committed + T], for a forward over
    a sequence of `committed` tokens then T nodes whose ancestor matrix is `ancestry` (`tree_mask(parents)` [T, T],
    on the pass's device) that feeds the last `n_new` committed tokens and the nodes from `fed` on (what came before
    is cached): causal over the committed tokens, and every node sees the whole committed prefix, its ancestors and
    itself. A floating `dtype` gives the additive form attention adds to its scores (0 where a query sees a key, the
    dtype's lowest value elsewhere)."""
    T, device = ancestry.shape[0], ancestry.device
    allow = torch.zeros(n_new + T - fed, committed + T, dtype=torch.bool, device=device)
    q_pos = torch.arange(committed - n_new, committed, device=device)
    allow[:n_new, :committed] = torch.arange(committed, device=device)[None] <= q_pos[:, None]
    allow[n_new:, :committed] = True
    allow[n_new:, committed:] = ancestry[fed:]
    if dtype == torch.bool:
        return allow
    return torch.zeros(allow.shape, dtype=dtype, device=device).masked_fill_(~allow, torch.finfo(dtype).min)


# --------------------------------------------------------------------------- building trees
def rank_tree_parents(paths: list[tuple[int, ...]]) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    """A tree template given as rank paths, e.g. [(0,), (1,), (0, 0)] (path (0, 1) = the best guess
    at depth 1, then the second best at depth 2): sorted by depth then rank, with its parents.
    Every prefix of a path must be in the template."""
    ordered = sorted(set(map(tuple, paths)), key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(ordered)}
    parents = []
    for p in ordered:
        if not p or any(r < 0 for r in p):
            raise ValueError(f"a rank path is a non-empty tuple of ranks >= 0, got {p!r}")
        if len(p) > 1 and p[:-1] not in index:
            raise ValueError(f"rank path {p!r} has no parent {p[:-1]!r} in the template")
        parents.append(index[p[:-1]] if len(p) > 1 else -1)
    return ordered, torch.tensor(parents, dtype=torch.long)


def cartesian_paths(topk: list[int]) -> list[tuple[int, ...]]:
    """Every combination: depth d has the top-k[d] guesses of head d under every node above
    (1 + k1 + k1 k2 + ... nodes)."""
    paths, level = [], [()]
    for k in topk:
        level = [p + (r,) for p in level for r in range(k)]
        paths += level
    return paths


def sparse_paths(rank_accuracy: list[list[float]], budget: int) -> list[tuple[int, ...]]:
    """Medusa's sparse tree: starting from the root, repeatedly add the node that raises the expected
    accepted length most. `rank_accuracy[d][r]` = P(head d+1's rank-r guess is the right token)
    (measured, teacher-forced); a node's gain is the product along its path (heads assumed
    independent), which never exceeds its parent's, so the greedy choice is the `budget` best paths."""
    import heapq
    chosen, heap = [], [(-rank_accuracy[0][r], (r,)) for r in range(len(rank_accuracy[0]))]
    heapq.heapify(heap)
    while heap and len(chosen) < budget:
        neg, path = heapq.heappop(heap)
        chosen.append(path)
        d = len(path)
        if d < len(rank_accuracy):
            for r in range(len(rank_accuracy[d])):
                heapq.heappush(heap, (neg * rank_accuracy[d][r], path + (r,)))
    return chosen


def expected_accept_length(paths: list[tuple[int, ...]], rank_accuracy: list[list[float]]) -> float:
    """Expected accepted tokens per round of a template under the independence model, bonus included."""
    return 1 + sum(math.prod(rank_accuracy[d][r] for d, r in enumerate(p)) for p in paths)


PRUNING = ("none", "confidence", "path", "entropy")


def prune_keep(prob: torch.Tensor, parents: torch.Tensor, entropy_frac: torch.Tensor, rule: str,
               threshold: float) -> torch.Tensor:
    """Per-round pruning (three rules): which nodes survive (bool [T]). `prob[i]`: the proposer's
    probability of node i's token; `entropy_frac[i]`: the entropy of the distribution it came from
    over log(V). A node fails when
    - confidence: prob < threshold;
    - path: the product of probs along its path < threshold;
    - entropy: prob < threshold * (1 - entropy_frac) (an unsure head is held to a lower bar).
    A failed node takes its subtree with it (a node survives only if its parent does)."""
    if rule == "none":
        return torch.ones(len(parents), dtype=torch.bool)
    if rule == "confidence":
        ok = prob >= threshold
    elif rule == "path":
        logp = torch.log(prob.clamp_min(1e-30))
        ok = (tree_mask(parents).float() @ logp) >= math.log(threshold)
    elif rule == "entropy":
        ok = prob >= threshold * (1 - entropy_frac)
    else:
        raise ValueError(f"unknown pruning {rule!r}; allowed: {', '.join(PRUNING)}")
    keep = ok.clone()
    for i, parent in enumerate(parents.tolist()):
        if parent >= 0 and not keep[parent]:
            keep[i] = False
    return keep


def subtree(nodes: torch.Tensor, parents: torch.Tensor, keep: torch.Tensor, *rows):
    """The kept nodes (a node is kept only with its parent) with parents re-indexed; `rows` (tensors
    indexed by node, or None) are filtered alike."""
    index = torch.full((len(parents),), -1, dtype=torch.long)
    index[keep] = torch.arange(int(keep.sum()))
    kept_parents = parents[keep]
    new_parents = torch.where(kept_parents >= 0, index[kept_parents.clamp_min(0)], kept_parents)
    return (nodes[keep], new_parents, *[None if r is None else r[keep.to(r.device)] for r in rows])
