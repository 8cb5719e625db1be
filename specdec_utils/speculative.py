"""Speculative decoding with a KV cache (notebooks 01 and 02), and the plain autoregressive
baseline it is measured against, in the same engine.

Each round the draft proposes gamma tokens one by one; the target scores all of them in ONE
forward pass and keeps the longest acceptable prefix plus one token of its own (Leviathan et al.
2023, Algorithm 1; Chen et al. 2023, Algorithm 2). Greedy decoding (temperature 0) accepts a draft
token iff it is the target's argmax, so the output is token-identical to the target's own greedy
decoding; sampling uses `sampling.rejection_sample`, so the output follows the target's
distribution exactly.

Both models keep a transformers KV cache. The one rule that keeps the caches right: a cache only
ever holds committed tokens, and each forward feeds a model every token its cache has not seen yet
(`forward_uncached`). The prompt is therefore "prefilled" by the first forward of each model, and
after each round both caches are rolled back with `trim_cache` to the committed tokens.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from .kv_cache import cache_length, trim_cache
from .sampling import rejection_sample, sample_token, warp_logits


@dataclass
class GenerationResult:
    """What one generation produced and what it cost.

    `target_calls` and `draft_calls` count forward passes (the prefill included); `drafted` and
    `accepted` count draft tokens proposed and accepted by the target, and
    `accepted_per_position[i]` how often draft position i (0-based) was accepted.
    """
    new_token_ids: list[int] = field(default_factory=list)
    target_calls: int = 0
    draft_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Fraction of drafted tokens the target accepted (the paper's alpha, measured)."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def tokens_per_target_call(self) -> float:
        """New tokens per target forward pass: 1 for plain decoding, up to gamma + 1."""
        return len(self.new_token_ids) / self.target_calls if self.target_calls else float("nan")


def forward_uncached(model, tokens: torch.Tensor, cache, num_logits: int = 1):
    """Run `model` on the tokens of `tokens` [1, seq_len] that `cache` has not seen yet (all of
    them when `cache` is None: the prefill). Return the last `num_logits` logits [num_logits, V]
    and the grown cache; positions follow from the cache length."""
    seen = cache_length(cache)
    out = model(input_ids=tokens[:, seen:], past_key_values=cache, use_cache=True,
                logits_to_keep=num_logits)
    return out.logits[0, -num_logits:], out.past_key_values


@torch.inference_mode()
def autoregressive_generate(model, input_ids: torch.Tensor, max_new_tokens: int,
                            temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                            eos_token_id=None, generator: torch.Generator | None = None
                            ) -> GenerationResult:
    """The baseline: one target forward per new token (the prefill yields the first one).
    Greedy at temperature 0, else samples from `warp_logits(logits, temperature, top_k, top_p)`."""
    _check_arguments(input_ids, max_new_tokens, temperature, top_k, top_p)
    eos_ids = _as_id_set(eos_token_id)
    result, tokens, cache = GenerationResult(), input_ids, None
    start = time.perf_counter()
    while not _finished(result.new_token_ids, max_new_tokens, eos_ids):
        logits, cache = forward_uncached(model, tokens, cache)
        result.target_calls += 1
        token, _ = _next_token(logits[-1], temperature, top_k, top_p, generator)
        result.new_token_ids.append(token)
        tokens = torch.cat([tokens, tokens.new_tensor([[token]])], dim=1)
    result.wall_s = time.perf_counter() - start
    return result


@torch.inference_mode()
def speculative_generate(target, draft, input_ids: torch.Tensor, max_new_tokens: int,
                         gamma: int = 4, temperature: float = 0.0, top_k: int = 0,
                         top_p: float = 1.0, eos_token_id=None,
                         generator: torch.Generator | None = None) -> GenerationResult:
    """Speculative decoding (Leviathan et al. 2023, Algorithm 1): the `draft` proposes `gamma`
    tokens per round, the `target` verifies them in one forward pass.

    temperature 0 is greedy: the output equals the target's greedy output token for token.
    Otherwise both models' logits are warped identically (temperature, top_k, top_p) and
    `rejection_sample` keeps the output distributed exactly as the target samples. Stops after
    `max_new_tokens` tokens or after `eos_token_id` (an id or a collection of ids), whichever
    comes first; the draft never proposes a token past the budget. The first target pass is also
    the prefill, so a draft that is always accepted needs ceil(n / (gamma + 1)) target passes.
    """
    _check_arguments(input_ids, max_new_tokens, temperature, top_k, top_p, gamma)
    eos_ids = _as_id_set(eos_token_id)
    result = GenerationResult(accepted_per_position=[0] * gamma)
    tokens, target_cache, draft_cache = input_ids, None, None  # tokens: prompt + committed
    start = time.perf_counter()
    while not _finished(result.new_token_ids, max_new_tokens, eos_ids):
        k = min(gamma, max_new_tokens - len(result.new_token_ids) - 1)  # k drafts + 1 target token

        # 1. Draft: propose k tokens autoregressively (the draft's first step catches up on
        #    every committed token it has not cached yet).
        candidate, draft_probs = tokens, []
        for _ in range(k):
            draft_logits, draft_cache = forward_uncached(draft, candidate, draft_cache)
            token, probs = _next_token(draft_logits[-1], temperature, top_k, top_p, generator)
            draft_probs.append(probs)
            candidate = torch.cat([candidate, candidate.new_tensor([[token]])], dim=1)
        draft_tokens = candidate[0, tokens.shape[1]:]

        # 2. Verify: one target forward over all uncached tokens gives p_0 .. p_k.
        target_logits, target_cache = forward_uncached(target, candidate, target_cache, k + 1)
        if k and draft_logits.shape[-1] != target_logits.shape[-1]:
            raise ValueError(f"draft and target must share the output vocabulary, got "
                             f"{draft_logits.shape[-1]} and {target_logits.shape[-1]} logits")

        # 3. Accept a prefix of the draft, plus one target token (correction or bonus).
        if temperature == 0:
            new_tokens = greedy_verify(draft_tokens, target_logits)
        else:
            target_probs = warp_logits(target_logits, temperature, top_k, top_p)
            draft_rows = torch.stack(draft_probs) if k else target_probs[:0]  # [k, V]
            new_tokens = rejection_sample(draft_rows, target_probs, draft_tokens, generator)

        # 4. Commit, then roll both caches back to the committed tokens. The newest token is in
        #    no cache yet; after a fully accepted round the draft also lacks its last proposal.
        n_accepted = len(new_tokens) - 1
        result.target_calls += 1
        result.draft_calls += k
        result.drafted += k
        result.accepted += n_accepted
        for position in range(n_accepted):
            result.accepted_per_position[position] += 1
        kept = _append_until_eos(result.new_token_ids, new_tokens.tolist(), eos_ids)
        tokens = torch.cat([tokens, tokens.new_tensor([kept])], dim=1)
        committed = tokens.shape[1] - 1
        target_cache = trim_cache(target_cache, committed)
        draft_cache = trim_cache(draft_cache, min(cache_length(draft_cache), committed))
    result.wall_s = time.perf_counter() - start
    return result


def greedy_verify(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Greedy verification: accept draft tokens while each equals the target's argmax, then add
    the target's own argmax at the first mismatch (or its bonus token after all k).
    draft_tokens [k], target_logits [k+1, V]; returns between 1 and k+1 token ids."""
    target_choice = target_logits.argmax(-1)
    matches = (draft_tokens == target_choice[:-1]).long()
    n_accepted = int(matches.cumprod(0).sum())  # length of the leading run of matches
    return target_choice[:n_accepted + 1]  # equals the accepted drafts, then the target's token


