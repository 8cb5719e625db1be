"""Tree attention in Triton (notebook 08): the attention of a tree-verification pass, prefix + tree.

The T tree nodes of a verification pass (`runner.forward_tree`) attend to the P cached prefix
positions and to their own ancestors and themselves. Two kernels compute it, with one API:

- `tree_attention_masked(q, k, v, mask, scale=None)` reads a dense boolean mask [T, P + T];
- `tree_attention(q, k, v, parents, scale=None)` reads only the `parents` array [T] and builds the
  tree tile's allowed matrix by walking every query's ancestor chain in registers (parents[i] < i),
  one level per step for all rows at once: no mask is built or read, any depth works, and no 64-bit
  ancestor bitmask caps the tree at 64 nodes (the tree is one register tile: up to 256 nodes).

q: [B, H, T, D]; k, v: [B, H_kv, P + T, D] (prefix, then the nodes in q's order); H a multiple of
H_kv (grouped-query attention); fp32, fp16 or bf16; returns [B, H, T, D]. One program handles the
query heads that share a KV head, for a block of nodes and a slice of the prefix (flash-decoding);
the prefix tiles run FlashAttention's online softmax with no mask at all, and a second small
kernel merges the slices. `reference` (SDPA with the boolean mask) is the oracle; `tiled_reference`
is the same algorithm in PyTorch, for reading. Importing this module registers the kernels as
transformers attention backends for tree passes (`register`; `use_backend` switches a model to one).
Without triton (macOS has no wheels) the module still imports; `AVAILABLE` is False and `WHY` says
why. Without a GPU the kernels run in Triton's CPU interpreter (slow: tests and toy sizes, which is
how CI tests them). Triton decides when it is first
imported (and transformers imports it with its model classes), so `TRITON_INTERPRET=1` must be in the
environment before that: every notebook's first cell and the tests' conftest set it; if it was not,
`WHY` says so in one line.
"""
from __future__ import annotations

import math
import os

import torch

from ..compat import attn_implementation, register_attention, sdpa_attention
from .tree import tree_allowed, tree_mask

try:
    import triton
    import triton.language as tl
    AVAILABLE, WHY = True, ""
except Exception as err:  # ImportError on macOS, or a broken install
    triton = tl = None
    AVAILABLE = False
    WHY = (f"triton is not available here ({type(err).__name__}: {err}); the kernels need it (Linux wheels on "
           f"PyPI); the notebook shows the committed GPU results instead")
if AVAILABLE and not torch.cuda.is_available():
    from triton.runtime.interpreter import InterpretedFunction
    if not isinstance(tl.max, InterpretedFunction):  # Triton's own library was built for a GPU: too late to switch
        AVAILABLE = False
        WHY = ("no GPU here, and Triton was imported before TRITON_INTERPRET=1 was set (for its CPU interpreter): "
               "restart Python and set it before importing specdec_utils (every notebook's first cell does)")


INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
# `tl.gather` (Triton 3.2 on) walks a node's ancestors between registers; an older Triton (or one built without it)
# takes the fallback, a load per step: the same answer, slower on deep trees
HAS_GATHER = AVAILABLE and hasattr(tl, "gather")


# --------------------------------------------------------------------------- the oracle
def mask_from_parents(parents: torch.Tensor, prefix: int) -> torch.Tensor:
    """bool [T, prefix + T]: the whole prefix, the node's ancestors and itself (`tree.tree_allowed`)."""
    return tree_allowed(tree_mask(parents), prefix)


def reference(q, k, v, mask, scale=None) -> torch.Tensor:
    """SDPA with the boolean mask (True = may attend), GQA by repeating the KV heads; fp32 inside."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask.to(q.device), scale=scale)
    return out.to(q.dtype)


def ancestor_walk(parents: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The parents walk of the mask-free kernel: every query row starts at its own node and follows
    its parent pointer one level per step, all rows at once, marking the keys it lands on, until
    every row has passed the root (-1). Returns (allowed bool [T, T], steps taken = the depth)."""
    parents = parents.long()
    node = torch.arange(len(parents), device=parents.device)
    current = node.clone()
    allowed = node[None, :] == current[:, None]
    steps = 0
    while bool((current >= 0).any()):
        current = torch.where(current >= 0, parents[current.clamp_min(0)], current)
        allowed |= (node[None, :] == current[:, None]) & (current[:, None] >= 0)
        steps += 1
    return allowed, steps


