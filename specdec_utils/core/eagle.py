"""EAGLE heads (Li et al. 2024, 2025): a one-layer draft that reads the target's own features.

An independent draft (notebook 01) sees only tokens and must rebuild, with a few layers, what the
target computed with thirty. Medusa's heads (notebook 06) read the target's last hidden state but guess
the token two ahead blind, without the one in between. An EAGLE head does both things right: it reads
the target's features *and* the token the target just chose, and drafts autoregressively, one cheap
layer per token:

    entry t:   (feature of position t, token t+1)  ->  one decoder layer  ->  h_t  ->  logits of token t+2
    next step: (h_t, the drafted token t+2)         ->  the same layer     ->  ...   (its own output as feature)

Two generations of the recipe, both built by `EagleHead` (the ablation of notebook 07 walks from one to
the other):

- **EAGLE-1** (`layer="eagle1"`, `features=(N,)`): the feature is the target's last post-norm hidden
  state (the input of lm_head); the input is `fc([embedding; feature])` (2H -> H, with bias) fed to a
  Llama decoder layer without its input norm; the output *is* a predicted feature, read by the target's
  frozen lm_head; trained with a feature regression (smooth L1) plus 0.1 x soft cross-entropy, with
  uniform noise on the input features (SafeAILab/EAGLE `eagle/model/cnets1.py`, `eagle/train/main.py`).
- **EAGLE-3** (`layer="eagle3"`, `features=(2, N//2, N-3)`): features fused from a low, a middle and a
  high layer (the residual stream *entering* those layers, pre-norm), `fc` (3H -> H, no bias) gives the
  residual; the attention's q/k/v read `[norm(embedding); norm(residual)]` (2H); an output norm of its
  own; a reduced draft vocabulary (`vocab_ids`: the tokens the target writes most; EAGLE-3 trains an lm_head
  of its own over them, here the head borrows those rows of the target's frozen lm_head, so they cost no
  stored weights); soft cross-entropy only, over `ttt` unrolled steps in which the head reads its own outputs
  ("training-time test", SafeAILab/EAGLE `eagle/traineagle3/cnets.py`).

Layer index N (the number of target layers) means the final norm's input. Positions: entry t sits at
RoPE position t; a drafted entry d steps after the last committed one at position t + d, and it attends
to every committed entry plus its own ancestors in the round: the same mask in training (`ttt_forward`)
and at decode time (`EagleProposer`), tested equal.

`eagle_head_for(target, **options)` builds an untrained head for any Llama-family target (what the
tests use on tiny random models); `load_eagle("eagle-head", target)` loads the shipped one.
"""
from __future__ import annotations

import json
import math
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import objectives
from ..models import MODELS_DIR, has_weights, unpacked, weights_facts
from ..utils import require_data
from .checks import is_count, require
from .engine import Proposal, draw_chain
from .graphs import GraphCache
from .hidden import final_norm
from .policies import DraftingPolicy
from .tree import depths, prune_keep, subtree, tree_allowed
from .tree_drafting import DraftTreePolicy, _entropy_frac

