"""Block drafting: a whole block of drafts from one forward pass (DFlash, z-lab 2026, arXiv 2602.06036).

EAGLE (notebook 07) drafts token by token: a chain of gamma tokens costs gamma passes of its layer, and on a GPU,
where a small model's step is bound by how many kernels it launches rather than by its arithmetic, each pass costs
about the same however little it computes. A block drafter proposes all of a block's tokens at once:

    queries:  [anchor, mask, mask, ..., mask]          the newest token, then block_size - 1 empty slots
    keys:     [context 0 .. m-1 | the block itself]     the target's features of every committed position
    outputs:  the tokens at m+1 .. m+block_size-1       read off the mask slots by the target's own lm_head

The anchor is the newest committed token (position m, whose target features do not exist yet: the target has not
run on it); each mask slot is one learned embedding. Attention inside the block is bidirectional (no slot waits
for another), and every block query also attends to the context: the target's features from a few of its layers
(EAGLE-3's low, middle and high ones, `eagle.default_features`), fused by `fc` into one vector per position and
projected by each draft layer's own key and value projections, as DFlash injects them. The draft layers are plain
Llama layers otherwise (RMSNorm, RoPE, grouped-query attention, SwiGLU); the drafter borrows the target's input
embedding and the rows `vocab_ids` of its lm_head (a reduced draft vocabulary, as EAGLE-3's), so it stores only
its own layers.

The drafts of one block are drawn independently, each from its own slot's distribution: slot i does not see which
token slot i - 1 drew. That is what makes one pass enough, and what costs acceptance (DSpark's sequential head
restores the dependency; `markov_rank` > 0 adds its simplest form, a low-rank bias on slot i's logits from the token
at slot i - 1, cheap enough to run slot by slot after the one pass). It does not cost exactness: token i is drawn
from a distribution q_i fixed before it is drawn (by the block and, with the Markov head, the token before it), so
q_i is the distribution speculative sampling must be handed for it, and the engine's verifier stays exact.

`BlockDrafter.forward` is the one forward: at decode time a single block over the whole context
(`BlockProposer`), in training many blocks per sequence at once, each seeing the context before its own anchor
(`block_mask`); the two are tested equal.
"""
from __future__ import annotations

import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import objectives
from ..models import MODELS_DIR, has_weights
from ..utils import require_data
from .checks import is_count, is_number, require
from .eagle import (
    Float32Rotary,
    _RMSNorm,
    _rope_theta,
    _rotate,
    borrowed_lm_rows,
    default_features,
    read_borrowing,
    save_borrowing,
    scatter_to_vocab,
)
from .engine import Proposal, draw_chain
from .policies import DraftingPolicy

FILE = "drafter.safetensors"


class _BlockLayer(nn.Module):
    """One draft layer: pre-norm attention whose keys and values come from the context features and the block,
    then a SwiGLU MLP, each with its residual."""

    def __init__(self, H: int, n_heads: int, n_kv: int, head_dim: int, inter: int, eps: float):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = n_heads, n_kv, head_dim
        self.in_norm, self.post_norm = _RMSNorm(H, eps), _RMSNorm(H, eps)
        self.q = nn.Linear(H, n_heads * head_dim, bias=False)
        self.k = nn.Linear(H, n_kv * head_dim, bias=False)
        self.v = nn.Linear(H, n_kv * head_dim, bias=False)
        self.o = nn.Linear(n_heads * head_dim, H, bias=False)
        self.gate = nn.Linear(H, inter, bias=False)
        self.up = nn.Linear(H, inter, bias=False)
        self.down = nn.Linear(inter, H, bias=False)

    def _heads(self, x, proj, n, cos=None, sin=None):
        y = proj(x).view(*x.shape[:-1], n, self.head_dim).transpose(-2, -3)  # [B, n heads, L, d]
        return y if cos is None else _rotate(y, cos, sin)

    def forward(self, x, context, rope_block, rope_context, mask):
        """x [B, Q, H] (the block slots), context [B, n, H] (fused features), rope_*: (cos, sin) [B, 1, L, d];
        mask [B, Q, n + Q] (True = may attend)."""
        h = self.in_norm(x)
        q = self._heads(h, self.q, self.n_heads, *rope_block)
        k = torch.cat([self._heads(context, self.k, self.n_kv, *rope_context),
                       self._heads(h, self.k, self.n_kv, *rope_block)], -2)
        v = torch.cat([self._heads(context, self.v, self.n_kv), self._heads(h, self.v, self.n_kv)], -2)
        group = self.n_heads // self.n_kv
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        x = x + self.o(attended.transpose(-2, -3).flatten(-2))
        n = self.post_norm(x)
        return x + self.down(F.silu(self.gate(n)) * self.up(n))


