"""A Llama decoder in plain torch, and a runner that replays its steps (chains and token trees) from CUDA graphs.

transformers' Llama forward launches ~1250 kernels per step for the course's 30-layer target (notebook 09): a
CUDA graph removes their launch cost but not their count, and a step stays at ~3.6 ms on an H100 while the
weights could be read in ~0.09 ms. The same arithmetic written out by hand (`PlainLlama`: fused q/k/v and
gate/up projections, one KV buffer for all layers) launches fewer kernels, and `torch.compile` fuses the
norms, rotary embedding, SiLU and residual adds into a few more (step_bench: 1100 and 448 kernels).

`PlainRunner` is a `runner.ModelRunner` for such a target (or draft): the same interface (`forward`,
`forward_tree`, `commit`, `rollback`, `hidden=`), its own cache, and **one forward for everything**: every
pass feeds n tokens at explicit positions, writes their keys and values at cache slots `length..length+n-1`
and attends under an explicit boolean mask over the whole buffer:

    a chain step      positions length..length+n-1, causal mask
    a token tree      node i at slot L + i and position L - 1 + depth(i), sees the prefix and its ancestors

So a tree pass is graphed exactly like a chain step: with `graphs=True` each pass is padded to a budget
(1, 2, 4, 8, 16, 32, 64 tokens; a pad row sees only itself and is never kept), the ids, positions, slots
and mask are copied into the graph's static inputs, and one replay runs the whole pass. One graph per
budget (and set of hidden layers asked for). The graph returns the logits of every row and the hidden
states the drafts read (the final norm's input and output, and the input of any decoder layers: EAGLE's
features), so Medusa's and EAGLE's heads no longer force an eager pass. `compile=True` first compiles the
step with `torch.compile`. Longer forwards (the prefill) run eagerly on the same buffers.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F

from .graphs import StaticStep
from .kv_cache import move_path
from .runner import ModelRunner, attention_backends
from .static_cache import CHUNK, StaticKVCache
from .tree import check_parents, is_chain, tree_allowed, tree_mask
from .tree_attention import block_attention

BUDGETS = (1, 2, 4, 8, 16, 32, 64)


def check_plain_llama(config) -> None:
    """Refuse, with one line, a model whose arithmetic `PlainLlama` does not reproduce."""
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    if config.model_type != "llama":
        raise ValueError(f"the plain-torch decoder needs a plain Llama; got model_type={config.model_type!r}")
    if (rope.get("rope_type", rope.get("type", "default")) != "default"
            or theta is None or config.hidden_act != "silu" or getattr(config, "attention_bias", False)
            or getattr(config, "mlp_bias", False)):
        raise ValueError(f"the plain-torch decoder needs a plain Llama (default rotary embedding, SiLU, no biases); "
                         f"got model_type={config.model_type!r}, rope={rope}, hidden_act={config.hidden_act!r}")


def _theta(config) -> float:
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    return float(rope.get("rope_theta", getattr(config, "rope_theta", None)))


class PlainLlama:
    """A Llama model's weights (RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP, as transformers'
    `LlamaForCausalLM` computes them) and a KV buffer [layers, batch, kv_heads, capacity, head_dim] (the stacked
    buffers of a `static_cache.StaticKVCache`, the engine's own), in plain torch: every shape and address is
    fixed by (batch, tokens fed, capacity), so a step can be compiled and recorded as a CUDA graph. The weights
    are the model's own tensors (fused copies for q/k/v and gate/up)."""

    def __init__(self, model, batch: int, capacity: int):
        config = model.config
        check_plain_llama(config)
        body = model.model
        self.embed, self.norm = body.embed_tokens.weight.detach(), body.norm.weight.detach()
        self.head = model.get_output_embeddings().weight.detach()  # the embedding itself when tied
        self.device, self.dtype = self.embed.device, self.embed.dtype
        self.batch, self.eps, self.theta = batch, config.rms_norm_eps, _theta(config)
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.layers = [tuple(w.detach() for w in (
            layer.input_layernorm.weight, torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
            a.o_proj.weight, layer.post_attention_layernorm.weight,
            torch.cat([m.gate_proj.weight, m.up_proj.weight]), m.down_proj.weight))
            for layer in body.layers for a, m in [(layer.self_attn, layer.mlp)]]
        # a reduced-vocabulary draft (`models.ReducedVocabLlamaForCausalLM`) reads and writes full-vocabulary ids
        self.to_draft = getattr(model, "full_to_draft", None)
        self.to_full = getattr(model, "draft_to_full", None)
        self.full_vocab = getattr(config, "full_vocab_size", None)
        self.cache = StaticKVCache(len(self.layers), capacity)
        self.cache.allocate(batch, self.kv_heads, self.head_dim, self.dtype, self.device)
        self._rotary()

    @property
    def keys(self) -> torch.Tensor:
        return self.cache.keys

    @property
    def values(self) -> torch.Tensor:
        return self.cache.values

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    def grow(self, capacity: int) -> None:
        """Room for `capacity` positions (buffers reallocated, the cache copied; rotary tables extended)."""
        if capacity <= self.capacity:
            return
        self.cache.reserve(capacity)
        self._rotary()

    def _rotary(self) -> None:
        """The rotary tables (cos, sin) for every position the buffers hold."""
        inv_freq = 1.0 / self.theta ** (torch.arange(0, self.head_dim, 2, device=self.device).float() / self.head_dim)
        angles = torch.arange(self.capacity, device=self.device).float()[:, None] * inv_freq[None]
        angles = torch.cat([angles, angles], -1)
        self.cos, self.sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    def rms(self, x, weight):
        x32 = x.float()
        return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def body(self, ids, positions, slots, mask, window: int, taps: tuple = (), block=None):
        """Feed `ids` [B, T] at rotary `positions` [B, T], writing their keys and values at cache slots
        `slots` [T] (a device tensor) and attending over slots 0..window-1 where `mask` [B, T, window]
        (bool) allows. Returns (the final norm's input x [B, T, H], [the input of each layer in `taps`:
        an index equal to the number of layers is x itself]). `block` = (start, block mask [T, T], splits)
        instead of `mask`: the rows sit at slots start..start+T-1 and see every slot before them and the rows'
        keys the block mask allows, computed by the Triton kernel `tree_attention.block_attention`."""
        B, T = ids.shape
        H, KV, D = self.heads, self.kv_heads, self.head_dim
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]
        # G = H // KV query heads share a key/value head: they become G * T query rows of it, so the cache
        # is read once, never copied
        if block is None:
            mask = mask[:, None, None].expand(B, 1, H // KV, T, window).reshape(B, 1, -1, window)
        x = self.embed[ids if self.to_draft is None else self.to_draft[ids]]
        tapped = {}
        for i, (norm1, qkv, o, norm2, gate_up, down) in enumerate(self.layers):
            if i in taps:
                tapped[i] = x
            heads = F.linear(self.rms(x, norm1), qkv).view(B, T, H + 2 * KV, D).transpose(1, 2)
            qk = heads[:, :H + KV]  # queries and keys rotate together: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
            qk = qk * cos + torch.cat([-qk[..., D // 2:], qk[..., :D // 2]], -1) * sin
            q = qk[:, :H]
            self.keys[i].index_copy_(2, slots, qk[:, H:])
            self.values[i].index_copy_(2, slots, heads[:, H + KV:])
            if block is None:
                att = F.scaled_dot_product_attention(q.reshape(B, KV, -1, D), self.keys[i][:, :, :window],
                                                     self.values[i][:, :, :window], attn_mask=mask)
            else:
                att = block_attention(q, self.keys[i], self.values[i], *block)
            x = x + F.linear(att.reshape(B, H, T, D).transpose(1, 2).reshape(B, T, H * D), o)
            gate, up = F.linear(self.rms(x, norm2), gate_up).chunk(2, -1)
            x = x + F.linear(F.silu(gate) * up, down)
        tapped[len(self.layers)] = x
        return x, [tapped[i] for i in taps]

    def logits(self, x):
        return self.head_logits(self.rms(x, self.norm))

    def head_logits(self, post):
        """The output head on the final norm's output; a reduced vocabulary's logits scattered into the full one
        (every other token at the dtype's lowest value, as the draft's own forward does)."""
        logits = F.linear(post, self.head)
        if self.to_full is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.full_vocab), torch.finfo(logits.dtype).min)
        return full.index_copy_(-1, self.to_full, logits[..., :-1])

    def step(self, ids, positions, slots, mask, taps: tuple = ()):
        """A whole-buffer pass (the graphed step): (logits, final norm input, final norm output, taps) of
        every row. `mask` [B, T, capacity]."""
        x, tapped = self.body(ids, positions, slots, mask, self.capacity, taps)
        post = self.rms(x, self.norm)
        return (self.head_logits(post), x, post, *tapped)


class PlainRunner(ModelRunner):
    """A `ModelRunner` for a plain Llama (the course's target and drafts) on `PlainLlama`'s forward.

    `graphs=True` (CUDA): every pass of at most max(budgets) tokens, chain or tree, hidden states or not,
    is padded to the next budget and replayed from a CUDA graph; `compile=True`: the step goes through
    `torch.compile` first (CUDA only; minutes of compiling, once per budget). `record=False` runs the
    padded whole-buffer step without recording it (how notebook 09 and the CPU tests check its arithmetic).
    Greedy output equals transformers' forward up to floating-point rounding (float32: the same tokens)."""
    GRAPH_ATTENTION = None  # its own attention, whatever implementation the transformers model was loaded with

    def __init__(self, model, graphs: bool = False, capacity: int = 0, compile: bool = False,
                 budgets: tuple = BUDGETS, taps: tuple = (), record: bool = True):
        if isinstance(model, ModelRunner):
            raise ValueError("PlainRunner takes a model, got a runner: use that runner itself")
        config = getattr(model, "config", None)
        if config is None:
            raise ValueError(f"PlainRunner needs a transformers Llama model, got {type(model).__name__}")
        check_plain_llama(config)
        budgets = tuple(sorted(set(budgets)))
        if not budgets or not all(isinstance(b, int) and b >= 1 for b in budgets):
            raise ValueError(f"budgets must be integers >= 1, got {budgets!r}")
        super().__init__(model, graphs=graphs, capacity=capacity, max_graph_tokens=budgets[-1], record=record)
        if compile and (not self.graphed or self.device.type != "cuda"):
            raise ValueError("compile=True needs graphs=True on a CUDA GPU (the compiled step is replayed from a "
                             "CUDA graph)")
        self.compiled, self.budgets = bool(compile), budgets
        self.taps = self._taps(tuple(taps)) if taps else ()  # layer inputs every graph returns (EAGLE's features)
        self.core: PlainLlama | None = None
        self.pos = 0
        self._step = None

    # ------------------------------------------------------------------ state
    @property
    def length(self) -> int:
        return self.pos

    def begin(self, prompt_len: int = 0) -> None:
        self.pos = 0
        self._room(max(self.capacity, prompt_len + CHUNK))

    def rollback(self, length: int) -> None:
        self._check_keep(length)
        self.pos = length

    def commit(self, prefix: int, path, length: int) -> None:
        """`ModelRunner.commit`: keep `prefix` positions, then the fed nodes `path` moved into place, cut at `length`
        (below prefix + len(path) when the round ended at an EOS). Raises for a node that was not fed or a cut past
        the kept positions."""
        path = [int(p) for p in path]
        fed = self.pos - prefix  # the nodes in the cache after the prefix
        if prefix < 0 or len(path) > fed or any(not 0 <= p < fed for p in path):
            raise ValueError(f"cannot commit path {path} after {prefix} positions of a cache holding {self.pos}; "
                             f"allowed: 0 <= prefix, at most {max(fed, 0)} nodes, each in 0..{fed - 1}")
        if not 0 <= length <= prefix + len(path):
            raise ValueError(f"cannot cut the committed cache at {length}; allowed: 0 <= length <= prefix + len(path) "
                             f"= {prefix + len(path)}")
        if path != list(range(len(path))):  # a chain's accepted nodes are already in place
            keep = torch.tensor(path, dtype=torch.long, device=self.core.device)
            for buffer in (self.core.keys, self.core.values):
                move_path(buffer, 3, prefix, keep)
        self.pos = length

    def _room(self, needed: int) -> None:
        capacity = -(-max(needed, 1) // CHUNK) * CHUNK
        if self.core is None:
            self.core = PlainLlama(self.model, 1, capacity)
        elif capacity > self.core.capacity:
            self.core.grow(capacity)
            self.graphs.invalidate()  # recorded on the old buffers: the graphs and their pool go

    # ------------------------------------------------------------------ forwards
    def forward(self, tokens: torch.Tensor, num_logits: int = 1, hidden=None):
        new = tokens[0, self.pos:]
        n = new.shape[0]
        if n == 0:
            raise ValueError(f"nothing to feed: the cache already holds all {tokens.shape[1]} tokens ({self.pos} "
                             f"positions); pass the sequence with its new tokens")
        allowed = torch.ones(n, self.pos + n, dtype=torch.bool).tril(self.pos)
        return self._run(new, torch.arange(self.pos, self.pos + n), allowed, num_logits, hidden)

    def forward_tree(self, tokens: torch.Tensor, nodes: torch.Tensor, parents: torch.Tensor, fed: int = 0,
                     num_logits: int | None = None, hidden=None):
        parents = parents.cpu()
        if fed == 0 and is_chain(parents):  # an ordinary causal forward (the same positions and mask)
            return self.forward(torch.cat([tokens, nodes.to(tokens.device)[None]], dim=1),
                                len(nodes) + 1 if num_logits is None else num_logits, hidden)
        check_parents(parents)
        L = tokens.shape[1]
        if self.pos < L and fed == 0:
            new = tokens[0, self.pos:]
        elif self.pos == L + fed:
            new = tokens[0, :0]
        else:
            raise ValueError(f"a cache of {self.pos} positions cannot precede a tree pass over {L} committed tokens "
                             f"with {fed} nodes cached")
        n_new = new.shape[0]
        ids = torch.cat([new, nodes.to(new.device)[fed:]])
        ancestry = tree_mask(parents)  # computed once: the depths and the mask both read it
        positions = torch.cat([torch.arange(L - n_new, L), L - 1 + ancestry.sum(-1)[fed:]])
        allowed = tree_allowed(ancestry, L, n_new, fed)
        return self._run(ids, positions, allowed, ids.shape[0] if num_logits is None else num_logits, hidden)

    def prepare(self, prompt_len: int = 8) -> None:
        """Record (and compile) the graph of every budget now, so that no timed generation pays for it: a
        dummy prompt, one pass per budget, then the cache is emptied."""
        if not self.graphed:
            return
        self.begin(prompt_len)
        ids = torch.zeros(1, prompt_len + self.budgets[-1], dtype=torch.long, device=self.device)
        self.forward(ids[:, :prompt_len])
        for budget in self.budgets:
            self.forward(ids[:, :prompt_len + budget], 1)
            self.rollback(prompt_len)
        self.begin(0)

    # ------------------------------------------------------------------ internals
    def _taps(self, hidden) -> tuple:
        if hidden is None or hidden in ("norm", "head"):
            return ()
        if isinstance(hidden, (tuple, list)):
            taps = tuple(int(i) for i in hidden)
            n_layers = len(self.model.model.layers)
            if not taps or not all(0 <= i <= n_layers for i in taps):
                raise ValueError(f"layer indices must be integers in 0..{n_layers} ({n_layers} = the final norm's "
                                 f"input), got {hidden!r}")
            return taps
        raise ValueError(f"hidden must be 'norm', 'head' or a tuple of layer indices, got {hidden!r}")

    def _run(self, ids, positions, allowed, num_logits: int, hidden):
        """Feed `ids` [n] (device) at `positions` [n] into slots pos..pos+n-1 under `allowed` [n, pos + n]
        (CPU bool); return the last `num_logits` rows' logits (and the hidden state asked for)."""
        self.forwards += 1
        n, taps = ids.shape[0], self._taps(hidden)
        if not 1 <= num_logits <= n:
            raise ValueError(f"num_logits must be in 1..{n} (the tokens this pass feeds), got {num_logits}")
        budget = next((b for b in self.budgets if b >= n), None)
        self._room(self.pos + max(n, budget or 0) + 1)
        core = self.core
        graphable = set(taps) <= {*self.taps, len(core.layers)}  # the final norm's input is always returned
        if self.graphed and budget is not None and self.pos > 0 and graphable:
            out, kept = self._replay(ids, positions, allowed, budget, self.taps), n
            if taps:  # the layers asked for, in that order, from the graph's taps (and the norm's input)
                tapped = dict(zip(self.taps, out[3:]))
                tapped[len(core.layers)] = out[1]
                out = (*out[:3], *(tapped[i] for i in taps))
            self.replays += 1
        else:  # eager, exact shapes: attend over the slots in use only; logits of the kept rows only
            device, window = core.device, self.pos + n
            slots = torch.arange(self.pos, window, device=device)
            with attention_backends(device, self.avoid_cudnn):
                x, tapped = core.body(ids.to(device)[None], positions.to(device)[None], slots,
                                      allowed.to(device)[None], window, taps)
                post = core.rms(x[:, n - num_logits:], core.norm)
                out, kept = (core.head_logits(post)[0], x[0], post[0], *(t[0] for t in tapped)), num_logits
        self.pos += n
        return self._outputs(out, n, num_logits, kept, hidden)

    @staticmethod
    def _outputs(out, n, num_logits, kept, hidden):
        """`out` = (logits, final norm input, final norm output, taps); logits and the norm's output hold the
        first `kept` rows' (the real rows of a padded pass, or the kept rows of an eager one)."""
        logits, x, post, *tapped = out
        logits = logits[kept - num_logits:kept]
        if hidden is None:
            return logits
        if hidden == "norm":
            return logits, x[:n]
        if hidden == "head":
            return logits, post[kept - num_logits:kept]
        return logits, torch.cat([t[:n] for t in tapped], -1)

    def _replay(self, ids, positions, allowed, budget: int, taps: tuple):
        core, n, pos = self.core, ids.shape[0], self.pos
        key = (budget, taps, core.capacity)
        graph = self.graphs.get(key)  # (budget, taps, capacity) -> StaticStep, and their pool
        if graph is None:
            graph = self.graphs[key] = StaticStep(
                taps=taps, ints=torch.zeros(3, budget, dtype=torch.long, device=core.device),  # ids, positions, slots
                mask=torch.zeros(1, budget, core.capacity, dtype=torch.bool, device=core.device))
        ints = torch.zeros(2, budget, dtype=torch.long)
        ints[0, :n] = positions
        ints[1] = torch.arange(pos, pos + budget)  # pad rows write past the real ones (never read)
        mask = torch.zeros(budget, core.capacity, dtype=torch.bool)
        mask[:n, :pos + n] = allowed
        pad = torch.arange(n, budget)
        mask[pad, pos + pad] = True  # a pad row sees itself only
        graph.ints[0].zero_()
        graph.ints[0, :n].copy_(ids)
        graph.ints[1:].copy_(ints, non_blocking=True)
        graph.mask[0].copy_(mask, non_blocking=True)
        if not self.record:
            out = self._static(graph)
        else:
            if graph.graph is None:
                self._capture(graph)
            graph.graph.replay()
            out = graph.outputs
        return tuple(t[0, :n].clone() for t in out)  # the real rows (the next replay overwrites the outputs)

    def _static(self, graph: StaticStep):
        step = self._step or self.core.step
        with attention_backends(self.core.device, self.avoid_cudnn), recompile_room(self._step is not None):
            return step(graph.ints[0:1], graph.ints[1:2], graph.ints[2], graph.mask, graph.taps)

    def _capture(self, graph: StaticStep) -> None:
        if self.compiled and self._step is None:
            self._step = torch.compile(self.core.step, dynamic=False)
        graph.graph, graph.outputs = self.graphs.record(lambda: self._static(graph), warmups=3 if self.compiled else 1)


def recompile_room(compiled: bool):
    """While the compiled step runs (compiled once per budget and set of taps), dynamo's recompile limit is at least
    64 (its default, 8, would leave the other shapes eager); the setting is restored after the call."""
    if not compiled:
        return nullcontext()
    import torch._dynamo.config as dynamo_config
    limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    return dynamo_config.patch(**{limit: max(getattr(dynamo_config, limit), 64)})