EAGLE_NAME = "eagle-head"
LAYERS = ("eagle1", "eagle3")


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        return (self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype))


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ValueError(f"EAGLE heads here use plain RoPE; this target's rope type is {kind!r}")
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def default_features(n_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high layers (2, N//2, N-3: 2, 15, 27 for a 30-layer target), kept in range
    and distinct for shallow models."""
    return tuple(sorted({min(2, n_layers - 1), n_layers // 2, max(n_layers - 3, 0)}))


class Float32Rotary(nn.Module):
    """A module with a rotary-frequency buffer `inv_freq` (non-persistent) that `to`, `cuda`, `half`, ... move with
    the module but keep float32 whatever its dtype (the angles positions x inv_freq are computed in float32; bf16
    frequencies would be off by up to 0.4%). EAGLE heads and block drafters both extend it."""

    def _apply(self, fn, recurse=True):
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        if self.inv_freq.dtype != torch.float32:
            self.inv_freq = inv_freq.to(device=self.inv_freq.device)  # the float32 values, never rounded
        return self


class EagleHead(Float32Rotary):
    """One EAGLE decoder layer on top of a frozen `target` (see the module docstring for the two recipes).
    Trainable: fc, the layer, its norms. Borrowed, frozen, not saved: the target's embedding, its lm_head
    rows `vocab_ids` (None = the full vocabulary) and, for EAGLE-1, its final norm."""

    def __init__(self, target, layer: str = "eagle3", features=None, vocab_ids: torch.Tensor | None = None):
        super().__init__()
        config = target.config
        require("layer", layer, layer in LAYERS, f"one of {', '.join(LAYERS)}")
        n_layers = config.num_hidden_layers
        if features is None:
            features = (n_layers,) if layer == "eagle1" else default_features(n_layers)
        features = tuple(int(f) for f in features)
        require("features", features, len(features) >= 1 and all(0 <= f <= n_layers for f in features),
                f"a tuple of target layer indices in 0..{n_layers} ({n_layers} = the final norm's input)")
        if layer == "eagle1" and features != (n_layers,):
            raise ValueError(f"layer 'eagle1' reads the last feature only: features must be ({n_layers},)")
        H = config.hidden_size
        self.n_heads, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or H // self.n_heads
        eps = getattr(config, "rms_norm_eps", 1e-6)
        self.layer, self.features, self.hidden_size = layer, features, H
        if layer == "eagle1":
            self.fc = nn.Linear(2 * H, H, bias=True)
            width = H
        else:
            self.fc = nn.Linear(len(features) * H, H, bias=False)
            self.emb_norm, self.hid_norm = _RMSNorm(H, eps), _RMSNorm(H, eps)
            width = 2 * H
        self.q = nn.Linear(width, self.n_heads * self.head_dim, bias=False)
        self.k = nn.Linear(width, self.n_kv * self.head_dim, bias=False)
        self.v = nn.Linear(width, self.n_kv * self.head_dim, bias=False)
        self.o = nn.Linear(self.n_heads * self.head_dim, H, bias=False)
        self.post_norm = _RMSNorm(H, eps)
        self.gate = nn.Linear(H, config.intermediate_size, bias=False)
        self.up = nn.Linear(H, config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, H, bias=False)
        self.out_norm = _RMSNorm(H, eps) if layer == "eagle3" else nn.Identity()
        inv = 1.0 / _rope_theta(config) ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)
        self._target = [target]  # a list: not a submodule (its weights are not the head's)
        vocab = target.get_output_embeddings().weight.shape[0]
        self.vocab_size = vocab
        self.register_buffer("vocab_ids", None if vocab_ids is None else vocab_ids.long().clone(), persistent=False)
        self.to(device=target.device, dtype=next(target.parameters()).dtype)
        self.name, self.trained_steps, self.log = "untrained", 0, {}

    # ------------------------------------------------------------------ borrowed parts
    @property
    def target(self):
        target = self._target[0]
        if isinstance(target, weakref.ref):
            target = target()
            if target is None:
                raise RuntimeError("this EAGLE head's target was freed (a cached head holds its target weakly)")
        return target

    def hold_target_weakly(self) -> None:
        """Hold the target through a weak reference (a head cached per target object, `methods._eagle_head`: the
        cache must not keep the target alive)."""
        self._target = [weakref.ref(self.target)]

    @property
    def target_hidden(self) -> tuple[int, ...]:
        """What the engine captures from the target (`hidden.capture_hidden`): the input of these layers."""
        return self.features

    @property
    def lm_weight(self) -> torch.Tensor:
        return borrowed_lm_rows(self)

    @property
    def draft_vocab(self) -> int:
        return self.vocab_size if self.vocab_ids is None else len(self.vocab_ids)

    # ------------------------------------------------------------------ the layer
    def inputs(self, features: torch.Tensor, tokens: torch.Tensor, own: bool):
        """(attention input x, residual r) of entries (feature, token): `features` [..., F] are the target's
        (own=False) or the head's previous outputs [..., H] (own=True); `tokens` [...] the next tokens."""
        e = self.target.get_input_embeddings()(tokens).to(self.q.weight.dtype)
        if self.layer == "eagle1":
            f = features if own else final_norm(self.target)(features)
            r = self.fc(torch.cat([e, f.to(e.dtype)], -1))
            return r, r
        r = features.to(e.dtype) if own else self.fc(features.to(e.dtype))
        return torch.cat([self.emb_norm(e), self.hid_norm(r)], -1), r

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """q [.., nh, n, d], k and v [.., nkv, n, d] of x [.., n, width], RoPE at `positions` [.., n]."""
        shape = x.shape[:-1]
        q = self.q(x).view(*shape, self.n_heads, self.head_dim).transpose(-2, -3)
        k = self.k(x).view(*shape, self.n_kv, self.head_dim).transpose(-2, -3)
        v = self.v(x).view(*shape, self.n_kv, self.head_dim).transpose(-2, -3)
        angles = positions.float()[..., None] * self.inv_freq
        emb = torch.cat([angles, angles], -1)
        cos, sin = emb.cos().to(q.dtype).unsqueeze(-3), emb.sin().to(q.dtype).unsqueeze(-3)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def finish(self, attended: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """attended [.., nh, n, d] -> the layer's output h [.., n, H] (o_proj, residual, SwiGLU MLP)."""
        a = attended.transpose(-2, -3).flatten(-2)
        h = r + self.o(a)
        n = self.post_norm(h)
        return h + self.down(F.silu(self.gate(n)) * self.up(n))

    def cached_step(self, features, tokens, positions, keys, values, slots, mask, own: bool):
        """The head's layer over entries (features [n, F|H], tokens [n]) at `positions` [n] on a key/value buffer
        `keys`, `values` [kv heads, slots, d]: write the entries' keys and values at `slots` [n], attend where `mask`
        [n, w] allows over the buffer's first w slots. Returns (h [n, H], draft-vocabulary logits [n, V']). The one
        copy of the head's cached attention: the host-driven proposer and the device loop both call it."""
        x, r = self.inputs(features, tokens, own)
        q, k, v = self.qkv(x, positions)  # q [heads, n, d]; k, v [kv heads, n, d]
        keys.index_copy_(1, slots, k)
        values.index_copy_(1, slots, v)
        n, width, group = tokens.shape[0], mask.shape[-1], self.n_heads // self.n_kv
        # the query heads sharing a key/value head become group * n rows of it (the buffer is read once)
        rows_mask = mask[None].expand(group, n, width).reshape(group * n, width)
        att = F.scaled_dot_product_attention(q.reshape(self.n_kv, group * n, -1)[None], keys[None, :, :width],
                                             values[None, :, :width], attn_mask=rows_mask[None, None])[0]
        h = self.finish(att.reshape(self.n_heads, n, -1), r)
        return h, self.logits(h)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [.., V'] (V' = len(vocab_ids), or the full vocabulary)."""
        return self.out_norm(h) @ self.lm_weight.T

    def full_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [.., V'] scattered into the target's vocabulary (-inf elsewhere)."""
        return scatter_to_vocab(draft_logits, self.vocab_ids, self.vocab_size)

    # ------------------------------------------------------------------ training: the unrolled forward
    def ttt_forward(self, features: torch.Tensor, ids: torch.Tensor, steps: int, mask: torch.Tensor | None = None,
                    noise: float = 0.0):
        """The training forward with `steps` unrolled steps (EAGLE-3's training-time test; 1 = EAGLE-1).
        features [B, n, F] (the target's, at positions 0..n-1), ids [B, n], mask [B, n] (1 = a real token).
        Entry j of step k reads (step k-1's output at j, or the target's feature at j for k = 0) and the
        token ids[j + 1 + k], sits at position j + k, attends to the step-0 entries 0..j and to its own
        earlier steps at j, and predicts ids[j + 2 + k]. Returns a list of `steps` outputs h [B, n-1, H]."""
        B, n = ids.shape
        L = n - 1
        pad = ids.new_zeros(B, steps)
        shifted = torch.cat([ids, pad], 1)
        feats = features[:, :L]
        if noise:
            feats = feats + (torch.rand_like(feats) - 0.5) * 2 * noise
        j = torch.arange(L, device=ids.device)
        key_ok = mask[:, :L].bool() if mask is not None else torch.ones(B, L, dtype=torch.bool, device=ids.device)
        causal = (j[None, :] <= j[:, None])[None, None] & key_ok[:, None, None, :]  # [B, 1, L, L]
        scale = 1.0 / math.sqrt(self.head_dim)
        group = self.n_heads // self.n_kv
        outs, diag_k, diag_v, k0 = [], [], [], None
        h = None
        for k in range(steps):
            x, r = self.inputs(feats if k == 0 else h, shifted[:, 1 + k:1 + k + L], own=k > 0)
            q, kk, vv = self.qkv(x, (j + k)[None].expand(B, L))
            if k == 0:
                k0, v0 = kk.repeat_interleave(group, 1), vv.repeat_interleave(group, 1)
            else:
                diag_k.append(kk.repeat_interleave(group, 1))
                diag_v.append(vv.repeat_interleave(group, 1))
            scores = (q @ k0.transpose(-1, -2)) * scale
            scores = scores.float().masked_fill(~causal, float("-inf"))
            own = [((q * dk).sum(-1, keepdim=True) * scale).float() for dk in diag_k]
            weights = torch.cat([scores, *own], -1).softmax(-1).to(q.dtype)
            attended = weights[..., :L] @ v0
            for s, dv in enumerate(diag_v):
                attended = attended + weights[..., L + s:L + s + 1] * dv
            h = self.finish(attended, r)
            outs.append(h)
        return outs

    # ------------------------------------------------------------------ saving
    def config_dict(self) -> dict:
        return {"layer": self.layer, "features": list(self.features), "hidden_size": self.hidden_size,
                "target_vocab_size": self.vocab_size, "draft_vocab": self.draft_vocab,
                "trained_steps": self.trained_steps, "log": self.log}

    def save(self, path) -> None:
        save_borrowing(self, path, "head.safetensors")


def borrowed_lm_rows(module: nn.Module) -> torch.Tensor:
    """The rows `module.vocab_ids` of its target's lm_head (the whole weight for the full vocabulary), gathered once
    and kept until the target's weight moves or changes dtype. EAGLE heads and block drafters both read them."""
    weight = module.target.get_output_embeddings().weight
    if module.vocab_ids is None:
        return weight
    cached = getattr(module, "_lm_rows", None)
    if cached is None or cached.device != weight.device or cached.dtype != weight.dtype:
        cached = module._lm_rows = weight[module.vocab_ids].detach()
    return cached


def scatter_to_vocab(draft_logits: torch.Tensor, vocab_ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Logits over a draft vocabulary `vocab_ids` [.., V'] scattered into the target's `vocab_size` (-inf elsewhere);
    unchanged when the draft has the full vocabulary (None). EAGLE heads and block drafters both use it."""
    if vocab_ids is None:
        return draft_logits
    full = draft_logits.new_full((*draft_logits.shape[:-1], vocab_size), float("-inf"))
    full[..., vocab_ids] = draft_logits
    return full


def save_borrowing(module: nn.Module, path, file: str) -> None:
    """Save a model that borrows the target's parts (an EAGLE head, a block drafter): its own weights in bfloat16
    and its draft vocabulary `vocab_ids` in `file`, `module.config_dict()` in config.json."""
    from safetensors.torch import save_file
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in module.state_dict().items()}
    if module.vocab_ids is not None:
        state["vocab_ids"] = module.vocab_ids.to(torch.int32).cpu()
    save_file(state, str(path / file))
    (path / "config.json").write_text(json.dumps(module.config_dict(), indent=1))


def eagle_head_for(target, layer: str = "eagle3", features=None, vocab_ids: torch.Tensor | None = None,
                   seed: int | None = 0) -> EagleHead:
    """An untrained EAGLE head for any Llama-family `target` (a transformers model with `config`, input and
    output embeddings and `model.layers`), on the target's device and dtype. `seed` makes the random init
    repeatable (None: the global generator). Untrained heads draft badly but stay lossless: what the
    exactness tests use on tiny random targets."""
    if seed is None:
        return EagleHead(target, layer, features, vocab_ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return EagleHead(target, layer, features, vocab_ids)


def read_borrowing(path: Path, file: str, target, what: str) -> tuple[dict, dict, torch.Tensor | None]:
    """(config, weights, vocab_ids) of a model saved by `save_borrowing` in folder `path`, checked against `target`
    (the same hidden size and vocabulary) with one clear error line; `what` names the model in it. `file` may be
    packed (`models.pack`): it is read through `models.unpacked`."""
    from safetensors.torch import load_file
    config = json.loads((path / "config.json").read_text())
    hidden, vocab = target.config.hidden_size, target.get_output_embeddings().weight.shape[0]
    if config["hidden_size"] != hidden or config["target_vocab_size"] != vocab:
        raise ValueError(f"the {what} at {path} was trained for hidden size {config['hidden_size']} and "
                         f"{config['target_vocab_size']} tokens; this target has {hidden} and {vocab}")
    state = load_file(str(unpacked(path) / file))
    return config, state, state.pop("vocab_ids", None)


def load_eagle(name_or_path, target) -> EagleHead:
    """A head saved by `EagleHead.save` (a name under data/models, or a path), attached to `target`."""
    path = Path(name_or_path)
    if not path.exists():
        require_data()
        path = MODELS_DIR / str(name_or_path)
    if not has_weights(path, "head.safetensors"):
        raise ValueError(f"no EAGLE head at {name_or_path} (a folder with head.safetensors and config.json, or a "
                         f"name under {MODELS_DIR}); train one with python -m specdec_lab.train_eagle")
    config, state, vocab_ids = read_borrowing(path, "head.safetensors", target, "EAGLE head")
    head = EagleHead(target, config["layer"], config["features"], vocab_ids)
    head.load_state_dict(state)
    head.to(device=target.device, dtype=next(target.parameters()).dtype)
    head.name, head.trained_steps, head.log = path.name, config.get("trained_steps", 0), config.get("log", {})
    return head


def head_facts(head, where: str) -> dict:
    """What identifies a head: where it came from, its training steps and a hash of its weights' file
    (`models.weights_facts`: what a committed run records, so that a later reader knows which head it measured)."""
    return {**weights_facts(where), "trained_steps": head.trained_steps}


# --------------------------------------------------------------------------- decode time
class _HeadCache:
    """The head's own keys and values [nkv, capacity, d] (batch 1), preallocated and grown by doubling; the
    first `length` entries are valid. A step writes its entries at slots length..length+n-1."""

    def __init__(self):
        self.k = self.v = None
        self.length = 0

    def reserve(self, head, needed: int) -> bool:
        """Room for `needed` entries; True when the buffers were replaced (graphs recorded on them are stale)."""
        if self.k is not None and needed <= self.k.shape[-2]:
            return False
        capacity = max(256, 2 * needed)
        with torch.inference_mode(False):  # normal tensors: writable in and out of inference mode
            grown_k = head.k.weight.new_zeros(head.n_kv, capacity, head.head_dim)
            grown_v = torch.zeros_like(grown_k)
            if self.k is not None:
                grown_k[:, :self.length], grown_v[:, :self.length] = self.k[:, :self.length], self.v[:, :self.length]
        self.k, self.v = grown_k, grown_v
        return True


class _HeadGraph:
    """A step of `budget` entries recorded as a CUDA graph: static inputs, outputs (h, logits)."""

    def __init__(self, budget: int, width: int, capacity: int, device, dtype):
        self.features = torch.zeros(budget, width, device=device, dtype=dtype)
        self.ints = torch.zeros(3, budget, dtype=torch.long, device=device)  # tokens, positions, slots
        self.mask = torch.zeros(budget, capacity, dtype=torch.bool, device=device)
        self.graph, self.outputs = None, None


GRAPH_BUDGETS = (1, 2, 4, 8, 16, 32)


class EagleProposer:
    """EAGLE at decode time, a chain (`eagle-chain`) or EAGLE-2's dynamic tree (`eagle`).

    The engine hands over the target's features of every newly committed position after each pass
    (`needs_target_hidden`, at the layers `head.target_hidden`). A round first feeds the head one entry per
    committed position it has not seen (feature t, token t+1), then drafts from the newest entry's output:
    a chain, one entry per token; or a tree, one batched step per level over the `width` best nodes
    (expand by the head's confidence, then keep the `tree_nodes` best nodes overall by path probability,
    EAGLE-2's expand-and-rerank). Tree nodes are top-k guesses (deterministic), so sampled verification
    stays exact (one-hot q); a sampled chain draws from the head's warped distribution (rejection
    sampling). The first round has no features yet and proposes nothing.

    The tree is grown on the device: each level's scores, top-k and frontier are tensor operations, and the
    host reads the tree once per round. On a CUDA GPU (`graphs`, default there) every head step of at most
    32 entries is padded to a budget and replayed from a CUDA graph (one per budget and input kind)."""
    needs_target_hidden = True

    def __init__(self, head: EagleHead, tree: bool = False, graphs: bool | None = None):
        self.head, self.tree = head, tree
        self.graphs = head.q.weight.device.type == "cuda" if graphs is None else bool(graphs)
        self.cache, self.pending, self.fed = _HeadCache(), None, 0
        self._graphs = GraphCache()  # (budget, own, width, capacity) -> _HeadGraph, and their pool

    @property
    def target_hidden(self):
        return self.head.target_hidden

    def observe_target(self, features: torch.Tensor) -> None:
        self.pending = features if self.pending is None else torch.cat([self.pending, features])

    def rollback(self, committed: int) -> None:
        if committed == 0:  # a new generation (the buffers and their graphs are kept)
            self.cache.length, self.pending, self.fed = 0, None, 0
        else:  # drop the round's drafted entries: keep one entry per committed position fed so far
            self.cache.length = min(self.cache.length, self.fed)

    def _layer(self, features, tokens, positions, slots, mask, own: bool):
        """The head's step on the cache buffers (`EagleHead.cached_step`): write the entries' keys and values at
        `slots`, attend where `mask` [n, window] allows (window = the buffer's first mask.shape[-1] slots)."""
        return self.head.cached_step(features, tokens, positions, self.cache.k, self.cache.v, slots, mask, own)

    def step(self, features, tokens, positions, allowed, own: bool):
        """Feed entries (features [n, F|H], tokens [n]) at `positions` [n]; `allowed` [n, cached + n] says which
        keys each may attend to. Returns (h [n, H], draft-vocabulary logits [n, V'])."""
        n, start, device = tokens.shape[0], self.cache.length, tokens.device
        budget = next((b for b in GRAPH_BUDGETS if b >= n), None) if self.graphs else None
        if self.cache.reserve(self.head, start + (budget or n) + 1):
            self._graphs.invalidate()  # recorded on the old buffers: the graphs and their pool go
        if budget is None:
            slots = torch.arange(start, start + n, device=device)
            h, logits = self._layer(features, tokens, positions, slots, allowed, own)
        else:
            h, logits = self._replay(features, tokens, positions, allowed, own, budget)
        self.cache.length += n
        return h, logits

    def _replay(self, features, tokens, positions, allowed, own: bool, budget: int):
        n, start, cache = tokens.shape[0], self.cache.length, self.cache
        capacity = cache.k.shape[1]
        key = (budget, own, features.shape[-1], capacity)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = _HeadGraph(budget, features.shape[-1], capacity, features.device,
                                                   cache.k.dtype)
        graph.features[n:].zero_()
        graph.features[:n].copy_(features)
        graph.ints[0, n:].zero_()
        graph.ints[0, :n].copy_(tokens)
        graph.ints[1, :n].copy_(positions)
        graph.ints[2].copy_(torch.arange(start, start + budget, device=graph.ints.device))  # pads write past
        mask = graph.mask
        mask.zero_()
        mask[:n, :start + n] = allowed
        pad = torch.arange(n, budget, device=mask.device)
        mask[pad, start + pad] = True  # a pad entry sees itself only

        def run():
            return self._layer(graph.features, graph.ints[0], graph.ints[1], graph.ints[2], graph.mask, own)
        if graph.graph is None:
            graph.graph, graph.outputs = self._graphs.record(run)  # its warm-up writes the replay's slots
        graph.graph.replay()
        h, logits = graph.outputs
        return h[:n].clone(), logits[:n].clone()

    def _catch_up(self, tokens) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the committed entries the head lacks; return the newest entry's (h [H], logits [V'])."""
        m = tokens.shape[1] - 1  # the newest token's position; features are known for 0..m-1
        n = self.pending.shape[0]
        start = self.fed
        if start + n != m:
            raise RuntimeError(f"EAGLE head out of step: {start} entries + {n} new features for {m} positions")
        device = self.pending.device
        positions = torch.arange(start, m, device=device)
        allowed = torch.ones(n, start + n, dtype=torch.bool, device=device).tril(start)
        h, logits = self.step(self.pending, tokens[0, start + 1:m + 1], positions, allowed, own=False)
        self.fed, self.pending = m, None
        return h[-1], logits[-1]

    def propose(self, tokens, gamma, policy, sampler, generator, index) -> Proposal:
        if self.pending is None or gamma == 0:
            return Proposal(tokens[0, :0], None, "no draft" if self.pending is None else "budget", 0)
        h, logits = self._catch_up(tokens)
        if self.tree:
            return self._tree(tokens, h, logits, gamma, policy)
        return self._chain(tokens, h, logits, gamma, policy, sampler, generator, index)

    def _chain(self, tokens, h, logits, gamma, policy, sampler, generator, index) -> Proposal:
        head, m, forwards = self.head, tokens.shape[1] - 1, 1

        def slot(logits):  # (full-vocabulary logits, greedy token id) of one head output
            best = logits.argmax()
            return head.full_logits(logits), int(head.vocab_ids[best] if head.vocab_ids is not None else best)

        def advance(token, position):  # one more head step, on the token just drafted
            nonlocal h, forwards
            pos = torch.tensor([m + position], device=h.device)
            allowed = torch.ones(1, self.cache.length + 1, dtype=torch.bool, device=h.device)
            h, logits = self.step(h[None], tokens.new_tensor([token]), pos, allowed, own=True)
            h, forwards = h[0], forwards + 1
            return slot(logits[0])

        drafted, probs, stop = draw_chain(slot(logits), advance, gamma, policy, sampler, generator, index)
        return Proposal(tokens.new_tensor(drafted), probs, stop, forwards, head.vocab_size)

    def _tree(self, tokens, h_root, logits_root, gamma, policy) -> Proposal:
        """EAGLE-2's tree, grown level by level on the device. Candidates are numbered in the order they are
        made (a level's children parent by parent, each parent's in the head's order); a level's frontier is
        its `width` best candidates by path score (log-probability of the path; ties: the earlier one), fed in
        candidate order; the round keeps the `tree_nodes` best candidates overall."""
        head, m, base, device = self.head, tokens.shape[1] - 1, self.cache.length, h_root.device
        width = policy.width
        ids = head.vocab_ids  # a reduced vocabulary's rows -> token ids (None: the full vocabulary)
        logp = torch.log_softmax(logits_root.float(), -1)[None]              # [1, V']: the root's children
        top = logp.topk(min(width, logp.shape[-1]))
        frac = _entropy_frac(logp)
        w0 = top.indices.shape[1]
        tok = [top.indices[0] if ids is None else ids[top.indices[0]]]
        par, score = [torch.full((w0,), -1, device=device)], [top.values[0]]
        prob, ent = [top.values[0].exp()], [frac.expand(w0)]
        level_start, count = 0, w0   # this level's candidates are level_start..count-1
        ancestors = torch.zeros(0, 0, dtype=torch.bool, device=device)  # fed entry -> fed entries it sees
        fed_of = torch.full((0,), -1, dtype=torch.long, device=device)   # fed entry -> its candidate
        parents_h, prev_first, forwards = h_root[None], 0, 1  # the last level's fed entries (h), the first's index
        for depth in range(1, gamma):
            scores = torch.cat(score)[level_start:count]
            k = min(width, count - level_start)
            frontier = level_start + scores.topk(k).indices.sort().values      # candidate ids, in order
            all_par = torch.cat(par)
            parent_cand = all_par[frontier]                                    # their parents' candidate ids
            # the entry that predicted each frontier candidate: the root's (h_root) or a fed entry of the last level
            if depth == 1:
                inputs, parent_entry = h_root[None].expand(k, -1), torch.full((k,), -1, device=device)
            else:
                position_in_level = (fed_of[:, None] == parent_cand[None]).float().argmax(0)
                inputs, parent_entry = parents_h[position_in_level - prev_first], position_in_level
            first = fed_of.shape[0]
            rows = torch.arange(first, first + k, device=device)
            grown = torch.zeros(first + k, first + k, dtype=torch.bool, device=device)
            grown[:first, :first] = ancestors
            if depth > 1:  # a fed entry sees what its parent sees, and itself
                grown[rows] = grown[parent_entry]
            grown[rows, rows] = True
            ancestors, fed_of = grown, torch.cat([fed_of, frontier])
            allowed = tree_allowed(ancestors, base, fed=first)  # the committed entries, its ancestors and itself
            positions = torch.full((k,), m + depth - 1, device=device)
            hs, lg = self.step(inputs, torch.cat(tok)[frontier], positions, allowed, own=True)
            forwards += 1
            logp = torch.log_softmax(lg.float(), -1)
            top = logp.topk(min(width, logp.shape[-1]))                        # [k, w]
            frac = _entropy_frac(logp)
            n_children = top.indices.numel()
            tok.append(top.indices.reshape(-1) if ids is None else ids[top.indices.reshape(-1)])
            par.append(frontier.repeat_interleave(top.indices.shape[1]))
            score.append((scores[frontier - level_start][:, None] + top.values).reshape(-1))
            prob.append(top.values.exp().reshape(-1))
            ent.append(frac.repeat_interleave(top.indices.shape[1]))
            parents_h, prev_first = hs, first
            level_start, count = count, count + n_children
        ints = torch.stack([torch.cat(tok), torch.cat(par)]).cpu()  # the host reads the tree: once per round
        tok, par = ints[0], ints[1]
        score, prob, ent = torch.stack([torch.cat(score), torch.cat(prob), torch.cat(ent).float()]).cpu()
        keep = torch.ones(len(tok), dtype=torch.bool)
        if len(tok) > policy.tree_nodes:  # the best nodes by path probability (an ancestor scores at least as high)
            values = score.tolist()
            order = sorted(range(len(tok)), key=lambda c: (-values[c], c))[:policy.tree_nodes]
            keep = torch.zeros(len(tok), dtype=torch.bool)
            keep[order] = True
        keep &= prune_keep(prob, par, ent, policy.prune, policy.threshold)
        n_before = len(tok)
        nodes, parents = subtree(tok, par, keep)
        detail = {"tree_nodes": len(nodes), "pruned": n_before - len(nodes),
                  "tree_depth": int(depths(parents).max()) if len(parents) else 0}
        return Proposal(nodes.to(tokens.device), None, "tree", forwards, head.vocab_size, detail, parents)


class EagleChainPolicy(DraftingPolicy):
    """`eagle-chain`: a fixed chain of `gamma` head steps per round."""
    name = "eagle-chain"

    def __init__(self, gamma: int = 5):
        super().__init__(gamma)


class EaglePolicy(DraftTreePolicy):
    """`eagle`: EAGLE-2's dynamic tree of depth `gamma`: each level expands the `width` best nodes (by path
    probability) into their `width` best children; the round keeps the `tree_nodes` best nodes."""
    name = "eagle"

    def __init__(self, gamma: int = 6, tree_nodes: int = 24, width: int = 4, prune: str = "none",
                 threshold: float = 0.1):
        super().__init__(gamma, tree_nodes, width, prune, threshold)
        require("gamma", gamma, is_count(gamma, 1), "an integer >= 1 (the tree's depth)")


# ----------------------------------------------------------------------------- training (the lesson's loss)
FUSED = "fused"
VARIANTS = {
    "eagle1": dict(layer="eagle1", features="last", ttt=1, feature_loss=1.0, ce=0.1, noise=0.1, vocab=0),
    "eagle3-layer": dict(layer="eagle3", features="last", ttt=1, feature_loss=0.0, ce=1.0, noise=0.0, vocab=0),
    "fused": dict(layer="eagle3", features=FUSED, ttt=1, feature_loss=0.0, ce=1.0, noise=0.0, vocab=0),
    "ttt": dict(layer="eagle3", features=FUSED, ttt=5, feature_loss=0.0, ce=1.0, noise=0.0, vocab=0),
    "eagle3": dict(layer="eagle3", features=FUSED, ttt=5, feature_loss=0.0, ce=1.0, noise=0.0, vocab=8192),
}
STEP_WEIGHT = 0.8  # EAGLE-3: step k of the unrolled forward weighs 0.8^k


def build_head(target, recipe: dict, vocab_ids: torch.Tensor | None) -> EagleHead:
    n = target.config.num_hidden_layers
    features = (n,) if recipe["features"] == "last" else None  # None: EAGLE-3's default low/middle/high layers
    return EagleHead(target, recipe["layer"], features, vocab_ids if recipe["vocab"] else None)


def eagle_loss(head: EagleHead, features, ids, mask, target_logits, recipe: dict, noise: float | None = None):
    """The recipe's loss on one batch: per unrolled step k, the recipe's objective (`objectives`: KL by default,
    the gradient of EAGLE's soft cross-entropy; or the acceptance objective -log sum min(p, q)) between the target's
    distribution at position j + 1 + k (restricted to the draft vocabulary, where positions whose target
    argmax falls outside it are skipped, as EAGLE-3 does) and the head's, plus (EAGLE-1) smooth L1 between the
    head's output and the target's post-norm feature there. Returns (loss, [agreement per step])."""
    outs = head.ttt_forward(features, ids, recipe["ttt"], mask, noise=recipe["noise"] if noise is None else noise)
    n = ids.shape[1]
    total, agree = 0.0, []
    inside = None
    if head.vocab_ids is not None:
        inside = torch.zeros(head.vocab_size, dtype=torch.bool, device=ids.device)
        inside[head.vocab_ids] = True
    for k, h in enumerate(outs):
        span = n - 1 - k  # entries j = 0..span-1 have a teacher at j + 1 + k
        if span <= 0:
            break
        valid = mask[:, :span].bool() & mask[:, 1 + k:].bool()
        teacher = target_logits[:, 1 + k:]
        if inside is not None:
            valid = valid & inside[teacher.argmax(-1)]
        if not valid.any():
            continue
        teacher = teacher[valid]
        if head.vocab_ids is not None:
            teacher = teacher[:, head.vocab_ids]
        p = torch.softmax(teacher.float(), -1)
        hk = h[:, :span][valid]
        logq = torch.log_softmax(head.logits(hk).float(), -1)
        loss = recipe["ce"] * objectives.per_position(p, logq, recipe.get("objective", "kl"),
                                                      recipe.get("lk_weight", 1.0)).mean()
        if recipe["feature_loss"]:  # EAGLE-1: regress the target's post-norm feature there
            post = final_norm(head.target)(features[:, 1 + k:, -head.hidden_size:][valid])
            loss = loss + recipe["feature_loss"] * F.smooth_l1_loss(hk.float(), post.float())
        total = total + STEP_WEIGHT ** k * loss
        agree.append(round((logq.argmax(-1) == p.argmax(-1)).float().mean().item(), 4))
    return total, agree
