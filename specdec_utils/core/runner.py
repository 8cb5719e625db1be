"""A runner per model: it owns the model's KV cache and CUDA graphs, and runs its forwards.

The decode loop and the proposers never hold a `(model, cache)` pair: they hold runners.

    runner = ModelRunner(model)                  # eager (CPU, or a GPU without graphs)
    runner = ModelRunner(model, graphs=True)     # a CUDA GPU: decode steps replayed from CUDA graphs
    runner.begin()                               # a new generation: the cache rolled back to 0
    logits = runner.forward(tokens, num_logits)  # feed what the cache has not seen (the prefill first)
    logits = runner.forward_tree(tokens, nodes, parents, num_logits=...)   # a token tree (notebook 06)
    runner.commit(prefix, path, length)          # keep the accepted path after the prefix, drop the rest

The stateless forms, a model and its cache in and out: `forward_uncached` (a plain forward) and `forward_tree`
(one forward over a token tree, with tree positions and mask: notebook 06's verification pass).

`forward*(..., hidden="norm" | "head")` also returns that hidden state (`hidden.py`). The cache is the
preallocated `StaticKVCache` (notebook 09) for a transformers decoder, `cache="dynamic"` for
transformers' own `DynamicCache` (to compare), and the model's own tuple cache for the toy models of
the tests. A runner is used by one generation at a time; a target that drafts for itself gets two
runners (two caches), never one cache twice.

**Graphs** (`graphs=True`, CUDA only). A CUDA graph records a step's kernel launches once and replays
them in one call; it fixes every shape and address it touched. So a graphed step writes its keys and
values at `slots = start + arange(n)` of the whole preallocated buffer and attends over all of it under
the mask `key position <= query position` (`static_forward`), with `start` a one-element tensor set
before each replay. One graph per (tokens fed n, logits kept, cache capacity, cache epoch): the target's
verification pass has n = k + 1 for k in 0..gamma, a draft step n = 1 or 2. The cache's buffers are
replaced when it grows: its epoch moves on and every graph of the old buffers is dropped. The prefill,
longer inputs, tree passes and forwards that must return a hidden state (a replay runs no Python hooks)
run eagerly on the same cache.
"""
from __future__ import annotations

import sys
from contextlib import nullcontext

import torch

from .graphs import GraphCache, StaticStep, record_cuda_graph  # noqa: F401 (record_cuda_graph: re-exported, importers use it)
from .kv_cache import cache_length, gather_cache, trim_cache
from .static_cache import CHUNK, StaticKVCache, supports_static_cache
from .tree import check_parents, is_chain, tree_allowed, tree_mask

MAX_GRAPH_TOKENS = 16  # forwards of more tokens run eagerly (the prefill, long catch-ups)
CACHES = ("static", "dynamic")


def forward_uncached(model, tokens: torch.Tensor, cache, num_logits: int = 1):
    """Run `model` on the tokens of `tokens` [1, seq_len] that `cache` has not seen yet (all of
    them when `cache` is None: the prefill, which starts a preallocated `StaticKVCache` for a
    transformers model). Return the last `num_logits` logits [num_logits, V] and the grown cache;
    positions follow from the cache length. (The stateless form of `ModelRunner.forward`.)"""
    if cache is None:
        cache = new_cache(model, tokens.shape[1])
    seen = cache_length(cache)
    out = model(input_ids=tokens[:, seen:], past_key_values=cache, use_cache=True, logits_to_keep=num_logits)
    return out.logits[0, -num_logits:], out.past_key_values