class BlockDrafter(Float32Rotary):
    """A DFlash-style block drafter on top of a frozen `target` (see the module docstring). `block_size` counts the
    anchor: a pass proposes block_size - 1 tokens. Trainable: `fc`, its norm, the mask embedding, the layers and
    the output norm. Borrowed, frozen, not saved: the target's embedding and its lm_head rows `vocab_ids`."""

    def __init__(self, target, block_size: int = 8, layers: int = 1, features=None,
                 vocab_ids: torch.Tensor | None = None, markov_rank: int = 0):
        super().__init__()
        config = target.config
        require("block_size", block_size, is_count(block_size, 2), "an integer >= 2 (the anchor and at least one slot)")
        require("layers", layers, is_count(layers, 1), "an integer >= 1 (draft layers)")
        n_layers = config.num_hidden_layers
        features = tuple(int(f) for f in (features if features is not None else default_features(n_layers)))
        require("features", features, len(features) >= 1 and all(0 <= f <= n_layers for f in features),
                f"a tuple of target layer indices in 0..{n_layers}")
        H = config.hidden_size
        n_heads, n_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or H // n_heads
        eps = getattr(config, "rms_norm_eps", 1e-6)
        self.block_size, self.features, self.hidden_size = block_size, features, H
        self.fc = nn.Linear(len(features) * H, H, bias=False)
        self.context_norm, self.out_norm = _RMSNorm(H, eps), _RMSNorm(H, eps)
        self.mask_embedding = nn.Parameter(torch.randn(H) * 0.02)
        self.layers = nn.ModuleList(_BlockLayer(H, n_heads, n_kv, self.head_dim, config.intermediate_size, eps)
                                    for _ in range(layers))
        # RoPE frequencies: a buffer that moves with the drafter (no copy from the host inside a recorded round) and
        # stays float32 whatever its dtype (`Float32Rotary`)
        inv = 1.0 / _rope_theta(config) ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)
        self._target = [target]  # a list: not a submodule (its weights are not the drafter's)
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        self.register_buffer("vocab_ids", None if vocab_ids is None else vocab_ids.long().clone(), persistent=False)
        # DSpark's sequential correction: a low-rank Markov bias on slot i's logits from the token before it
        require("markov_rank", markov_rank, is_count(markov_rank, 0), "an integer >= 0 (0: no Markov head)")
        self.markov_rank = markov_rank
        if markov_rank:
            draft_vocab = self.vocab_size if vocab_ids is None else len(vocab_ids)
            index = torch.full((self.vocab_size,), draft_vocab, dtype=torch.long)  # tokens outside: one extra row
            index[torch.arange(self.vocab_size) if vocab_ids is None else vocab_ids.long().cpu()] = \
                torch.arange(draft_vocab)
            self.register_buffer("markov_index", index, persistent=False)
            self.markov_in = nn.Embedding(draft_vocab + 1, markov_rank)
            self.markov_out = nn.Linear(markov_rank, draft_vocab, bias=False)
            nn.init.zeros_(self.markov_out.weight)  # starts as the plain block drafter
        self.to(device=target.device, dtype=next(target.parameters()).dtype)

    @property
    def target(self):
        target = self._target[0]
        return target() if isinstance(target, weakref.ref) else target

    @property
    def target_hidden(self) -> tuple[int, ...]:
        """What the engine captures from the target (`hidden.capture_hidden`): the input of these layers."""
        return self.features

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features [.., len(features) * H] -> one context vector per position [.., H]."""
        return self.context_norm(self.fc(features.to(self.fc.weight.dtype)))

    def _rope(self, positions):
        angles = positions.float()[..., None] * self.inv_freq
        emb = torch.cat([angles, angles], -1)
        dtype = self.fc.weight.dtype
        return emb.cos().to(dtype).unsqueeze(-3), emb.sin().to(dtype).unsqueeze(-3)

    def forward(self, context: torch.Tensor, anchors: torch.Tensor, starts: torch.Tensor,
                context_mask: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [B, A, block_size - 1, V'] of A blocks per row.

        context [B, n, H]: fused features of positions 0..n-1; anchors [B, A]: each block's anchor token; starts
        [B, A]: each anchor's position (the block's slots sit at starts .. starts + block_size - 1);
        context_mask [B, A, n]: which context positions each block may read (at decode time all of them; in
        training those before its anchor, `block_mask`). Inside a block attention is bidirectional; blocks
        never see each other."""
        B, A = anchors.shape
        b, n = self.block_size, context.shape[1]
        slots = torch.arange(b, device=anchors.device)
        x = self.mask_embedding.expand(B, A, b, self.hidden_size).clone()
        x[:, :, 0] = self.target.get_input_embeddings()(anchors).to(x.dtype)
        x = x.reshape(B, A * b, self.hidden_size)
        block_pos = (starts[..., None] + slots).reshape(B, A * b)
        same_block = torch.eye(A, dtype=torch.bool, device=anchors.device).repeat_interleave(b, 0).repeat_interleave(
            b, 1)
        mask = torch.cat([context_mask.repeat_interleave(b, 1), same_block.expand(B, -1, -1)], -1)
        rope_block = self._rope(block_pos)
        rope_context = self._rope(torch.arange(n, device=anchors.device).expand(B, n))
        for layer in self.layers:
            x = layer(x, context, rope_block, rope_context, mask)
        h = self.out_norm(x).view(B, A, b, self.hidden_size)[:, :, 1:]
        return h @ self.lm_weight.T

    @property
    def lm_weight(self) -> torch.Tensor:
        return borrowed_lm_rows(self).detach()  # gathered once, not every pass

    def full_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [.., V'] scattered into the target's vocabulary (-inf elsewhere)."""
        return scatter_to_vocab(draft_logits, self.vocab_ids, self.vocab_size)

    def markov(self, previous: torch.Tensor) -> torch.Tensor:
        """The Markov head's bias [.., V'] on a slot's draft-vocabulary logits, given the token before that slot
        (target ids [..]); zero without a Markov head."""
        if not self.markov_rank:
            return torch.zeros((), dtype=self.fc.weight.dtype, device=previous.device)
        return self.markov_out(self.markov_in(self.markov_index[previous]))

    def draft_ids(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """The argmax of draft-vocabulary logits, as target token ids."""
        best = draft_logits.argmax(-1)
        return best if self.vocab_ids is None else self.vocab_ids[best]


    def config_dict(self) -> dict:
        return {"block_size": self.block_size, "layers": len(self.layers), "features": list(self.features),
                "markov_rank": self.markov_rank,
                "hidden_size": self.hidden_size, "target_vocab_size": self.vocab_size,
                "draft_vocab": self.vocab_size if self.vocab_ids is None else len(self.vocab_ids),
                "trained_steps": getattr(self, "trained_steps", 0), "log": getattr(self, "log", {})}

    def save(self, path) -> None:
        """The drafter's own weights (bfloat16) and its draft vocabulary in drafter.safetensors, its shape and
        training log in config.json; the borrowed target parts are not saved."""
        save_borrowing(self, path, FILE)


def load_block(name_or_path, target) -> BlockDrafter:
    """A drafter saved by `BlockDrafter.save` (a name under data/models, such as the shipped "block-drafter", or a
    folder), attached to `target`."""
    path = Path(name_or_path)
    if not path.exists():
        require_data()
        path = MODELS_DIR / str(name_or_path)
    if not has_weights(path, FILE):
        raise ValueError(f"no block drafter at {name_or_path} (a folder with {FILE} and config.json, or a name under "
                         f"{MODELS_DIR}); train one with python -m specdec_lab.train_block")
    config, state, vocab_ids = read_borrowing(path, FILE, target, "block drafter")
    drafter = BlockDrafter(target, config["block_size"], config["layers"], config["features"], vocab_ids,
                           config.get("markov_rank", 0))
    drafter.load_state_dict(state)
    drafter.to(device=target.device, dtype=next(target.parameters()).dtype)
    drafter.trained_steps, drafter.log = config.get("trained_steps", 0), config.get("log", {})
    return drafter


def block_mask(starts: torch.Tensor, n: int) -> torch.Tensor:
    """Training's context mask [B, A, n]: a block anchored at position s reads the context positions before s
    (exactly what exists when that anchor is the newest token at decode time)."""
    return torch.arange(n, device=starts.device) < starts[..., None]


def block_drafter_for(target, block_size: int = 8, layers: int = 1, features=None,
                      vocab_ids: torch.Tensor | None = None, markov_rank: int = 0,
                      seed: int | None = 0) -> BlockDrafter:
    """An untrained block drafter for any Llama-family `target`, with a repeatable init (`seed`; None: the global
    generator). It drafts badly but stays lossless: what the exactness tests use on tiny random targets."""
    if seed is None:
        return BlockDrafter(target, block_size, layers, features, vocab_ids, markov_rank)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return BlockDrafter(target, block_size, layers, features, vocab_ids, markov_rank)


class BlockProposer:
    """A block drafter at decode time: one pass per round proposes up to block_size - 1 tokens.

    The engine hands over the target's features of every newly committed position after each pass
    (`needs_target_hidden`); the proposer keeps them fused, one row per committed position, and cuts them back on
    rollback. A round runs the drafter once (anchor = the newest token, context = every committed position before
    it) and walks the block's slots in order with the policy (`engine.draw_chain`): greedy takes each slot's argmax,
    sampling draws each slot's token from its own warped distribution. The first round has no features yet and
    proposes nothing."""
    needs_target_hidden = True

    def __init__(self, drafter: BlockDrafter):
        self.drafter, self.context = drafter, None

    @property
    def target_hidden(self):
        return self.drafter.target_hidden

    def observe_target(self, features: torch.Tensor) -> None:
        fused = self.drafter.fuse(features)
        self.context = fused if self.context is None else torch.cat([self.context, fused])

    def rollback(self, committed: int) -> None:
        if committed == 0:
            self.context = None
        elif self.context is not None:
            self.context = self.context[:committed]

    def propose(self, tokens, gamma, policy, sampler, generator, index) -> Proposal:
        drafter = self.drafter
        if self.context is None or gamma == 0:
            return Proposal(tokens[0, :0], None, "no draft" if self.context is None else "budget", 0)
        m = tokens.shape[1] - 1  # the anchor's position: features exist for 0..m-1
        if self.context.shape[0] != m:
            raise RuntimeError(f"block drafter out of step: {self.context.shape[0]} context rows for {m} positions")
        anchor = tokens[:, -1:]
        starts = torch.full_like(anchor, m)
        everything = torch.ones(1, 1, m, dtype=torch.bool, device=tokens.device)
        logits = drafter(self.context[None], anchor, starts, everything)[0, 0]  # [block_size - 1, V']

        def slot(i, previous):  # slot i's (full-vocabulary logits, greedy token), after the token `previous`
            row = logits[i] + drafter.markov(tokens.new_tensor(previous))  # (no bias without a Markov head)
            return drafter.full_logits(row), int(drafter.draft_ids(row))
        drafted, probs, stop = draw_chain(slot(0, int(anchor)), lambda token, position: slot(position + 1, token),
                                          min(gamma, drafter.block_size - 1), policy, sampler, generator, index)
        return Proposal(tokens.new_tensor(drafted), probs, stop, 1, drafter.vocab_size)


class BlockPolicy(DraftingPolicy):
    """`block`: verify the first `gamma` tokens of each block (at most block_size - 1)."""
    name = "block"

    def __init__(self, gamma: int = 7):
        super().__init__(gamma)


class BlockConfidence(BlockPolicy):
    """`block-confidence`: verify as much of the block as the drafter trusts (DSpark's confidence-chosen verification
    length, in its simplest form: the drafter's own probabilities instead of a trained confidence head). `reach` is
    the drafter's probability of the prefix drafted so far; slot i joins the round while reach x (slot i's largest
    probability) stays at least `threshold`: the chance, by the drafter's own account, that the target accepts
    everything up to it. The first slot always joins. A threshold worth paying for follows from the measured costs
    (`threshold_from_costs`); 0 verifies all `gamma` slots, as `block` does. The rule reads slot i's distribution
    before its token is drawn and the drawn tokens only after, so sampled output stays exactly the target's."""
    name = "block-confidence"
    reason = "confidence"

    def __init__(self, gamma: int = 7, threshold: float = 0.3):
        require("threshold", threshold, is_number(threshold, 0, 1), "a probability in [0, 1]")
        super().__init__(gamma)
        self.threshold, self.reach = threshold, 1.0

    def round_gamma(self) -> int:
        self.reach = 1.0
        return self.gamma

    def stop_before(self, step) -> bool:
        return step.position > 0 and self.reach * float(step.confidence_probs.max()) < self.threshold

    def stop_after(self, step) -> bool:
        self.reach *= step.token_prob
        return False


