"""Solutions to notebook 08's exercises (checked by tests/test_solutions.py). Run it to print the answers.

1. Ancestors in O(log depth) steps: pointer doubling needs about log2(depth) + 1 doubling steps where the walk needs
   depth steps: for trees like the benchmark's T = 256 ones (about 50 levels deep) that is 7 steps against about 50,
   and for a 256-deep chain 9 against 256. The mask equals `tree_mask` on chains, stars and random trees.
2. Bytes per verification: every program reads every key once, so the bytes scale with the number of (head, node
   block) programs. At P = 1024, T = 64 the first layout (9 query heads x 4 blocks) reads about 10.0 MB, the packed
   kernel (3 KV heads x 4 blocks) a third of that, about 3.3 MB, and one program per query head over all 64 nodes
   about 2.5 MB, but with only 9 programs, too few to fill a GPU. The dense bool mask is T x (P + T) bytes, about
   70 KB: small next to the K and V reads, so what the mask-free kernel saves is building the mask, not reading it.
   And the distinct K and V of one call (3 KV heads) are under 1 MB, well under a microsecond at 3.35 TB/s, while the
   kernels take several microseconds: at these sizes they are bound by latency and occupancy, not bandwidth.
3. Tiles in your kernel: `tiled_tree_attention` below keeps the lesson's one-tile kernel and walks the keys in tiles
   of `BLOCK_N` with the online softmax: per tile, scores, the new running maximum m', the old accumulator and sum
   rescaled by exp(m - m'), this tile's weighted values added. A row whose first tile is fully masked keeps
   m = -1e30 and adds nothing (its p is zeroed by the mask), so its rescaling factor is exp(0) = 1 until a visible
   key arrives; every row sees at least itself, so l > 0 at the end. In the interpreter it matches SDPA with the mask
   to about 1e-6 in fp32 on a 100-token prefix. What it still leaves out is what the course's kernel adds: several
   query heads per KV head in one program, the prefix split across programs, no mask over the prefix, and the parents
   walk instead of the mask.
"""
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


# 3. A kernel of your own ----------------------------------------------------------------------
from specdec_utils.core import tree_attention as ta  # noqa: E402  (without a GPU, set TRITON_INTERPRET=1 first)