def _next_token(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                generator) -> tuple[int, torch.Tensor | None]:
    """Greedy argmax at temperature 0 (no probabilities needed), else a sample from the warped
    distribution, returned with it."""
    if temperature == 0:
        return int(logits.argmax()), None
    probs = warp_logits(logits, temperature, top_k, top_p)
    return sample_token(probs, generator), probs


def _append_until_eos(new_token_ids: list[int], tokens: list[int], eos_ids: set[int]) -> list[int]:
    """Append `tokens` to `new_token_ids`, stopping after the first EOS; return what was kept."""
    kept = []
    for token in tokens:
        kept.append(token)
        if token in eos_ids:
            break
    new_token_ids.extend(kept)
    return kept


def _finished(new_token_ids: list[int], max_new_tokens: int, eos_ids: set[int]) -> bool:
    return len(new_token_ids) >= max_new_tokens or bool(new_token_ids and new_token_ids[-1] in eos_ids)


def _as_id_set(eos_token_id) -> set[int]:
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, int):
        return {eos_token_id}
    return {int(token) for token in eos_token_id}


def _check_arguments(input_ids, max_new_tokens, temperature, top_k, top_p, gamma=None) -> None:
    """Reject bad arguments with a message naming the argument and what is allowed."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.shape[0] != 1:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a tensor of shape [1, seq_len] (batch size 1 only), got {shape}")
    if input_ids.shape[1] < 1:
        raise ValueError("input_ids must hold at least one token")
    checks = [
        ("max_new_tokens", max_new_tokens, isinstance(max_new_tokens, int) and max_new_tokens >= 1,
         "an integer >= 1"),
        ("gamma", gamma, gamma is None or isinstance(gamma, int) and gamma >= 1, "an integer >= 1"),
        ("temperature", temperature, isinstance(temperature, (int, float)) and math.isfinite(temperature)
         and temperature >= 0, "a finite number >= 0 (0 means greedy)"),
        ("top_k", top_k, isinstance(top_k, int) and top_k >= 0, "an integer >= 0 (0 means off)"),
        ("top_p", top_p, isinstance(top_p, (int, float)) and 0 < top_p <= 1,
         "a number in (0, 1] (1.0 means off)"),
    ]
    for name, value, ok, allowed in checks:
        if not ok:
            raise ValueError(f"{name} must be {allowed}, got {value!r}")
