"""A preallocated KV cache with O(1) rollback (notebook 09), the engine's cache on CPU and GPU.

Speculative decoding writes k drafted tokens into the cache every round and throws the rejected
ones away. transformers' `DynamicCache` grows by `torch.cat` (it copies the whole cache on every
forward) and shrinks by slicing. This cache allocates [1, KV heads, capacity, head_dim] per layer
once, writes each forward's keys and values at a pointer, and rolls back by moving the pointer:

    write   keys[:, :, length:length + n] = new keys;   length += n
    commit  nothing to do: the accepted tokens are already in place
    reject  length = committed                         (the stale entries are overwritten later)

In **eager** mode a forward sees the view `keys[:, :, :length]`: exactly the tensors a
`DynamicCache` would hold, so every mask, tree pass and attention backend works unchanged and the
outputs are the same. In **graphed** mode (`runner.py`) a forward writes at a slot tensor and
attends over the whole buffer under an explicit mask: fixed shapes, fixed addresses, which is what a
CUDA graph needs. The same object serves both.

It is a transformers `Cache` whose layers subclass `DynamicLayer`, overriding only what a layer
does with its tensors (`update`, `get_seq_length`, `crop`); what that relies on is listed, and
tested, in `compat.py`.

It is also the course's one KV buffer: the cache holds every layer's keys in one tensor
[layers, batch, KV heads, capacity, head_dim] (and the values in another), each layer's `keys` a
view of its slice. The plain Llama of the GPU engine (`plain_llama.PlainLlama`, the device loop)
keeps its keys and values in a `StaticKVCache` too, writing at slots as a graphed forward does, and a
tree's commit is one gather over the whole buffer (`kv_cache.move_path`).
"""
from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..compat import Cache, CacheLayer

CHUNK = 128  # capacity: room for this many more positions, rounded up to a multiple of it


class PreallocatedLayer(CacheLayer):
    """One layer's keys and values: `keys`/`values` are the whole buffers [B, H_kv, capacity, D], views of the
    cache's stacked buffers; the first `length` positions hold the cache."""

    def __init__(self, capacity: int, owner: StaticKVCache):
        super().__init__()
        self.capacity, self.length = capacity, 0
        self.slots = None  # graphed mode: a tensor of the positions this forward writes
        self.owner = owner  # the cache whose stacked buffers hold this layer's

    def lazy_initialization(self, key_states, value_states) -> None:
        """The first write: the cache allocates every layer's buffers at once, shaped like these states."""
        b, h, _, d = key_states.shape
        self.owner.allocate(b, h, d, key_states.dtype, key_states.device)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.slots is not None:  # graphed: write where the slot tensor says, attend over everything
            self.keys.index_copy_(2, self.slots, key_states)
            self.values.index_copy_(2, self.slots, value_states)
            return self.keys, self.values
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.capacity:
            self.grow(end)
        self.keys[:, :, start:end] = key_states
        self.values[:, :, start:end] = value_states
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def grow(self, needed: int) -> None:
        """Reallocate every layer's buffers to the next multiple of CHUNK >= needed (amortised: eager mode only)."""
        self.owner.reserve(needed)

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        """Negative: remove that many positions (transformers >= 5.2x), at most the `length` held (more raises);
        positive: keep at most that many (the legacy meaning, still accepted by 5.17). Only the pointer moves."""
        if -tokens_to_remove > self.length:
            raise ValueError(f"cannot remove {-tokens_to_remove} positions from a cache layer of {self.length}; "
                             f"allowed: crop(-n) with 0 <= n <= {self.length}")
        self.length = self.length + tokens_to_remove if tokens_to_remove < 0 else min(tokens_to_remove, self.length)

    def reset(self) -> None:
        self.length = 0


class StaticKVCache(Cache):
    """The engine's KV cache: preallocated per layer, O(1) rollback (`rollback(n)` moves a pointer).

    `StaticKVCache(num_layers, capacity)` or `StaticKVCache.for_model(model, capacity)`; pass it as
    `past_key_values` like any transformers cache. Rolled-back positions keep stale values that
    no forward reads: the next write overwrites them."""

    def __init__(self, num_layers: int, capacity: int = CHUNK):
        if not isinstance(num_layers, int) or num_layers < 1 or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"StaticKVCache needs num_layers >= 1 and capacity >= 1, got {num_layers!r}, {capacity!r}")
        super().__init__(layers=[PreallocatedLayer(capacity, self) for _ in range(num_layers)])
        self.keys = self.values = None  # [layers, batch, KV heads, capacity, head_dim], allocated at the first write

    def allocate(self, batch: int, kv_heads: int, head_dim: int, dtype, device) -> None:
        """Allocate the stacked buffers for every layer (zeros), at the current capacity."""
        with torch.inference_mode(False):  # normal tensors: writable in and out of inference mode
            self.keys = torch.zeros(len(self.layers), batch, kv_heads, self.capacity, head_dim, dtype=dtype,
                                    device=device)
            self.values = torch.zeros_like(self.keys)
        self._point_layers()

    def _point_layers(self) -> None:
        """Each layer's `keys`/`values`: its slice of the stacked buffers."""
        for i, layer in enumerate(self.layers):
            layer.keys, layer.values = self.keys[i], self.values[i]
            layer.capacity, layer.dtype, layer.device = self.keys.shape[3], self.keys.dtype, self.keys.device
            layer.is_initialized = True

    @classmethod
    def for_model(cls, model, capacity: int = CHUNK) -> StaticKVCache:
        return cls(model.config.num_hidden_layers, -(-max(capacity, 1) // CHUNK) * CHUNK)

    @property
    def length(self) -> int:
        return self.layers[0].length

    @property
    def capacity(self) -> int:
        return self.layers[0].capacity

    def rollback(self, length: int) -> None:
        """Keep the first `length` positions: O(1), nothing is copied or freed."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll a cache of {self.length} positions back to {length}; "
                             f"allowed: 0 <= length <= {self.length}")
        for layer in self.layers:
            layer.length = length

    def advance(self, n: int) -> None:
        """Count `n` positions written by a graphed forward (the graph wrote them; Python did not)."""
        for layer in self.layers:
            layer.length += n

    def set_slots(self, slots: torch.Tensor | None) -> None:
        """Graphed mode on (a tensor of the positions each forward writes) or off (None)."""
        for layer in self.layers:
            layer.slots = slots

    def reserve(self, capacity: int) -> None:
        """Make room for `capacity` positions now, rounded up to a multiple of CHUNK: the buffers, if they exist, are
        reallocated and every position copied over (new addresses: a graph recorded on the old ones must go)."""
        if capacity <= self.capacity:
            return
        capacity = -(-capacity // CHUNK) * CHUNK
        if self.keys is None:
            for layer in self.layers:
                layer.capacity = capacity
            return
        old = (self.keys, self.values)
        with torch.inference_mode(False):
            self.keys, self.values = (buffer.new_zeros(*buffer.shape[:3], capacity, buffer.shape[-1]) for buffer in old)
        for new, buffer in zip((self.keys, self.values), old):
            new[..., :buffer.shape[3], :] = buffer
        self._point_layers()


def supports_static_cache(model) -> bool:
    """True for a transformers decoder (the course's target, drafts, a random Llama); False for the
    toy models of the exactness tests and the n-gram "model", which keep their own tuple caches."""
    return isinstance(model, PreTrainedModel) and isinstance(getattr(model.config, "num_hidden_layers", None), int)
