"""KV-cache rollback that survives transformers' API churn.

Speculative decoding appends gamma drafted tokens to a KV cache and must remove the rejected ones.
`DynamicCache.crop(n)` meant "keep n tokens" until transformers 5.17 (which only warns) and raises
for positive n from 5.2x on; a negative n ("remove |n| tokens") works in both. Worse, in the
legacy meaning `crop(0)` empties the cache, so a rollback of zero tokens must never reach it.
The engine's own `StaticKVCache` (static_cache.py, notebook 08) has `rollback(n)`: a pointer move.
"""
from __future__ import annotations

import torch


def cache_length(cache) -> int:
    """Number of positions held by a cache (a transformers `Cache` or a legacy tuple)."""
    if cache is None:
        return 0
    if isinstance(cache, tuple):
        return cache[0][0].shape[-2] if cache else 0
    return int(cache.get_seq_length())


def trim_cache(cache, length: int):
    """Roll `cache` back so that it holds exactly its first `length` positions; return it.

    Works on transformers 5.17 and 5.23 `DynamicCache` (negative `crop`), on caches without a
    `crop` method (per-layer slicing), and on legacy tuples (returns a new tuple).
    """
    current = cache_length(cache)
    if not 0 <= length <= current:
        raise ValueError(f"cannot trim a cache of {current} positions to {length}; "
                         f"allowed: 0 <= length <= {current}")
    if hasattr(cache, "rollback"):  # the preallocated StaticKVCache: move a pointer, O(1)
        cache.rollback(length)
        return cache
    remove = current - length
    if remove == 0:
        return cache  # never call crop(0): in the legacy API it empties the cache
    if isinstance(cache, tuple):
        return tuple(tuple(t[..., :length, :] for t in layer) for layer in cache)
    try:
        cache.crop(-remove)
    except (AttributeError, TypeError, ValueError, RuntimeError):
        for layer in cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys = layer.keys[..., :length, :]
                layer.values = layer.values[..., :length, :]
    if cache_length(cache) != length:
        raise RuntimeError(f"cache rollback failed: expected {length} positions, "
                           f"found {cache_length(cache)} ({type(cache).__name__})")
    return cache
