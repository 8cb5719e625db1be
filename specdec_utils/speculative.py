"""Speculative decoding with a KV cache (notebooks 01 and 02), and the plain autoregressive
baseline it is measured against. Both are `generate` (`methods.py`) with a fixed method, run by
the one decode loop of `engine.py`; these names are kept because notebooks 00-02 teach them.

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

import torch

from .core.engine import GenerationResult, forward_uncached  # noqa: F401 (re-exported)
from .core.methods import generate


def autoregressive_generate(model, input_ids: torch.Tensor, max_new_tokens: int,
                            temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                            eos_token_id=None, generator: torch.Generator | None = None
                            ) -> GenerationResult:
    """The baseline: one target forward per new token (the prefill yields the first one).
    Greedy at temperature 0, else samples from `warp_logits(logits, temperature, top_k, top_p)`.
    The same as `generate(model, ..., method="ar")`."""
    return generate(model, input_ids, max_new_tokens, method="ar", temperature=temperature, top_k=top_k,
                    top_p=top_p, eos_token_id=eos_token_id, generator=generator)


def speculative_generate(target, draft, input_ids: torch.Tensor, max_new_tokens: int,
                         gamma: int = 4, temperature: float = 0.0, top_k: int = 0,
                         top_p: float = 1.0, eos_token_id=None,
                         generator: torch.Generator | None = None) -> GenerationResult:
    """Speculative decoding (Leviathan et al. 2023, Algorithm 1): the `draft` proposes `gamma`
    tokens per round, the `target` verifies them in one forward pass. The same as
    `generate(target, ..., method="draft", draft=draft)`.

    temperature 0 is greedy: the output equals the target's greedy output token for token.
    Otherwise both models' logits are warped identically (temperature, top_k, top_p) and
    `rejection_sample` keeps the output distributed exactly as the target samples. Stops after
    `max_new_tokens` tokens or after `eos_token_id` (an id or a collection of ids), whichever
    comes first; the draft never proposes a token past the budget. The first target pass is also
    the prefill, so a draft that is always accepted needs ceil(n / (gamma + 1)) target passes.
    """
    return generate(target, input_ids, max_new_tokens, method="draft", draft=draft, gamma=gamma,
                    temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos_token_id,
                    generator=generator)