def threshold_from_costs(extra_token_cost: float, round_cost: float, tau: float) -> float:
    """The `BlockConfidence` threshold at which one more verified slot pays for itself: it adds one token with
    probability P (the drafter's reach) and costs `extra_token_cost` (the target's pass over one more token, in the
    same unit as `round_cost`); a token is worth round_cost / tau, the time a round spends per token it commits.
    Verify the slot when P x round_cost / tau >= extra_token_cost: threshold = extra_token_cost x tau / round_cost,
    capped at 1. On a GPU a few more tokens in a pass cost almost nothing, so the threshold is near 0 (verify the
    whole block); on a CPU each one costs a share of a pass."""
    for name, value in (("extra_token_cost", extra_token_cost), ("round_cost", round_cost), ("tau", tau)):
        require(name, value, is_number(value, 0), "a number >= 0")
    require("round_cost", round_cost, round_cost > 0, "a time > 0")
    return min(1.0, extra_token_cost * tau / round_cost)


# ----------------------------------------------------------------------------- training (the lesson's loss)
SLOT_WEIGHT = 0.8


def block_loss(drafter: BlockDrafter, features, ids, mask, target_logits, recipe: dict):
    """The block objective on one batch (see the module docstring). `recipe`: "anchors" per row, "objective",
    "lk_weight" and "seed". The anchors are drawn from the seed and the batch itself, so a run resumed from a
    checkpoint draws what the run that never stopped drew. Returns (loss, [top-1 agreement per slot])."""
    B, n = ids.shape
    b, device = drafter.block_size, ids.device
    real = mask.bool() if mask is not None else torch.ones_like(ids, dtype=torch.bool)
    generator = torch.Generator().manual_seed(recipe.get("seed", 0) * 1_000_003 + int(ids.sum()))
    scores = torch.rand(B, n, generator=generator).to(device)
    scores[:, 0], scores[:, n - 1:] = -1.0, -1.0  # an anchor needs context before it and a token after it
    scores[~real] = -1.0
    scores[:, :-1][~real[:, 1:]] = -1.0  # (a real one after it)
    starts = scores.topk(min(recipe.get("anchors", 8), max(n - 2, 1)), dim=1).indices  # [B, A]
    usable = scores.gather(1, starts) >= 0
    logits = drafter(drafter.fuse(features), ids.gather(1, starts), starts, block_mask(starts, n))
    slots = torch.arange(1, b, device=device)
    predicted = starts[..., None] + slots  # [B, A, b - 1]: the position each slot predicts
    inside = predicted.clamp(max=n - 1)
    logits = logits + drafter.markov(ids.gather(1, (inside - 1).flatten(1)).view_as(inside))  # teacher-forced
    ok = usable[..., None] & (predicted < n) & real.gather(1, inside.flatten(1)).view_as(inside)
    teacher = target_logits if drafter.vocab_ids is None else target_logits[..., drafter.vocab_ids]
    teacher = teacher.gather(1, (inside - 1).flatten(1)[..., None].expand(-1, -1, teacher.shape[-1]))
    p = torch.softmax(teacher.view(*inside.shape, -1).float(), -1)
    logq = torch.log_softmax(logits.float(), -1)
    per = objectives.per_position(p, logq, recipe.get("objective", "kl"), recipe.get("lk_weight", 1.0))
    weight = (SLOT_WEIGHT ** (slots - 1).float()) * ok
    loss = (per * weight).sum() / weight.sum().clamp_min(1e-9)
    hits = (logq.argmax(-1) == p.argmax(-1)) & ok
    agree = [round(float(hits[..., i].sum() / ok[..., i].sum().clamp_min(1)), 4) for i in range(b - 1)]
    return loss, agree
