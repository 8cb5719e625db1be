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
import numbers

import torch

from .checks import require

_TOKEN_DTYPES = (torch.int64, torch.int32)


def _require(ok: bool, name: str, allowed: str, value) -> None:
    require(name, value, ok, allowed)


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
    inf (NaN probabilities, e.g. at 1e-39), where this function shifts by the row maximum first. They also
    take only [batch, V] rows, reject temperature 0 and top_k 0 (tests/test_sampling.py pins all this).
    With top_p = 1, as in every committed sampled benchmark, the two agree.
    """
    _require(isinstance(temperature, numbers.Real) and math.isfinite(temperature)
             and temperature >= 0, "temperature", "a finite number >= 0 (0 means greedy)",
             temperature)
    _require(isinstance(top_k, numbers.Integral) and top_k >= 0, "top_k",
             "an integer >= 0 (0 means off)", top_k)
    _require(isinstance(top_p, numbers.Real) and 0 < top_p <= 1, "top_p",
             "a number in (0, 1] (1.0 means off)", top_p)

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
    exactly one uniform from `generator`. `probs` need not sum to 1 (it is normalized here).
    """
    if probs.ndim != 1:
        raise ValueError(f"probs must be a 1-D tensor [V], got shape {tuple(probs.shape)}")
    return _inverse_cdf(probs, torch.rand((), generator=generator, dtype=torch.float64))


def _inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> int:
    """The token whose slice of the cumulative distribution holds uniform * total mass; a
    zero-probability token owns an empty slice, so it is never drawn."""
    probs = probs.detach().to("cpu", torch.float64)
    cdf = probs.cumsum(0)
    if probs.min() < 0 or not 0 < cdf[-1] < math.inf:
        raise ValueError("probs must be finite and non-negative with a positive sum")
    return int(torch.searchsorted(cdf, uniform * cdf[-1], right=True))


def _residual_distribution(target_row: torch.Tensor, draft_row: torch.Tensor) -> torch.Tensor:
    """max(0, p - q), to be normalized: what the target still owes after the draft's accepted
    mass (Leviathan et al. 2023, Sec. 2.3). Zero mass means p <= q everywhere, which for
    normalized rows forces p == q (where every draft is accepted), so it only comes from rounding
    or unnormalized rows; we then fall back to p itself."""
    residual = (target_row - draft_row).clamp(min=0)
    return residual if residual.sum() > 0 else target_row


def residual(target_row: torch.Tensor, draft_row: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): the distribution the target still owes after a draft token drawn from q
    was rejected (the same rule, and the same fallback to p when no mass is left, for chains and trees)."""
    rest = _residual_distribution(target_row, draft_row)
    return rest / rest.sum()


def _probs_of_tokens(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """probs[i, tokens[i]] for each i, as float64 on the CPU: only k numbers leave the device."""
    index = tokens.to(probs.device)[:, None]
    return probs[:len(tokens)].detach().gather(1, index).squeeze(1).to("cpu", torch.float64)


def rejection_sample(draft_probs: torch.Tensor, target_probs: torch.Tensor,
                     draft_tokens: torch.Tensor,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Verify k drafted tokens; return the accepted prefix plus one token (1-D, int64).

    draft_probs [k, V] are the draft's (warped) distributions q_i that x_i = draft_tokens[i] was
    sampled from; target_probs [k+1, V] are the target's p_0..p_k, warped the same way; k may be
    0. The result holds between 1 and k+1 tokens and lives on draft_tokens' device. Each call
    consumes exactly k+1 uniforms from `generator`, whatever is accepted.

    x_i is accepted iff u_i * q_i(x_i) < p_i(x_i) with u_i ~ U[0, 1), i.e. with probability
    min(1, p_i(x_i) / q_i(x_i)) without dividing. The strict `<` settles the edge cases:
    p_i(x_i) = 0 always rejects (the target can never emit x_i, even if u_i = 0), and
    q_i(x_i) = 0 < p_i(x_i) always accepts (ratio infinite). The output is exactly p_i when x_i
    really was drawn from q_i; a token with q_i(x_i) = 0 cannot be, so it signals a caller bug.
    With temperature 0 both rows are one-hot and the rule is greedy decoding: accept while x_i is
    the target's argmax, then emit the target's argmax.
    """
    k = _check_rejection_inputs(draft_probs, target_probs, draft_tokens)
    tokens = draft_tokens.detach().to("cpu", torch.long)
    if k and not 0 <= int(tokens.min()) <= int(tokens.max()) < target_probs.shape[1]:
        raise ValueError(f"draft_tokens must lie in [0, {target_probs.shape[1]}), "
                         f"got {tokens.tolist()}")

    q_of_draft = _probs_of_tokens(draft_probs, tokens)
    p_of_draft = _probs_of_tokens(target_probs, tokens)
    uniforms = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    accepted = uniforms[:k] * q_of_draft < p_of_draft  # P = min(1, p/q), without dividing
    n_accepted = int(accepted.long().cumprod(0).sum())  # length of the leading run of accepts

    target_row = target_probs[n_accepted].detach().to("cpu", torch.float64)
    if n_accepted == k:
        next_probs = target_row  # bonus token: every draft token was accepted
    else:
        draft_row = draft_probs[n_accepted].detach().to("cpu", torch.float64)
        next_probs = _residual_distribution(target_row, draft_row)
    next_token = torch.tensor([_inverse_cdf(next_probs, uniforms[k])])
    return torch.cat([tokens[:n_accepted], next_token]).to(draft_tokens.device)


def _check_rejection_inputs(draft_probs, target_probs, draft_tokens) -> int:
    """Validate shapes and dtypes; return k, the number of drafted tokens."""
    if draft_tokens.ndim != 1 or draft_tokens.dtype not in _TOKEN_DTYPES:
        raise ValueError(f"draft_tokens must be a 1-D int64 or int32 tensor [k], got shape "
                         f"{tuple(draft_tokens.shape)} and dtype {draft_tokens.dtype}")
    k = draft_tokens.shape[0]
    for name, probs, rows_name, rows in (("draft_probs", draft_probs, "k", k),
                                         ("target_probs", target_probs, "k+1", k + 1)):
        if probs.ndim != 2 or not probs.is_floating_point():
            raise ValueError(f"{name} must be a 2-D floating-point tensor, got shape "
                             f"{tuple(probs.shape)} and dtype {probs.dtype}")
        if probs.shape[0] != rows:
            raise ValueError(f"{name} must have {rows_name}={rows} rows, got {probs.shape[0]}")
    if draft_probs.shape[1] != target_probs.shape[1]:
        raise ValueError(f"draft_probs and target_probs must share the vocabulary size, got "
                         f"{draft_probs.shape[1]} and {target_probs.shape[1]}")
    return k