def forward_tree(model, tokens: torch.Tensor, nodes: torch.Tensor, parents: torch.Tensor, cache, fed: int = 0,
                 num_logits: int | None = None):
    """Run `model` on what its cache lacks, in one forward with tree positions and mask: the
    uncached committed tokens of `tokens` [1, L] (if any), then tree nodes `fed:` (the cache holds
    the committed tokens and nodes `:fed` when `fed` > 0). Returns (logits of the last
    `num_logits` inputs [num_logits, V], the grown cache). For the target (newest token uncached,
    fed = 0, num_logits = T + 1) row 0 is the root's distribution and row 1 + i node i's.
    (The stateless form of `ModelRunner.forward_tree`.)"""
    check_parents(parents)
    if cache is None:
        cache = new_cache(model, tokens.shape[1] + len(parents))
    seen = cache_length(cache)
    L = tokens.shape[1]
    if seen < L and fed == 0:
        new = tokens[:, seen:]
    elif seen == L + fed:
        new = tokens[:, :0]
    else:
        raise ValueError(f"a cache of {seen} positions cannot precede a tree pass over {L} committed tokens "
                         f"with {fed} nodes cached")
    device = tokens.device
    node_ids = nodes.to(device)
    ancestry = tree_mask(parents.to(device))  # computed once: the depths and the mask both read it
    positions = torch.cat([torch.arange(L - new.shape[1], L, device=device), L - 1 + ancestry.sum(-1)[fed:]])
    dtype = next(model.parameters()).dtype
    mask = tree_allowed(ancestry, L, new.shape[1], fed, dtype if dtype.is_floating_point else torch.float32)[None, None]
    n_in = new.shape[1] + len(node_ids) - fed
    num_logits = n_in if num_logits is None else num_logits
    # the Triton backends (notebook 08) read the parents, not the mask: `tree_kwargs` passes them
    out = model(input_ids=torch.cat([new, node_ids[None, fed:]], dim=1), attention_mask=mask,
                position_ids=positions[None], past_key_values=cache, use_cache=True, logits_to_keep=num_logits,
                **tree_kwargs(model, new.shape[1], parents, fed, device, seen))
    return out.logits[0, -num_logits:], out.past_key_values


def tree_kwargs(model, n_committed: int, parents: torch.Tensor, fed: int, device, cache_len: int) -> dict:
    """What a tree pass passes to a model running one of the Triton backends (`tree_attention.tree_kwargs`: the
    pass's parents), else nothing. Those backends exist once `tree_attention` is imported (importing it registers
    them with transformers, and `use_backend` switches a model to one), so until then no model can run one and
    this imports nothing: the Triton module is imported by whoever asks for its attention, never by the runner."""
    tree_attention = sys.modules.get(f"{__package__}.tree_attention")
    if tree_attention is None:
        return {}
    return tree_attention.tree_kwargs(model, n_committed, parents, fed, device, cache_len)


def new_cache(model, tokens: int, kind: str = "static"):
    """The cache a first forward over `tokens` positions starts from: a `StaticKVCache` with room to
    spare for a transformers decoder; None otherwise, or with kind "dynamic" (the model then builds its
    own: transformers' `DynamicCache`, or a toy model's tuples)."""
    if kind != "static" or not supports_static_cache(model):
        return None
    return StaticKVCache.for_model(model, tokens + CHUNK)


