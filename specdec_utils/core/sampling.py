"""Lossless speculative sampling (notebook 02).

The draft proposes k tokens x_i ~ q_i; the target scores them all in one forward pass, giving
p_0..p_k. Token x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first
rejection we emit a sample from the residual norm(max(0, p_i - q_i)), and if all k are accepted we
emit a bonus sample from p_k. Every emitted token is then distributed exactly as the target would
sample it (Leviathan et al. 2023, Algorithm 1 and Theorem 3.5; Chen et al. 2023, Algorithm 2).

All randomness is drawn on the CPU from an optional `torch.Generator`, so a seed gives the same
tokens whichever device the probabilities live on.
"""
from __future__ import annotations

import math

import torch

from .checks import check_sampling

_TOKEN_DTYPES = (torch.int64, torch.int32)


def warp_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0) -> torch.Tensor:
    """Turn logits [..., V] into sampling probabilities (float32, same shape and device).

    Applies temperature, then top-k, then top-p (nucleus), then renormalizes. temperature=0 is
    greedy: a one-hot on the argmax (ties go to the lowest index). top_k=0 and top_p=1.0 are off;
    tokens tied with the k-th largest logit are kept. Top-p keeps the smallest set of most
    probable tokens whose mass reaches top_p, never fewer than one. Logits of -inf (or the dtype's
    minimum) get probability 0; each row needs at least one finite logit. Speculative sampling is
    lossless only if the draft and the target are warped with the same settings.

    transformers' `TemperatureLogitsWarper`, `TopKLogitsWarper` and `TopPLogitsWarper` (what
    `generate(do_sample=True)` and the bench's `hf-*` rows use) give the same distributions except in
    two places, so they are not used here: (1) tokens tied across the top-p boundary: both keep the same
    number of them, transformers the highest indices (it sorts ascending and cuts the low tail), this
    function the lowest; (2) tiny temperatures: transformers divides the raw logits, which overflow to
    inf (NaN probabilities, e.g. at 1e-39), where this function refuses a positive temperature below 1e-6
    in one line (the engine's and the device loop's rule, `checks.check_sampling`) and shifts by the row
    maximum first. They also take only [batch, V] rows, reject temperature 0 and top_k 0
    (tests/test_sampling.py pins all this). With top_p = 1, as in every committed sampled benchmark, the two
    agree.
    """
    check_sampling(temperature, top_k, top_p)  # the executors' own rules (`checks.py`)

    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    # Shifting by the row max first keeps tiny temperatures from overflowing to +inf.
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature
    if 0 < top_k < logits.shape[-1]:
        kth_largest = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, -math.inf)
    probs = logits.softmax(-1)
    if top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the more probable tokens
        drop_sorted = mass_before >= top_p  # the set already reached top_p without this token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_token(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """Draw one token id from a probability vector [V] (any device) using a CPU `generator`.

    Plain autoregressive sampling and speculative sampling share this sampler: it consumes
    exactly one uniform from `generator` (float64, drawn on the CPU, so a seed gives the same
    tokens on any device) and hands it to `draw`. `probs` need not sum to 1 (it is normalized)."""
    if probs.ndim != 1:
        raise ValueError(f"probs must be a 1-D tensor [V], got shape {tuple(probs.shape)}")
    total = float(probs.double().sum())
    if float(probs.min()) < 0 or not 0 < total < math.inf:
        raise ValueError("probs must be finite and non-negative with a positive sum")
    uniform = torch.rand(1, generator=generator, dtype=torch.float64)
    return int(draw(probs[None], uniform.to(probs.device))[0])


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of `probs` [n, V] (non-negative, any positive total), from explicit `uniforms` [n] in
    [0, 1) (float64): the token whose slice of the row's cumulative distribution holds uniform * total (the
    inverse CDF). A zero-probability token owns an empty slice, so it is never drawn; u * total can round up to
    the total itself, so it is kept just below it. Tensor operations only, no read back: the engine calls it
    eagerly, the device loop records it in its CUDA graph. Returns ids [n] (int64)."""
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:]
    where = torch.minimum(uniforms.to(cdf.dtype)[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, where, right=True)[:, 0]


def _residual_distribution(target_row: torch.Tensor, draft_row: torch.Tensor) -> torch.Tensor:
    """max(0, p - q), to be normalized: what the target still owes after the draft's accepted
    mass (Leviathan et al. 2023, Sec. 2.3). Zero mass means p <= q everywhere, which for
    normalized rows forces p == q (where every draft is accepted), so it only comes from rounding
    or unnormalized rows; we then fall back to p itself. Rows [..., V]; no read back."""
    residual = (target_row - draft_row).clamp(min=0)
    return torch.where(residual.sum(-1, keepdim=True) > 0, residual, target_row)


def residual(target_row: torch.Tensor, draft_row: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): the distribution the target still owes after a draft token drawn from q
    was rejected (the same rule, and the same fallback to p when no mass is left, for chains and trees)."""
    rest = _residual_distribution(target_row, draft_row)
    return rest / rest.sum(-1, keepdim=True)


def accept_greedy(drafts: torch.Tensor, choice: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance of a chain: `drafts` [k], `choice` [k + 1] the target's argmax at every verified row.
    Returns (n, after): n (a 0-dim int64 tensor) the leading drafts equal to the target's choice, `after` [1] the
    target's choice after them (the correction, or the bonus after all k). No read back."""
    n = (drafts == choice[:drafts.shape[0]]).long().cumprod(0).sum()  # the leading run of matches
    return n, choice.gather(0, n.view(1))


def accept_tree_greedy(nodes: torch.Tensor, parent_rows: torch.Tensor, ancestors: torch.Tensor, depth: torch.Tensor,
                       choice: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy acceptance of a token tree, as tensor operations: `nodes` [T] (a parent before its children);
    `parent_rows` [T] the row of `choice` that verified each node (0 for the root's children, 1 + the parent's index
    otherwise); `ancestors` [T, T] bool (j is i or one of its ancestors); `depth` [T] (1 for the root's children);
    `choice` [T + 1] the target's argmax after the root (row 0) and after each node. The walk from the root moves to
    the first child whose token is the target's choice while there is one: a node is on it when it is that child and
    all its ancestors are. Returns (n, deepest, after): n (0-dim int64) the accepted depth, `deepest` the last
    accepted node (any node when n = 0), `after` [1] the target's choice after it. No read back."""
    right = nodes == choice[parent_rows]
    earlier = torch.ones_like(ancestors).tril_(-1)  # j < i
    sibling = (parent_rows[:, None] == parent_rows[None, :]) & earlier
    first = right & ~(sibling & right[None]).any(-1)  # the first right child of its parent
    on_walk = first & (ancestors.sum(-1) == depth) & ~(ancestors & ~first[None]).any(-1)
    reach = torch.cat([depth.new_zeros(1), torch.where(on_walk, depth, 0)])  # row 0: the root (an empty tree too)
    n, row = reach.max(), reach.argmax()
    return n, (row - 1).clamp_min(0), choice.gather(0, row.view(1))


def accept_tree_sampled(nodes: torch.Tensor, parent_rows: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor,
                        uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact acceptance of a token tree (SpecInfer's multi-step speculative sampling, Miao et al. 2024) from
    explicit uniforms, as tensor operations: `nodes` [T] (a parent before its children), `parent_rows` [T] the row
    of `p` that verifies each node (0 for the root's children, 1 + the parent's index otherwise), `q` [T, V] the
    distribution each node was drawn from (None: every node chosen deterministically, one-hot q), `p` [T + 1, V]
    the target's warped rows (row 0 after the root), `uniforms` [T + 1] in [0, 1) (float64).

    The walk starts at the root with r = p_0 and tries its children in index order: child c (token x) is kept iff
    u * q_c(x) < r(x); then the walk moves to c with r = p_c; after a rejection r <- norm(max(0, r - q_c))
    (`residual`). When no child of the current node is kept, the token after the path is drawn from r. One pass
    over the nodes in index order is the whole walk: a node's children come after it, and a node tried after the
    walk left its parent is skipped. The j-th node tried uses uniforms[j] and the final draw the next one, so a
    walk that tries t nodes reads t + 1 uniforms, in the order a host walk drawing them one by one would.
    Returns (on_path [T] bool, tried (0-dim int64), after [1]); no read back."""
    nodes, parent_rows = nodes.to(p.device), parent_rows.to(p.device)
    rows = p.double()
    current = torch.zeros((), dtype=torch.long, device=p.device)  # the row of the node the walk stands on
    tried = torch.zeros((), dtype=torch.long, device=p.device)
    rest = rows[0]
    kept = []
    for i in range(nodes.shape[0]):
        x = nodes[i:i + 1]
        q_row = torch.zeros_like(rest).scatter_(0, x, 1.0) if q is None else q[i].double()
        child = parent_rows[i] == current
        keep = child & (uniforms.gather(0, tried.view(1))[0] * q_row.gather(0, x)[0] < rest.gather(0, x)[0])
        rest = torch.where(keep, rows[i + 1], torch.where(child, residual(rest, q_row), rest))
        current = torch.where(keep, i + 1, current)
        tried = tried + child.long()
        kept.append(keep)
    on_path = torch.stack(kept) if kept else torch.zeros(0, dtype=torch.bool, device=p.device)
    return on_path, tried, draw(rest[None], uniforms.gather(0, tried.view(1)))


def accept_sampled(drafts: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor,
                   uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact acceptance of a chain (Leviathan et al. 2023, Algorithm 1) from explicit uniforms: `drafts` [k] drawn
    from `q` [k, V] (None: chosen deterministically, one-hot q), `p` [k + 1, V] the target's warped rows, `uniforms`
    [k + 1] in [0, 1) (float64). Draft i is kept iff u_i * q_i(x_i) < p_i(x_i) (probability min(1, p/q), no
    division); n = the leading run of kept drafts; the token after them is drawn with u_k from the residual
    norm(max(0, p_n - q_n)), with q_k = 0 (after k kept drafts that is p_k, the bonus) and p_n when no mass is left.
    Returns (n, after [1]) as tensors; no read back (the device loop records this function in its graph)."""
    k, device = drafts.shape[0], p.device
    column = drafts[:, None]
    p_x = p[:k].gather(1, column)[:, 0].double()
    q_x = torch.ones(k, dtype=torch.float64, device=device) if q is None else q.gather(1, column)[:, 0].double()
    n = (uniforms[:k] * q_x < p_x).long().cumprod(0).sum()
    p_n = p.index_select(0, n.view(1)).double()
    if q is None:  # one-hot on the rejected draft (none after k kept drafts)
        rejected = torch.cat([drafts, drafts.new_zeros(1)]).index_select(0, n.view(1))
        q_n = torch.zeros_like(p_n).scatter_(1, rejected[:, None], (n < k).double().view(1, 1))
    else:
        q_n = torch.cat([q, q.new_zeros(1, q.shape[1])]).index_select(0, n.view(1)).double()
    return n, draw(_residual_distribution(p_n, q_n), uniforms[k:])


def rejection_sample(draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                     draft_tokens: torch.Tensor,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Verify k drafted tokens; return the accepted prefix plus one token (1-D, int64).

    draft_probs [k, V] are the draft's (warped) distributions q_i that x_i = draft_tokens[i] was
    sampled from (None: every draft was chosen deterministically, a one-hot q_i, as for a prompt-lookup
    proposer); target_probs [k+1, V] are the target's p_0..p_k, warped the same way; k may be
    0. The result holds between 1 and k+1 tokens and lives on draft_tokens' device. Each call
    consumes exactly k+1 uniforms from `generator`, whatever is accepted.

    x_i is accepted iff u_i * q_i(x_i) < p_i(x_i) with u_i ~ U[0, 1), i.e. with probability
    min(1, p_i(x_i) / q_i(x_i)) without dividing. The strict `<` settles the edge cases:
    p_i(x_i) = 0 always rejects (the target can never emit x_i, even if u_i = 0), and
    q_i(x_i) = 0 < p_i(x_i) always accepts (ratio infinite). The output is exactly p_i when x_i
    really was drawn from q_i; a token with q_i(x_i) = 0 cannot be, so it signals a caller bug.
    With temperature 0 both rows are one-hot and the rule is greedy decoding: accept while x_i is
    the target's argmax, then emit the target's argmax. The rule itself is `accept_sampled`, the function the
    device loop records on the GPU; this wrapper checks the inputs and draws the uniforms.
    """
    k = _check_rejection_inputs(draft_probs, target_probs, draft_tokens)
    if k and not 0 <= int(draft_tokens.min()) <= int(draft_tokens.max()) < target_probs.shape[1]:
        raise ValueError(f"draft_tokens must lie in [0, {target_probs.shape[1]}), "
                         f"got {draft_tokens.tolist()}")
    device = target_probs.device
    tokens = draft_tokens.detach().to(device, torch.long)
    uniforms = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    q = None if draft_probs is None else draft_probs.detach().to(device)
    n, after = accept_sampled(tokens, q, target_probs.detach(), uniforms.to(device))
    return torch.cat([tokens[:int(n)], after]).to(draft_tokens.device)


def _check_rejection_inputs(draft_probs, target_probs, draft_tokens) -> int:
    """Validate shapes and dtypes; return k, the number of drafted tokens."""
    if draft_tokens.ndim != 1 or draft_tokens.dtype not in _TOKEN_DTYPES:
        raise ValueError(f"draft_tokens must be a 1-D int64 or int32 tensor [k], got shape "
                         f"{tuple(draft_tokens.shape)} and dtype {draft_tokens.dtype}")
    k = draft_tokens.shape[0]
    for name, probs, rows_name, rows in (("draft_probs", draft_probs, "k", k),
                                         ("target_probs", target_probs, "k+1", k + 1)):
        if probs is None and name == "draft_probs":
            continue  # deterministic drafts: one-hot q
        if probs.ndim != 2 or not probs.is_floating_point():
            raise ValueError(f"{name} must be a 2-D floating-point tensor, got shape "
                             f"{tuple(probs.shape)} and dtype {probs.dtype}")
        if probs.shape[0] != rows:
            raise ValueError(f"{name} must have {rows_name}={rows} rows, got {probs.shape[0]}")
    if draft_probs is not None and draft_probs.shape[1] != target_probs.shape[1]:
        raise ValueError(f"draft_probs and target_probs must share the vocabulary size, got "
                         f"{draft_probs.shape[1]} and {target_probs.shape[1]}")
    return k
