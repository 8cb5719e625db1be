"""CUDA graphs for the engine's forwards (notebook 08): record a model step once, replay it.

An eager forward of a 30-layer model issues ~1,000 kernel launches, and on a GPU a 135M-parameter
model spends far longer launching them than running them. A CUDA graph records the launches once
and replays them in one call. A graph fixes everything it touched: tensor shapes and addresses. So:

- the KV cache is the preallocated `StaticKVCache` (fixed addresses); a graphed forward writes its
  keys and values at `slots = start + arange(n)` and attends over the whole buffer under the mask
  `key position <= query position` (fixed shapes), with `start` a one-element tensor set before
  each replay;
- one graph per (cache buffers, tokens fed n, logits kept): the target's verification pass has n = k + 1
  tokens for k in 0..gamma, a draft step n = 1 or 2: a handful of graphs, captured on first use;
- the prefill (a new cache, or a reused one rolled back to 0), longer inputs, token-tree passes (their masks are not causal) and any forward whose
  hidden states a hook reads (Medusa, hidden-state policies) run eagerly on the same cache.

`enable_cuda_graphs(model)` switches a model over (GPU only); the engine needs no other change:
`forward_uncached` hands a graph-enabled model's forwards to its runner. Forward hooks on the
model itself (the bench's call counter) are called after each replay with the logits.
"""
from __future__ import annotations

import sys
from types import SimpleNamespace

import torch

from .static_cache import CHUNK, StaticKVCache

MAX_GRAPH_TOKENS = 16  # forwards of more tokens run eagerly (the prefill, long catch-ups)


class _Graph:
    def __init__(self, graph, ids, start, logits):
        self.graph, self.ids, self.start, self.logits = graph, ids, start, logits


class GraphRunner:
    """Owns a model's CUDA graphs. `new_cache(tokens)` hands out `StaticKVCache`s of `capacity`
    positions; `forward(cache, new_ids, num_logits)` replays (capturing first if needed) or returns
    None when that forward must run eagerly."""

    def __init__(self, model, capacity: int = 0, max_tokens: int = MAX_GRAPH_TOKENS, capture: bool = True):
        self.model, self.capacity, self.max_tokens = model, capacity, max_tokens
        self.capture = capture  # False: run `static_forward` without recording it (CPU tests)
        self.graphs: dict[tuple, _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.captures = 0
        self.caches: list[StaticKVCache] = []  # graphs are recorded against these buffers: reuse them
        self._submodules = [m for m in model.modules() if m is not model]

    def new_cache(self, tokens: int) -> StaticKVCache:
        """A cache for a new generation: a pooled one nobody else holds any more (so its graphs are
        replayed again, not re-captured), rolled back to 0; a new one if all are in use."""
        for cache in self.caches:
            if sys.getrefcount(cache) <= 3:  # held only by this list, this loop and getrefcount
                cache.rollback(0)
                cache.reserve(tokens + CHUNK)
                return cache
        cache = StaticKVCache.for_model(self.model, max(self.capacity, tokens + CHUNK))
        cache.graph_id = len(self.caches)
        self.caches.append(cache)
        return cache

    def _hooked(self) -> bool:
        return any(m._forward_hooks or m._forward_pre_hooks for m in self._submodules)

    def forward(self, cache, new_ids: torch.Tensor, num_logits: int):
        n = new_ids.shape[1]
        if (not isinstance(cache, StaticKVCache) or not hasattr(cache, "graph_id") or not cache.length
                or not 1 <= n <= self.max_tokens or cache.length + n > cache.capacity or self._hooked()):
            return None
        key = (cache.graph_id, cache.layers[0].keys.data_ptr(), n, num_logits)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = self._capture(cache, new_ids, num_logits)
        graph.ids.copy_(new_ids)
        graph.start.fill_(cache.length)
        if graph.graph is not None:
            graph.graph.replay()
            logits = graph.logits.clone()  # the next replay overwrites the graph's output
        else:
            logits = static_forward(self.model, cache, graph.ids, graph.start, num_logits)
        cache.advance(n)
        for hook in self.model._forward_hooks.values():
            hook(self.model, (), SimpleNamespace(logits=logits[None]))
        return logits

    def _capture(self, cache, new_ids, num_logits) -> _Graph:
        ids = new_ids.clone()
        start = torch.full((), cache.length, dtype=torch.long, device=new_ids.device)

        if not self.capture:  # the same forward, run but not recorded: how the CPU tests check its arithmetic
            return _Graph(None, ids, start, None)

        def step():
            return static_forward(self.model, cache, ids, start, num_logits)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the graph (it writes the same keys the replay will)
            step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = step()
        self.captures += 1
        return _Graph(graph, ids, start, logits)


def static_forward(model, cache: StaticKVCache, ids: torch.Tensor, start: torch.Tensor, num_logits: int):
    """The graphed step: feed `ids` [1, n] at positions start..start+n-1, writing their keys and
    values at those slots of `cache` and attending over its whole buffer with the causal mask
    `key position <= query position` (stale positions past the query are masked, never read).
    Every shape and address is fixed by (cache, n, num_logits): a CUDA graph can record it."""
    slots = start + torch.arange(ids.shape[1], device=ids.device)
    key_positions = torch.arange(cache.capacity, device=ids.device)
    mask = (key_positions[None, :] <= slots[:, None])[None, None]  # [1, 1, n, capacity]
    cache.set_slots(slots)
    try:
        out = model(input_ids=ids, position_ids=slots[None], attention_mask=mask,
                    past_key_values=cache, use_cache=True, logits_to_keep=num_logits)
    finally:
        cache.set_slots(None)
    return out.logits[0, -num_logits:]


def enable_cuda_graphs(model, capacity: int = 0, max_tokens: int = MAX_GRAPH_TOKENS) -> GraphRunner:
    """Replay `model`'s decode steps from CUDA graphs from now on. Returns the runner.
    A cache holds at least `capacity` positions, and the prompt + CHUNK: a graphed step attends over
    the whole buffer, so a buffer much larger than the text costs attention time for nothing (the
    first profile of notebook 08 found a third of the GPU time there with 1,024 positions). A
    cache that fills up grows, and its graphs are captured again. GPU only: on a CPU this raises one line."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        raise ValueError(f"CUDA graphs need the model on a CUDA GPU; this one is on {device.type} "
                         "(the engine runs eagerly there, with the same static cache)")
    if not (isinstance(capacity, int) and capacity >= 0 and isinstance(max_tokens, int) and max_tokens >= 1):
        raise ValueError(f"capacity must be an integer >= 0 and max_tokens >= 1, got {capacity!r}, {max_tokens!r}")
    runner = GraphRunner(model, capacity, max_tokens)
    model._specdec_graphs = runner
    return runner


def disable_cuda_graphs(model) -> None:
    """Back to eager forwards (the captured graphs are freed)."""
    model.__dict__.pop("_specdec_graphs", None)
