"""KV-cache length and rollback, for every cache the course meets.

Speculative decoding appends gamma drafted tokens to a KV cache and must remove the rejected ones.
The engine's own `StaticKVCache` (static_cache.py, notebook 09) has `rollback(n)`: a pointer move.
transformers' `DynamicCache` is cropped with a negative count ("remove n positions"), the one meaning
that is the same on every supported version (`compat.crop_cache`, tested in tests/test_compat.py); a
rollback of zero positions never reaches it (`crop(0)` empties a cache in the legacy API). The toy
models of the exactness tests keep legacy tuples, which are sliced.

After a token tree's verification (notebook 06), `gather_cache` moves the accepted path's keys and values into
place right after the prefix and drops the rest: no recomputation.
"""
from __future__ import annotations

import torch

from ..compat import crop_cache


def cache_length(cache) -> int:
    """Number of positions held by a cache (a transformers `Cache` or a legacy tuple)."""
    if cache is None:
        return 0
    if isinstance(cache, tuple):
        return cache[0][0].shape[-2] if cache else 0
    return int(cache.get_seq_length())


def trim_cache(cache, length: int):
    """Roll `cache` back so that it holds exactly its first `length` positions; return it.

    Works on the course's `StaticKVCache` (a pointer move), on transformers caches (`crop(-n)`),
    and on legacy tuples (returns a new tuple); anything else is refused with one line.
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
    if not hasattr(cache, "crop"):
        raise ValueError(f"cannot roll back a {type(cache).__name__}: a KV cache needs rollback(n) or crop(-n)")
    crop_cache(cache, remove)
    if cache_length(cache) != length:
        raise RuntimeError(f"cache rollback failed: expected {length} positions, "
                           f"found {cache_length(cache)} ({type(cache).__name__})")
    return cache


def move_path(buffer: torch.Tensor, dim: int, start, path: torch.Tensor) -> None:
    """The KV commit of a token tree, in place: the entries at slots `start + path` (the accepted nodes, in order)
    move to slots `start .. start + len(path) - 1` along `dim` of `buffer`. `start` is an int or a one-element tensor
    (the device loop's, never read back). The one copy used by every cache: a transformers cache layer
    (`gather_cache`), the plain Llama's buffers (`plain_llama.PlainRunner.commit`) and the device tree's round."""
    offsets = torch.arange(path.shape[0], device=buffer.device)
    buffer.index_copy_(dim, start + offsets, buffer.index_select(dim, start + path.to(buffer.device)))


def gather_cache(cache, prefix: int, keep: torch.Tensor):
    """Keep the first `prefix` positions of `cache` followed by positions `prefix + keep`
    (the accepted path's nodes, in order), moved into place; drop everything after. Returns it."""
    k = len(keep)
    if k and not bool((keep == torch.arange(k, device=keep.device)).all()):  # already in place otherwise
        if isinstance(cache, tuple):
            raise ValueError("gather_cache needs a transformers Cache object, not a legacy tuple")
        stacked = getattr(cache, "keys", None)  # the course's StaticKVCache: every layer in one buffer
        buffers = (cache.keys, cache.values) if isinstance(stacked, torch.Tensor) else \
            [buffer for layer in cache.layers for buffer in (layer.keys, layer.values)]
        for buffer in buffers:  # [(layers,) batch, heads, positions, head_dim]
            move_path(buffer, buffer.dim() - 2, prefix, keep)
    return trim_cache(cache, prefix + k)
