"""Solutions to notebook 07's exercises (checked by tests/test_solutions.py)."""
from __future__ import annotations

import torch


# 1. Ancestors in O(log depth) steps ------------------------------------------------------------
def ancestor_mask_by_lifting(parents: torch.Tensor) -> tuple[torch.Tensor, int]:
    """mask[i, a] = True when node a is node i or one of its ancestors, by pointer doubling:
    up[j][i] is i's 2^j-th ancestor (-1 past the root). Returns (mask [T, T], doubling steps)."""
    T = len(parents)
    parents = parents.long()
    node = torch.arange(T)
    # depth by doubling as well: depth[i] = number of ancestors (the root's children have depth 1)
    up = [parents]
    while bool((up[-1] >= 0).any()) and len(up) < max(T, 1).bit_length() + 1:
        prev = up[-1]
        up.append(torch.where(prev >= 0, prev[prev.clamp_min(0)], prev))
    depth = torch.ones(T, dtype=torch.long)
    current = node.clone()
    for j in reversed(range(len(up))):  # climb as far as possible without passing the root
        nxt = torch.where(current >= 0, up[j][current.clamp_min(0)], current)
        ok = nxt >= 0
        depth += ok.long() << j
        current = torch.where(ok, nxt, current)
    diff = depth[:, None] - depth[None, :]            # levels from i up to a candidate a
    target = node[:, None].expand(T, T).clone()
    for j in range(len(up)):
        bit = ((diff >> j) & 1).bool() & (diff >= 0)
        target = torch.where(bit & (target >= 0), up[j][target.clamp_min(0)], target)
    mask = (diff >= 0) & (target == node[None, :])
    return mask, len(up)


# 2. Bytes per verification ----------------------------------------------------------------------
def kv_bytes(P: int, T: int, head_dim: int, bytes_per_value: int, heads: int, node_blocks: int) -> int:
    """Bytes of K and V read by all programs of one attention call over P + T keys: each of the
    heads x node_blocks programs (however the prefix is split among them) reads every key once.
    One per query head and 16-node block (9 x 4 = 36 key passes at T = 64), one per KV head and
    16-node block (3 x 4 = 12: the packed kernel), one per query head over all 64 nodes (9 x 1)."""
    return 2 * heads * node_blocks * (P + T) * head_dim * bytes_per_value


def mask_bytes(P: int, T: int) -> int:
    """The dense bool mask [T, P + T] the mask-free kernel never reads (one byte per entry)."""
    return T * (P + T)