if ta.AVAILABLE:
    import triton
    import triton.language as tl

    @triton.jit
    def _tiled_kernel(Q, K, V, M, O, T, N, D, scale, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, NUM_TILES: tl.constexpr):
        t = tl.arange(0, BLOCK_T)                       # query rows (tree nodes)
        d = tl.arange(0, BLOCK_D)
        t_ok, d_ok = t < T, d < D
        q = tl.load(Q + t[:, None] * D + d[None, :], mask=t_ok[:, None] & d_ok[None, :], other=0.0)
        m = tl.full([BLOCK_T], -1.0e30, tl.float32)     # running maximum
        l = tl.zeros([BLOCK_T], tl.float32)             # running sum of exp(score - m)
        acc = tl.zeros([BLOCK_T, BLOCK_D], tl.float32)  # running sum of exp(score - m) * v
        for i in tl.static_range(NUM_TILES):
            n = i * BLOCK_N + tl.arange(0, BLOCK_N)     # this tile's keys
            n_ok = n < N
            k = tl.load(K + n[:, None] * D + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            v = tl.load(V + n[:, None] * D + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            allowed = tl.load(M + t[:, None] * N + n[None, :], mask=t_ok[:, None] & n_ok[None, :], other=0) != 0
            s = tl.where(allowed, tl.dot(q, tl.trans(k), input_precision="ieee") * scale, -1.0e30)
            m_new = tl.maximum(m, tl.max(s, axis=1))
            p = tl.where(allowed, tl.exp(s - m_new[:, None]), 0.0)
            rescale = tl.exp(m - m_new)
            l = l * rescale + tl.sum(p, axis=1)
            acc = acc * rescale[:, None] + tl.dot(p, v, input_precision="ieee")
            m = m_new
        out = acc / tl.maximum(l, 1e-30)[:, None]       # (padding rows have l = 0)
        tl.store(O + t[:, None] * D + d[None, :], out, mask=t_ok[:, None] & d_ok[None, :])


def tiled_tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                         block_n: int = 16) -> torch.Tensor:
    """Masked attention for one head in one Triton program, the keys in tiles of `block_n` through the online
    softmax: q [T, D], k and v [N, D] (N = P + T keys), mask [T, N] bool, computed in fp32. Runs compiled on a GPU
    and in Triton's CPU interpreter elsewhere."""
    if not ta.AVAILABLE:
        raise RuntimeError(ta.WHY)
    T, D = q.shape
    N = k.shape[0]
    q, k, v = (x.float().contiguous() for x in (q, k, v))
    out = torch.empty_like(q)
    block = lambda x: max(16, triton.next_power_of_2(x))  # noqa: E731  tl.dot wants every side >= 16
    _tiled_kernel[(1,)](q, k, v, mask.to(device=q.device, dtype=torch.int8).contiguous(), out, T, N, D,
                        1.0 / D ** 0.5, BLOCK_T=block(T), BLOCK_N=block_n, BLOCK_D=block(D),
                        NUM_TILES=triton.cdiv(N, block_n))
    return out


def answers() -> list[str]:
    """The numbers behind the answers above, computed."""
    import random
    from specdec_utils.core.tree import depths
    rng = random.Random(0)
    medusa_like = torch.tensor([-1] + [rng.randrange(max(-1, i - 8), i) for i in range(1, 256)])
    chain = torch.arange(256) - 1
    first, packed, per_head = (kv_bytes(1024, 64, 64, 2, h, blocks) for h, blocks in ((9, 4), (3, 4), (9, 1)))
    distinct = 2 * 3 * (1024 + 64) * 64 * 2
    return [
        f"1. a T = 256 tree {int(depths(medusa_like).max())} levels deep: {ancestor_mask_by_lifting(medusa_like)[1]} doubling "
        f"steps (the walk: {int(depths(medusa_like).max())}); a 256-deep chain: {ancestor_mask_by_lifting(chain)[1]} (the walk: 256)",
        f"2. K and V bytes per call: first layout {first / 1e6:.2f} MB, packed {packed / 1e6:.2f} MB, one program per query "
        f"head over all nodes {per_head / 1e6:.2f} MB; the dense mask {mask_bytes(1024, 64) / 1e3:.1f} KB; distinct K and V "
        f"{distinct / 1e6:.2f} MB, {distinct / 3.35e12 * 1e6:.2f} us at 3.35 TB/s",
        "3. tiled_tree_attention: "
        + (f"largest |difference| from SDPA with the mask {tiled_check():.1e} (fp32, a 10-node tree on a 100-token "
           "prefix, tiles of 16 keys)"
           if ta.AVAILABLE else f"not run here: {ta.WHY}"),
    ]


def tiled_check(T: int = 10, P: int = 100, seed: int = 0) -> float:
    """Largest |tiled_tree_attention - SDPA with the mask| on a random tree, fp32."""
    import random
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    parents = torch.tensor([-1] + [rng.randrange(-1, i) for i in range(1, T)])
    mask = ta.mask_from_parents(parents, P)
    q, k, v = torch.randn(T, 64, generator=gen), torch.randn(P + T, 64, generator=gen), torch.randn(P + T, 64, generator=gen)
    if torch.cuda.is_available():  # compiled Triton reads GPU memory; the interpreter reads the CPU's
        q, k, v, mask = q.cuda(), k.cuda(), v.cuda(), mask.cuda()
    reference = ta.reference(q[None, None], k[None, None], v[None, None], mask)[0, 0]
    return (tiled_tree_attention(q, k, v, mask) - reference).abs().max().item()


if __name__ == "__main__":
    print("\n".join(answers()))
