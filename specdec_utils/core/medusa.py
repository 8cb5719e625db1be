"""Medusa heads (Cai et al. 2024) on the frozen target: K small heads read the target's last hidden
state and guess the tokens after its next one, so one target pass can verify a whole tree of guesses.

Head k (k = 1..K) at position t reads the target's hidden state h_t (the input of its final norm)
and predicts the token at t + 1 + k: head 1 guesses the token *after* the one the target itself is
about to write. Each head is

    logits_k(h) = lm_head( x + SiLU(W_k x + b_k) ),   x = RMSNorm_target(h)

with a frozen copy of the target's final RMSNorm first (the missing-norm bug of notebook 06: without it the
head sees the un-normalised residual stream, whose scale is far from what lm_head expects), a
residual block whose linear layer starts at zero (so at step 0 every head *is* the target's own
next-token predictor), and the target's lm_head, shared and frozen. Only the K residual blocks
train (K x (H^2 + H) parameters; 1.3 M for K = 4 on SmolLM2-135M).

`vocab_ids` optionally restricts the heads' output to a slice of the vocabulary (rows of lm_head):
the tokens the target writes most, as the drafts use. The guesses are then the top tokens of the
slice; notebook 06 measures what this saves and costs.
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..models import MODELS_DIR, has_weights, unpacked
from ..prompts import format_prompt
from ..training import greedy_continuations, lr_schedule
from ..utils import progress, require_data
from .hidden import capture_hidden, final_norm  # noqa: F401 (the heads' hook, re-exported for the trainer)

HEADS_NAME = "medusa-heads"


class MedusaHeads(nn.Module):
    """K Medusa heads for `target`. `use_norm=False` builds notebook 06's first bug (no norm before the
    residual block). The lm_head weight is the target's (not a parameter of the heads, not saved)."""

    def __init__(self, target, num_heads: int = 4, use_norm: bool = True, vocab_ids: torch.Tensor | None = None):
        super().__init__()
        if not (isinstance(num_heads, int) and num_heads >= 1):
            raise ValueError(f"num_heads must be an integer >= 1, got {num_heads!r}")
        hidden = target.config.hidden_size
        self.num_heads, self.use_norm = num_heads, use_norm
        self.norm = copy.deepcopy(final_norm(target)) if use_norm else nn.Identity()
        for p in self.norm.parameters():
            p.requires_grad_(False)
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(num_heads))
        for block in self.blocks:
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)
        self._target = [target]  # a list: not a submodule (its weights are not the heads')
        self.register_buffer("vocab_ids", None if vocab_ids is None else vocab_ids.long().clone(), persistent=False)
        self.to(device=target.device, dtype=next(target.parameters()).dtype)
        self.trained_steps = 0
        self.name = "untrained"
        self.rank_accuracy: list[list[float]] | None = None  # P(rank-r guess of head k is right), measured

    @property
    def target(self):
        return self._target[0]

    @property
    def lm_weight(self) -> torch.Tensor:
        weight = self.target.get_output_embeddings().weight
        return weight if self.vocab_ids is None else weight[self.vocab_ids]

    @property
    def vocab_size(self) -> int:
        return self.target.get_output_embeddings().weight.shape[0]

    def hidden(self, h: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., K, H]: each head's input to lm_head."""
        x = self.norm(h)
        return torch.stack([x + F.silu(block(x)) for block in self.blocks], dim=-2)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Head logits [..., K, V'] for hidden states h [..., H] (V' = len(vocab_ids) if sliced)."""
        return self.hidden(h) @ self.lm_weight.T

    def with_vocab(self, vocab_ids: torch.Tensor | None) -> MedusaHeads:
        """A view of these heads (same trained blocks) whose output is restricted to `vocab_ids`."""
        other = copy.copy(self)
        other._buffers = dict(self._buffers)
        other._buffers["vocab_ids"] = None if vocab_ids is None else vocab_ids.long().to(self.blocks[0].weight.device)
        return other

    # ------------------------------------------------------------------ saving
    def save(self, path) -> None:
        from safetensors.torch import save_file
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {f"blocks.{i}.{n}": t.detach().to(torch.bfloat16).contiguous().cpu()
                 for i, b in enumerate(self.blocks) for n, t in b.state_dict().items()}
        save_file(state, str(path / "heads.safetensors"))
        config = {"num_heads": self.num_heads, "hidden_size": self.blocks[0].in_features,
                  "use_norm": self.use_norm, "trained_steps": self.trained_steps,
                  "target_vocab_size": self.vocab_size, "rank_accuracy": self.rank_accuracy,
                  "rank_accuracy_source": getattr(self, "rank_accuracy_source", None)}
        (path / "config.json").write_text(json.dumps(config, indent=1))


def load_heads(name_or_path, target, use_norm: bool | None = None) -> MedusaHeads:
    """Heads saved by `MedusaHeads.save` (a name under data/models, or a path), attached to
    `target` (its final norm and lm_head). Refuses heads trained for another shape."""
    from safetensors.torch import load_file
    path = Path(name_or_path)
    if not path.exists():
        require_data()
        path = MODELS_DIR / str(name_or_path)
    if not has_weights(path, "heads.safetensors"):
        raise ValueError(f"no Medusa heads at {name_or_path} (a folder with heads.safetensors and config.json, or a "
                         f"name under {MODELS_DIR}); train them with python -m specdec_lab.train_medusa")
    config = json.loads((path / "config.json").read_text())
    hidden, vocab = target.config.hidden_size, target.get_output_embeddings().weight.shape[0]
    if config["hidden_size"] != hidden or config.get("target_vocab_size", vocab) != vocab:
        raise ValueError(f"heads at {path} were trained for hidden size {config['hidden_size']} and "
                         f"{config.get('target_vocab_size')} tokens; this target has {hidden} and {vocab}")
    heads = MedusaHeads(target, config["num_heads"], config["use_norm"] if use_norm is None else use_norm)
    state = load_file(str(unpacked(path) / "heads.safetensors"))
    heads.blocks.load_state_dict({k[len("blocks."):]: v for k, v in state.items()})
    heads.to(device=target.device, dtype=next(target.parameters()).dtype)
    heads.trained_steps, heads.name = config.get("trained_steps", 0), path.name
    heads.rank_accuracy = config.get("rank_accuracy")
    heads.rank_accuracy_source = config.get("rank_accuracy_source")
    return heads


# ---------------------------------------------------------------------- training and evaluation
def heads_loss(heads: MedusaHeads, hidden: torch.Tensor, target_logits: torch.Tensor,
               mask: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """Distillation loss: head k at position t matches the target's own distribution at t + k
    (which predicts token t + k + 1), forward KL, averaged over valid positions and heads.
    hidden [B, n, H], target_logits [B, n, V], mask [B, n]. Returns (loss, top-1 agreement per head
    with the target's argmax there). With `vocab_ids`, both sides are restricted to the slice."""
    if heads.vocab_ids is not None and target_logits.shape[-1] == heads.vocab_size:  # not sliced yet
        target_logits = target_logits[..., heads.vocab_ids]
    losses, agree = [], []
    states = heads.hidden(hidden)  # [B, n, K, H]
    weight = heads.lm_weight
    for k in range(1, heads.num_heads + 1):
        valid = (mask[:, :-k] * mask[:, k:]).bool()
        if not valid.any():
            continue
        student = torch.log_softmax((states[:, :-k, k - 1][valid] @ weight.T).float(), -1)
        teacher = torch.softmax(target_logits[:, k:][valid].float(), -1)
        losses.append((teacher * (torch.log(teacher.clamp_min(1e-12)) - student)).sum(-1).mean())
        agree.append((student.argmax(-1) == teacher.argmax(-1)).float().mean().item())
    return torch.stack(losses).mean(), agree


@torch.no_grad()
def head_accuracy(heads: MedusaHeads, target, sequences: list[tuple[list[int], int]],
                  topk: tuple[int, ...] = (1, 5, 10)) -> dict:
    """Per-head acceptance on the target's own greedy continuations, teacher-forced: for each
    (ids, n) (prompt of n tokens + continuation), head k at position t >= n - 1 is right at
    top-j when the continuation token at t + 1 + k is among its j best guesses.
    Returns {"top1": [per head], "top5": [...], ..., "positions": [per head]}."""
    hits = {j: [0] * heads.num_heads for j in topk}
    counts = [0] * heads.num_heads
    device = heads.blocks[0].weight.device
    for ids, n in sequences:
        x = torch.tensor([ids], device=device)
        with capture_hidden(target) as hidden:
            target(input_ids=x, logits_to_keep=1)
        logits = heads(hidden[0][0])  # [len, K, V']
        best = logits.topk(max(topk), dim=-1).indices
        if heads.vocab_ids is not None:
            best = heads.vocab_ids[best]
        for k in range(1, heads.num_heads + 1):
            if len(ids) - 1 - k <= n - 1:
                continue
            truth = x[0, n + k:]  # the token at t + 1 + k for t = n - 1 .. len - 2 - k
            rows = best[n - 1:len(ids) - 1 - k, k - 1]
            for j in topk:
                hits[j][k - 1] += int((rows[:, :j] == truth[:, None]).any(-1).sum())
            counts[k - 1] += len(truth)
    out = {f"top{j}": [h / max(c, 1) for h, c in zip(hits[j], counts)] for j in topk}
    out["positions"] = counts
    return out


def rank_accuracy(heads: MedusaHeads, target, sequences: list[tuple[list[int], int]],
                  ranks: int = 10) -> list[list[float]]:
    """acc[k][r] = how often head k+1's rank-r guess is the right token (teacher-forced, as in
    `head_accuracy`): the input of Medusa's sparse-tree construction (`tree.sparse_paths`)."""
    acc = head_accuracy(heads, target, sequences, topk=tuple(range(1, ranks + 1)))
    return [[acc[f"top{r + 1}"][k] - (acc[f"top{r}"][k] if r else 0.0) for r in range(ranks)]
            for k in range(heads.num_heads)]


# ----------------------------------------------------------------------------- training
def lr_at(step: int, steps: int, peak: float = 3e-4, warmup: int = 500, eta_min: float = 1e-5,
          cosine_steps: int | None = None) -> float:
    """The heads' learning rate at `step` (`training.lr_schedule`: transformers' warm-up and cosine
    schedule with a floor): linear warm-up to `peak` over `warmup` steps, then cosine to `eta_min` over
    the remaining `cosine_steps` (default: the rest of training), then `eta_min`. Notebook 06's schedule
    bug is `cosine_steps` far too small with `eta_min=0`: the rate is 0 for most of training."""
    return _schedule(steps, peak, warmup, eta_min, cosine_steps)(step)


def _schedule(steps: int, peak: float, warmup: int, eta_min: float, cosine_steps: int | None):
    cosine_steps = max(1, steps - warmup) if cosine_steps is None else max(1, cosine_steps)
    return lr_schedule(peak, warmup, warmup + cosine_steps, eta_min)


def train_heads(heads: MedusaHeads, batches, steps: int, peak_lr: float = 3e-4, warmup: int = 500,
                eta_min: float = 1e-5, cosine_steps: int | None = None, clip: float = 1.0,
                log_every: int = 25, evaluate=None, eval_every: int = 250,
                time_budget_s: float = float("inf")) -> list[dict]:
    """AdamW on the heads' residual blocks. `batches()` returns (hidden [B, n, H], target logits
    [B, n, V], mask [B, n]) for one step; `evaluate(heads)` (optional) returns a dict logged every
    `eval_every` steps. Returns the log (step, loss, per-head agreement, lr, seconds)."""
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.0)
    device = heads.blocks[0].weight.device
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    master = heads.blocks[0].weight.dtype
    if device.type == "cuda" and master != torch.float32:
        heads.blocks.float()  # fp32 master weights under bf16 autocast
    rate = _schedule(steps, peak_lr, warmup, eta_min, cosine_steps)
    log, start = [], time.time()
    heads.train()
    for step in progress(range(steps), desc="training heads"):
        lr = rate(step)
        for group in opt.param_groups:
            group["lr"] = lr
        hidden, target_logits, mask = batches()
        with autocast:
            loss, agree = heads_loss(heads, hidden, target_logits, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        heads.trained_steps += 1
        last = step == steps - 1 or time.time() - start > time_budget_s
        if step % log_every == 0 or last:
            entry = {"step": step, "loss": loss.item(), "agreement": agree, "lr": lr,
                     "seconds": round(time.time() - start, 2)}
            if evaluate is not None and (step % eval_every == 0 or last):
                heads.eval()
                with autocast:
                    entry["heldout"] = evaluate(heads)
                heads.train()
            log.append(entry)
        if last:
            break
    heads.eval()
    if device.type == "cuda":
        heads.blocks.to(master)
    return log


def heldout_sequences(target, tokenizer, rows: list[dict], new_tokens: int = 64) -> list[tuple[list[int], int]]:
    """(prompt + the target's greedy continuation, prompt length) for each row."""
    continuations = greedy_continuations(target, tokenizer, rows, new_tokens)
    out = []
    for row, cont in zip(rows, continuations):
        prompt = tokenizer(format_prompt(tokenizer, row), add_special_tokens=False).input_ids
        out.append((prompt + cont, len(prompt)))
    return out