def attention_backends(device, avoid_cudnn: bool = True):
    """On a CUDA GPU, let SDPA choose among flash, memory-efficient and math attention but not cuDNN.
    PyTorch prefers cuDNN's attention on recent GPUs, and cuDNN builds (and caches) an execution plan
    for every new (query length, key length): speculative decoding makes new ones every round, so
    each round paid milliseconds of plan building (notebook 09 profiles it). Elsewhere: no change."""
    if device.type != "cuda" or not avoid_cudnn:
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class ModelRunner:
    """Owns one model's cache (and its CUDA graphs with `graphs=True`) and runs its forwards.

    `capacity`: positions a cache holds at least (a graphed step attends over the whole buffer, so a
    buffer much larger than the text costs attention time for nothing); `max_graph_tokens`: longer
    forwards run eagerly; `cache`: "static" (the course's preallocated cache) or "dynamic"
    (transformers' `DynamicCache`, eager only); `avoid_cudnn`: see `attention_backends`."""
    # the attention implementations the graphed step's own 4D mask works with (`static_forward`); None: any
    GRAPH_ATTENTION: tuple | None = ("sdpa", "eager")

    def __init__(self, model, graphs: bool = False, capacity: int = 0, max_graph_tokens: int = MAX_GRAPH_TOKENS,
                 cache: str = "static", avoid_cudnn: bool = True, record: bool = True):
        if isinstance(model, ModelRunner):
            raise ValueError("ModelRunner takes a model, got a ModelRunner: use that runner itself")
        if cache not in CACHES:
            raise ValueError(f"cache must be one of {', '.join(CACHES)}, got {cache!r}")
        if not (isinstance(capacity, int) and capacity >= 0 and isinstance(max_graph_tokens, int)
                and max_graph_tokens >= 1):
            raise ValueError(f"capacity must be an integer >= 0 and max_graph_tokens >= 1, got {capacity!r}, "
                             f"{max_graph_tokens!r}")
        self.model, self.kind, self.capacity, self.max_graph_tokens = model, cache, capacity, max_graph_tokens
        self.avoid_cudnn = avoid_cudnn
        self.device = _device_of(model)
        self.graphed = bool(graphs)
        if self.graphed:
            if self.device.type != "cuda" and record:
                raise ValueError(f"CUDA graphs need the model on a CUDA GPU; this one is on {self.device.type} "
                                 "(run it with graphs=False: the same static cache, eagerly)")
            if cache != "static" or not supports_static_cache(model):
                raise ValueError("CUDA graphs need the static cache of a transformers decoder "
                                 f"({type(model).__name__}, cache={cache!r})")
            attention = _attention(model)
            if self.GRAPH_ATTENTION is not None and attention not in self.GRAPH_ATTENTION:
                raise ValueError(f"the graphed step passes a 4D attention mask, which {attention!r} attention cannot "
                                 'take: call model.set_attn_implementation("sdpa") first')
        self.record = record  # False: `static_forward` runs unrecorded (notebook 09 and CPU tests check it so)
        self.cache = None
        self.graphs = GraphCache()  # key -> StaticStep, and their pool: dropped together when the buffers change
        self.replays = 0      # forwards served by a graph
        self.forwards = 0     # forwards run (replays included)

    @property
    def epoch(self) -> int:
        """Moves on when the cache's buffers are replaced (its graphs die with them)."""
        return self.graphs.epoch

    @property
    def captures(self) -> int:
        """Graphs recorded so far."""
        return self.graphs.captures

    # ------------------------------------------------------------------ state
    @property
    def length(self) -> int:
        """Positions the cache holds."""
        return cache_length(self.cache)

    def begin(self, prompt_len: int = 0) -> None:
        """A new generation starts: keep the cache's buffers (and graphs), hold nothing."""
        if isinstance(self.cache, StaticKVCache):
            self.cache.rollback(0)
            self._reserve(prompt_len + CHUNK)
        else:
            self.cache = None

    def rollback(self, length: int) -> None:
        """Keep the first `length` positions (0..what the cache holds; `keep_at_most` clamps instead)."""
        self._check_keep(length)
        self.cache = trim_cache(self.cache, length)

    def keep_at_most(self, length: int) -> None:
        """Keep the first `length` positions, or all the cache holds if that is fewer (a draft after a fully
        accepted round: its cache lacks its own last proposal)."""
        self.rollback(min(self.length, length))

    def _check_keep(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length} positions: the cache holds {self.length} "
                             f"(0 <= length <= {self.length}; keep_at_most(n) clamps)")

    def commit(self, prefix: int, path, length: int) -> None:
        """Keep the first `prefix` positions then the positions `prefix + path` (the accepted nodes of a
        tree, in order), moved into place, then cut at `length`. For a chain the path is already in
        place and only the pointer moves."""
        keep = torch.as_tensor(list(path), dtype=torch.long)
        self.cache = gather_cache(self.cache, prefix, keep)
        self.cache = trim_cache(self.cache, length)

    # ------------------------------------------------------------------ forwards
    def forward(self, tokens: torch.Tensor, num_logits: int = 1, hidden: str | None = None):
        """Feed the tokens of `tokens` [1, L] the cache has not seen; return the last `num_logits`
        logits [num_logits, V] (and the hidden state [n, H] at `hidden`, if asked)."""
        self.forwards += 1
        if self.cache is None:
            self.cache = new_cache(self.model, tokens.shape[1] + self.capacity, self.kind)
        seen = self.length
        new = tokens[:, seen:]
        if hidden is None and self._graphable(new.shape[1]):
            return self._replay(new, num_logits)
        with self._capture(hidden) as captured, attention_backends(self.device, self.avoid_cudnn):
            out = self.model(input_ids=new, past_key_values=self.cache, use_cache=True, logits_to_keep=num_logits)
        self._adopt(out.past_key_values)
        logits = out.logits[0, -num_logits:]
        return logits if hidden is None else (logits, captured[0][0])

    def forward_tree(self, tokens: torch.Tensor, nodes: torch.Tensor, parents: torch.Tensor, fed: int = 0,
                     num_logits: int | None = None, hidden: str | None = None):
        """One forward over what the cache lacks of `tokens` [1, L] then tree nodes `fed:` (tree
        positions and mask, `forward_tree`); a chain (parents = arange(T) - 1, nothing cached of
        it) is an ordinary causal forward, graphed where it can be. Returns the last `num_logits`
        logits (and the hidden state at `hidden`)."""
        if fed == 0 and is_chain(parents):
            return self.forward(torch.cat([tokens, nodes.to(tokens.device)[None]], dim=1),
                                len(nodes) + 1 if num_logits is None else num_logits, hidden)
        self.forwards += 1
        if self.cache is None:
            self.cache = new_cache(self.model, tokens.shape[1] + len(parents) + self.capacity, self.kind)
            if self.cache is None and self.kind == "dynamic" and supports_static_cache(self.model):
                from transformers import DynamicCache
                self.cache = DynamicCache()  # given None, forward_tree would start a static cache
        with self._capture(hidden) as captured, attention_backends(self.device, self.avoid_cudnn):
            logits, cache = forward_tree(self.model, tokens, nodes, parents, self.cache, fed, num_logits)
        self._adopt(cache)
        return logits if hidden is None else (logits, captured[0][0])

    # ------------------------------------------------------------------ internals
    def _capture(self, hidden):
        if hidden is None:
            return nullcontext([])
        from .hidden import capture_hidden
        return capture_hidden(self.model, hidden)

    def _adopt(self, cache) -> None:
        """Take the cache a forward returned; a static cache that grew has new buffers: drop their graphs."""
        if isinstance(cache, StaticKVCache) and self.graphs and self._buffers_changed(cache):
            self._drop_graphs()
        self.cache = cache

    def _buffers_changed(self, cache) -> bool:
        return cache.capacity != self._graph_capacity

    def _reserve(self, capacity: int) -> None:
        before = self.cache.capacity
        self.cache.reserve(capacity)
        if self.cache.capacity != before:
            self._drop_graphs()

    def _drop_graphs(self) -> None:
        self.graphs.invalidate()  # the graphs and their pool: a pool whose graphs are all freed takes no new capture

    def _graphable(self, n: int) -> bool:
        cache = self.cache
        return (self.graphed and isinstance(cache, StaticKVCache) and cache.length > 0
                and 1 <= n <= self.max_graph_tokens and cache.length + n <= cache.capacity)

    def _replay(self, new_ids: torch.Tensor, num_logits: int) -> torch.Tensor:
        cache, n = self.cache, new_ids.shape[1]
        if self.graphs and cache.capacity != self._graph_capacity:  # grown since the graphs were recorded
            self._drop_graphs()
        key = (n, num_logits, cache.capacity, self.epoch)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = self._record(new_ids, num_logits)
            self._graph_capacity = cache.capacity
        graph.ids.copy_(new_ids)
        graph.start.fill_(cache.length)
        if graph.graph is not None:
            graph.graph.replay()
            logits = graph.outputs.clone()  # the next replay overwrites the graph's output
        else:
            logits = static_forward(self.model, cache, graph.ids, graph.start, num_logits)
        cache.advance(n)
        self.replays += 1
        return logits

    _graph_capacity = -1

    def _record(self, new_ids, num_logits) -> StaticStep:
        cache = self.cache
        recorded = StaticStep(ids=new_ids.clone(),
                              start=torch.full((), cache.length, dtype=torch.long, device=new_ids.device))
        if not self.record:
            return recorded

        def step():
            with attention_backends(self.device, self.avoid_cudnn):
                return static_forward(self.model, cache, recorded.ids, recorded.start, num_logits)

        recorded.graph, recorded.outputs = self.graphs.record(step)
        return recorded