def tiled_reference(q, k, v, parents, block_n: int = 64, scale=None) -> torch.Tensor:
    """The kernels' algorithm in PyTorch, one query head at a time, for reading (and tested like them):
    FlashAttention's online softmax over key tiles of `block_n` (running max m, running sum l, an
    accumulator rescaled by exp(m_old - m_new) whenever the max grows), the prefix tiles with no
    mask, then the tree as one tile whose allowed matrix comes from walking the parents: every
    query row follows its parent pointer one level per step until all rows reach the root."""
    B, H, T, D = q.shape
    P = k.shape[2] - T
    group = H // k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.empty(B, H, T, D, dtype=torch.float32, device=q.device)
    allowed_tree, _ = ancestor_walk(parents.to(q.device))  # the kernel builds it in registers
    for b in range(B):
        for h in range(H):
            qh, kh, vh = q[b, h].float(), k[b, h // group].float(), v[b, h // group].float()
            m = torch.full((T,), -math.inf, device=q.device)
            l = torch.zeros(T, device=q.device)
            acc = torch.zeros(T, D, device=q.device)
            tiles = [(start, min(start + block_n, P), None) for start in range(0, P, block_n)]
            tiles.append((P, P + T, allowed_tree))
            for start, stop, allowed in tiles:
                s = qh @ kh[start:stop].T * scale                     # scores of this tile [T, n]
                if allowed is not None:
                    s = s.masked_fill(~allowed, -math.inf)
                m_new = torch.maximum(m, s.max(dim=1).values)
                p = torch.exp(s - m_new[:, None])
                alpha = torch.exp(m - m_new)                           # rescale what came before
                l = l * alpha + p.sum(dim=1)
                acc = acc * alpha[:, None] + p @ vh[start:stop]
                m = m_new
            out[b, h] = acc / l[:, None]
    return out.to(q.dtype)


def _check(q, k, v, T_expected=None):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be 4-D [B, H, T, D] / [B, H_kv, P + T, D], got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    B, H, T, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or k.shape[2] < T:
        raise ValueError(f"k and v must be [B, H_kv, P + T, D] with B, D as q's and P >= 0, got {tuple(k.shape)} "
                         f"and {tuple(v.shape)} for q {tuple(q.shape)}")
    if H % k.shape[1]:
        raise ValueError(f"the query heads ({H}) must be a multiple of the KV heads ({k.shape[1]})")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype among float32, float16, bfloat16; got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}")
    if D > 256:
        raise ValueError(f"head_dim must be <= 256, got {D}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    if not AVAILABLE:
        raise RuntimeError(WHY)
    return B, H, T, D, k.shape[2] - T



if AVAILABLE:
    @triton.jit
    def _key_tile(q, m_i, l_i, acc, k_base, v_base, offs_n, n_ok, allowed, offs_d, d_ok, s_kn, s_kd, s_vn, s_vd,
                  qk_scale, PRECISION: tl.constexpr):
        """One tile of keys through the online softmax (FlashAttention): scores, running max,
        rescale what was accumulated, add this tile's weighted values. `allowed` [rows, keys]."""
        k = tl.load(k_base + offs_n[None, :] * s_kn + offs_d[:, None] * s_kd,
                    mask=n_ok[None, :] & d_ok[:, None], other=0.0)
        s = tl.dot(q, k, input_precision=PRECISION) * qk_scale          # log2 domain: exp2 below
        s = tl.where(allowed, s, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        p = tl.where(allowed, p, 0.0)
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + offs_n[:, None] * s_vn + offs_d[None, :] * s_vd,
                    mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        return m_new, l_i, acc

    @triton.jit
    def _tree_attention_kernel(Q, K, V, O, Mask, Parents, Part, PartM, PartL, Start,
                               s_qb, s_qh, s_qt, s_qd, s_kb, s_kh, s_kn, s_kd,
                               s_vb, s_vh, s_vn, s_vd, s_ob, s_oh, s_ot, s_od, s_mt, s_mn,
                               B, H, H_KV, T, P, D, chunk, qk_scale,
                               GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, NODES: tl.constexpr,
                               USE_MASK: tl.constexpr, SPLIT: tl.constexpr, LOOP_FOR: tl.constexpr,
                               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
                               PRECISION: tl.constexpr, GATHER: tl.constexpr, DYNAMIC_P: tl.constexpr):
        # program (node block, batch x KV head, prefix split). Its rows are the GROUP query heads
        # that share this KV head, times NODES tree nodes: K and V are loaded once for all of them.
        pid_m = tl.program_id(0)
        pid_bk = tl.program_id(1)
        pid_s = tl.program_id(2)
        last_split = tl.num_programs(2) - 1
        mask_col = P  # the mask's first tree column: [T, P + T] holds the prefix's columns too
        if DYNAMIC_P:  # the prefix length read on the device (a CUDA graph replays with a new one every round);
            P = tl.load(Start)  # the nodes' keys sit at P .. P+T-1 of a longer buffer, the mask is [T, T]
            chunk = tl.cdiv(tl.cdiv(tl.maximum(P, 1), tl.num_programs(2)), BLOCK_N) * BLOCK_N
            mask_col = 0
        b = pid_bk // H_KV
        hk = pid_bk % H_KV
        r = tl.arange(0, GROUP_PAD * NODES)
        g = r // NODES
        node_q = pid_m * NODES + r % NODES
        row_ok = (g < GROUP) & (node_q < T)
        h = hk * GROUP + tl.where(g < GROUP, g, 0)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        q = tl.load(Q + b * s_qb + h[:, None] * s_qh + node_q[:, None] * s_qt + offs_d[None, :] * s_qd,
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        m_i = tl.full([GROUP_PAD * NODES], -1.0e30, tl.float32)
        l_i = tl.zeros([GROUP_PAD * NODES], tl.float32)
        acc = tl.zeros([GROUP_PAD * NODES, BLOCK_D], tl.float32)
        k_base = K + b * s_kb + hk * s_kh
        v_base = V + b * s_vb + hk * s_vh
        # 1. this split's slice of the prefix: every node sees all of it, so no mask is read
        lo = pid_s * chunk
        hi = tl.minimum(lo + chunk, P)
        if LOOP_FOR:  # compiled: a for loop, which Triton software-pipelines (loads of tile n+1 overlap tile n)
            for start_n in range(lo, hi, BLOCK_N):
                offs_n = start_n + tl.arange(0, BLOCK_N)
                n_ok = offs_n < hi
                m_i, l_i, acc = _key_tile(q, m_i, l_i, acc, k_base, v_base, offs_n, n_ok, n_ok[None, :], offs_d,
                                          d_ok, s_kn, s_kd, s_vn, s_vd, qk_scale, PRECISION)
        else:  # the CPU interpreter cannot run range() over a runtime bound
            start_n = lo
            while start_n < hi:
                offs_n = start_n + tl.arange(0, BLOCK_N)
                n_ok = offs_n < hi
                m_i, l_i, acc = _key_tile(q, m_i, l_i, acc, k_base, v_base, offs_n, n_ok, n_ok[None, :], offs_d,
                                          d_ok, s_kn, s_kd, s_vn, s_vd, qk_scale, PRECISION)
                start_n += BLOCK_N
        # 2. the tree (last split only): all T nodes as ONE tile of BLOCK_T keys (T <= 256)
        if pid_s == last_split:
            node = tl.arange(0, BLOCK_T)
            n_ok = node < T
            if USE_MASK:
                allowed = tl.load(Mask + node_q[:, None] * s_mt + (mask_col + node)[None, :] * s_mn,
                                  mask=row_ok[:, None] & n_ok[None, :], other=0) != 0
            else:
                # walk every row's ancestor chain in registers, one level per step for all rows at
                # once: depth(tree) steps, any depth, and no bitmask to cap the tree's size
                # (the parents array is loaded once; each step is a gather between registers)
                par = tl.load(Parents + node, mask=n_ok, other=-1)
                cur = tl.where(row_ok, node_q, -1)
                allowed = node[None, :] == cur[:, None]
                while tl.max(cur, axis=0) >= 0:
                    if GATHER:
                        nxt = tl.gather(par, tl.minimum(tl.maximum(cur, 0), BLOCK_T - 1), 0)
                    else:  # each step a load (from L1): the chain's latency adds up over deep trees
                        nxt = tl.load(Parents + tl.maximum(cur, 0), mask=cur >= 0, other=-1)
                    # parents point backwards (parents[i] < i): a pointer that does not ends the walk,
                    # so unchecked parents on the GPU (a cycle) cannot hang it: at most T steps
                    cur = tl.where((cur >= 0) & (nxt < cur), nxt, -1)
                    allowed = allowed | ((node[None, :] == cur[:, None]) & (cur[:, None] >= 0))
            allowed = allowed & n_ok[None, :] & row_ok[:, None]
            m_i, l_i, acc = _key_tile(q, m_i, l_i, acc, k_base, v_base, P + node, n_ok, allowed, offs_d, d_ok,
                                      s_kn, s_kd, s_vn, s_vd, qk_scale, PRECISION)
        if SPLIT:  # partial results (unnormalised), merged by _combine_kernel
            row = ((pid_s * B + b) * H + h) * T + node_q
            tl.store(Part + row[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])
            tl.store(PartM + row, m_i, mask=row_ok)
            tl.store(PartL + row, l_i, mask=row_ok)
        else:
            out = acc / tl.maximum(l_i, 1e-30)[:, None]
            tl.store(O + b * s_ob + h[:, None] * s_oh + node_q[:, None] * s_ot + offs_d[None, :] * s_od,
                     out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])

    @triton.jit
    def _combine_kernel(Part, PartM, PartL, O, s_ob, s_oh, s_ot, s_od, BHT, H, T, D, n_split,
                        SPLIT_PAD: tl.constexpr, BLOCK_D: tl.constexpr):
        # one (batch, head, node) row: merge the splits' softmax pieces (flash-decoding's reduction)
        row = tl.program_id(0)
        b = row // (H * T)
        h = (row // T) % H
        t = row % T
        sp = tl.arange(0, SPLIT_PAD)
        sp_ok = sp < n_split
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        m = tl.load(PartM + sp * BHT + row, mask=sp_ok, other=-1.0e30)
        l = tl.load(PartL + sp * BHT + row, mask=sp_ok, other=0.0)
        m_max = tl.max(m, axis=0)
        w = tl.where(sp_ok, tl.exp2(m - m_max), 0.0)
        part = tl.load(Part + (sp * BHT + row)[:, None] * D + offs_d[None, :], mask=sp_ok[:, None] & d_ok[None, :],
                       other=0.0)
        out = tl.sum(part * w[:, None], axis=0) / tl.maximum(tl.sum(l * w, axis=0), 1e-30)
        tl.store(O + b * s_ob + h * s_oh + t * s_ot + offs_d * s_od, out.to(O.dtype.element_ty), mask=d_ok)


MAX_NODES = 256  # the tree part is one tile of next_power_of_2(T) keys held in registers
_SMS: dict = {}


def _programs_wanted(device) -> int:
    """About two waves of programs on this GPU (1 under the interpreter: splitting is for parallelism)."""
    if device.type != "cuda":
        return 1
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return 2 * _SMS[device]


def _launch(q, k, v, mask, parents, scale, use_mask: bool, *, nodes: int | None = None, block_n: int = 64,
            splits: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
            gather: bool | None = None, start: torch.Tensor | None = None):
    B, H, T, D, P = _check(q, k, v)  # with `start`: P is only the most the prefix can hold
    gather = HAS_GATHER if gather is None else gather
    if T > MAX_NODES:
        raise ValueError(f"trees of at most {MAX_NODES} nodes, got {T}")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if T == 0:
        return torch.empty_like(q)
    bf16_in_interpreter = INTERPRET and q.dtype == torch.bfloat16
    if bf16_in_interpreter:  # numpy has no bfloat16: the interpreter computes in fp32, rounds the result
        q, k, v = q.float(), k.float(), v.float()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    H_kv = k.shape[1]
    group = H // H_kv
    group_pad = triton.next_power_of_2(group)
    if nodes is None:  # rows = group_pad x nodes: 64 rows, at least 16 (tl.dot's minimum), no more nodes than T
        nodes = max(min(64 // group_pad, triton.next_power_of_2(T)), triton.cdiv(16, group_pad), 1)
    block_d = max(16, triton.next_power_of_2(D))
    block_t = max(16, triton.next_power_of_2(T))
    base = triton.cdiv(T, nodes) * B * H_kv
    if splits is None:
        splits = max(1, min(triton.cdiv(P, 2 * block_n), _programs_wanted(q.device) // base))
    chunk = max(block_n, triton.cdiv(triton.cdiv(max(P, 1), splits), block_n) * block_n)
    splits = max(1, triton.cdiv(P, chunk))
    if use_mask:
        mask_arg, parents_arg, s_mt, s_mn = mask, q, mask.stride(0), mask.stride(1)
    else:
        mask_arg, parents_arg, s_mt, s_mn = q, parents, 0, 0
    if start is not None:  # the split's chunk is computed in the kernel from the prefix it reads
        chunk = 0
    if splits > 1:
        part = torch.empty(splits * B * H * T * D, device=q.device, dtype=torch.float32)
        part_m = torch.empty(splits * B * H * T, device=q.device, dtype=torch.float32)
        part_l = torch.empty_like(part_m)
    else:
        part = part_m = part_l = q
    extra = {}
    if num_warps is not None:
        extra["num_warps"] = num_warps
    if num_stages is not None:
        extra["num_stages"] = num_stages
    _tree_attention_kernel[(triton.cdiv(T, nodes), B * H_kv, splits)](
        q, k, v, out, mask_arg, parents_arg, part, part_m, part_l, q if start is None else start,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), s_mt, s_mn,
        B, H, H_kv, T, P, D, chunk, scale * 1.4426950408889634,
        GROUP=group, GROUP_PAD=group_pad, NODES=nodes, USE_MASK=use_mask, SPLIT=splits > 1,
        LOOP_FOR=not INTERPRET, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_T=block_t,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", GATHER=gather, DYNAMIC_P=start is not None,
        **extra)
    if splits > 1:
        _combine_kernel[(B * H * T,)](part, part_m, part_l, out, *out.stride(), B * H * T, H, T, D, splits,
                                      SPLIT_PAD=max(2, triton.next_power_of_2(splits)), BLOCK_D=block_d)
    return out.to(torch.bfloat16) if bf16_in_interpreter else out


def tree_attention_masked(q, k, v, mask, scale=None) -> torch.Tensor:
    """Tree attention with a dense boolean mask [T, P + T] (True = may attend). Only its tree columns
    [:, P:] are read: every node sees the whole prefix (checked when the mask is on the CPU)."""
    B, H, T, D, P = _check(q, k, v)
    if mask.shape != (T, P + T) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool [T, P + T] = [{T}, {P + T}], got {mask.dtype} {tuple(mask.shape)}")
    if mask.device.type == "cpu" and not bool(mask[:, :P].all()):
        raise ValueError("mask[:, :P] must be all True: every tree node attends to the whole prefix")
    return _launch(q, k, v, mask.to(q.device, non_blocking=True), None, scale, True)


def tree_attention(q, k, v, parents, scale=None) -> torch.Tensor:
    """Mask-free tree attention from the `parents` array [T] (parents[i] < i, -1 = the root).
    Parents on the CPU are checked; on the GPU they are trusted (a check would synchronise), and a
    pointer that does not point backwards only ends that node's walk: no hang, a wrong answer."""
    B, H, T, D, P = _check(q, k, v)
    if parents.ndim != 1 or len(parents) != T or parents.dtype.is_floating_point:
        raise ValueError(f"parents must be an integer tensor [T] = [{T}], got {parents.dtype} {tuple(parents.shape)}")
    if parents.device.type == "cpu":  # checked where it is free (a check on the GPU would synchronise)
        idx = torch.arange(T)
        if bool(((parents < -1) | (parents >= idx)).any()):
            raise ValueError("parents[i] must be -1 (a child of the root) or an earlier node's index (< i)")
    return _launch(q, k, v, None, parents.to(q.device, torch.int32, non_blocking=True).contiguous(), scale, False)


def block_splits(capacity: int, rows: int, kv_heads: int, device, batch: int = 1, block_n: int = 64) -> int:
    """How many slices `block_attention` cuts the prefix into for a buffer of `capacity` slots: fixed when a graph
    is recorded, whatever prefix a later round has (a slice past the prefix only writes an empty partial)."""
    group_nodes = max(1, triton.cdiv(rows, 64)) if AVAILABLE else 1
    return max(1, min(-(-capacity // (2 * block_n)), _programs_wanted(torch.device(device)) // (group_nodes * batch
                                                                                                 * kv_heads)))


def _block_attention(q, k, v, start, block_mask, splits: int) -> torch.Tensor:
    B, H, T, D, _ = _check(q, k, v)
    if block_mask.shape != (T, T) or block_mask.dtype != torch.bool:
        raise ValueError(f"block_mask must be bool [T, T] = [{T}, {T}], got {block_mask.dtype} "
                         f"{tuple(block_mask.shape)}")
    if start.numel() != 1 or start.dtype.is_floating_point or start.device != q.device:
        raise ValueError(f"start must be one integer on q's device, got {start.dtype} {tuple(start.shape)} on "
                         f"{start.device}")
    return _launch(q, k, v, block_mask, None, None, True, splits=splits, start=start.reshape(1))


if AVAILABLE:
    # an operator of its own, so that torch.compile (fullgraph) and a CUDA graph treat the launch as one opaque call
    block_attention_op = torch.library.custom_op(
        "specdec::block_attention", _block_attention, mutates_args=(),
        schema="(Tensor q, Tensor k, Tensor v, Tensor start, Tensor block_mask, int splits) -> Tensor")

    @block_attention_op.register_fake
    def _(q, k, v, start, block_mask, splits):
        return q.new_empty(q.shape)


def block_attention(q, k, v, start, block_mask, splits: int = 1) -> torch.Tensor:
    """The attention of a pass whose T rows sit at slots start .. start+T-1 of a KV buffer, read in place: every row
    sees the whole prefix (slots 0 .. start-1, no mask) and, of the T rows' own keys, those `block_mask` [T, T]
    allows (a chain: causal; a tree: the root, its ancestors and itself). `start` is a device tensor (the prefix
    length is read by the kernel, so one recorded graph serves every round); q [B, H, T, D], k and v the whole
    buffers [B, H_kv, capacity, D]; `splits` slices of the prefix (`block_splits`). The device loop's attention
    with `attention="triton"` (notebook 09)."""
    if not AVAILABLE:
        raise RuntimeError(WHY)
    return block_attention_op(q, k, v, start, block_mask, splits)


# --------------------------------------------------------------------------- a transformers backend
BACKENDS = {"tree_triton": False, "tree_triton_masked": True}  # name -> reads the mask (else parents)


def _backend(use_mask: bool):
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, tree_parents=None,
                  tree_key_length=None, **kwargs):
        """A tree-verification forward (`runner.forward_tree` passes `tree_parents` for its queries and
        the keys it expects: cache + queries) runs on the kernel; every other forward (prefill, plain
        steps, batches, more than MAX_NODES queries, keys laid out otherwise such as a preallocated
        cache, sliding windows or soft-capping) is SDPA's, unchanged."""
        if (tree_parents is None or query.shape[2] != len(tree_parents) or query.shape[2] > MAX_NODES
                or query.shape[0] != 1 or key.shape[2] != tree_key_length
                or kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None):
            return sdpa_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)
        if use_mask:  # the engine's additive 4D mask [1, 1, T, P + T]: 0 where a query may attend
            allowed = attention_mask[0, 0, :, :key.shape[2]] == 0
            out = _launch(query, key, value, allowed, None, scaling, True)
        else:
            out = _launch(query, key, value, None, tree_parents, scaling, False)
        return out.transpose(1, 2).contiguous(), None
    return attention


def register() -> list[str]:
    """Register the kernels with transformers under the names of `BACKENDS` (idempotent; importing this module
    does it where Triton is available):
    `model.set_attn_implementation("tree_triton")` then makes the model's tree verification use
    the mask-free kernel, `"tree_triton_masked"` the masked one; other forwards stay SDPA's."""
    if not AVAILABLE:
        raise RuntimeError(WHY)
    for name, use_mask in BACKENDS.items():
        register_attention(name, _backend(use_mask))  # non-tree forwards get SDPA's masks
    return list(BACKENDS)


def use_backend(model, name: str) -> str:
    """Switch `model`'s attention to `name` ("sdpa", "tree_triton" or "tree_triton_masked");
    returns the previous one, so a notebook can switch back."""
    allowed = ["sdpa", *BACKENDS]
    if name not in allowed:
        raise ValueError(f"unknown attention backend {name!r}; allowed: {', '.join(allowed)}")
    if name in BACKENDS:
        register()
    previous = attn_implementation(model)
    model.set_attn_implementation(name)
    return previous


if AVAILABLE:  # the backends exist with this module: whoever imports it asked for Triton's attention
    register()


def tree_kwargs(model, n_committed: int, parents: torch.Tensor, fed: int, device, cache_len: int) -> dict:
    """What `runner.forward_tree` passes to the model for these backends: the parents of all the
    pass's queries (the n_committed uncached committed tokens as a chain, then the tree nodes
    under the last of them). Empty for any other backend, or for a pass that starts inside a
    cached tree (fed > 0: its queries' ancestors are not one prefix) which then runs on SDPA."""
    if attn_implementation(model) not in BACKENDS or fed:
        return {}
    m = n_committed
    chain = torch.arange(-1, m - 1, device=parents.device)
    nodes = torch.where(parents >= 0, parents + m, torch.full_like(parents, m - 1))
    return {"tree_parents": torch.cat([chain, nodes]).to(device, torch.int32),
            "tree_key_length": cache_len + m + len(parents)}