def static_forward(model, cache: StaticKVCache, ids: torch.Tensor, start: torch.Tensor, num_logits: int):
    """The graphed step: feed `ids` [1, n] at positions start..start+n-1, writing their keys and
    values at those slots of `cache` and attending over its whole buffer with the causal mask
    `key position <= query position` (stale positions past the query are masked, never read).
    Every shape and address is fixed by (cache buffers, n, num_logits): a CUDA graph can record it."""
    slots = start + torch.arange(ids.shape[1], device=ids.device)
    key_positions = torch.arange(cache.capacity, device=ids.device)
    mask = (key_positions[None, :] <= slots[:, None])[None, None]  # [1, 1, n, capacity]
    if _attention(model) != "sdpa":  # eager attention adds a 4D mask to the scores: 0 where seen, the dtype's min
        mask = torch.zeros_like(mask, dtype=model.dtype).masked_fill_(~mask, torch.finfo(model.dtype).min)
    cache.set_slots(slots)
    try:
        out = model(input_ids=ids, position_ids=slots[None], attention_mask=mask,
                    past_key_values=cache, use_cache=True, logits_to_keep=num_logits)
    finally:
        cache.set_slots(None)
    return out.logits[0, -num_logits:]


def as_runner(model_or_runner, **options) -> ModelRunner:
    """A runner for a model (a new, eager one), or the runner itself."""
    if isinstance(model_or_runner, ModelRunner):
        return model_or_runner
    return ModelRunner(model_or_runner, **options)


def _attention(model) -> str | None:
    """The attention implementation of a transformers model ("sdpa", "eager", ...; None for another model)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def _device_of(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return torch.device("cpu")
