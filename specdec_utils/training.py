"""Training a drafter on the target's own text, in short: the corpus (the target's continuations of training
prompts), padded batches, the learning-rate schedule, the frozen target's features and logits, and one training
loop. The loop is the one the lessons run live for a few steps on a CPU and the one the lab's trainers run for
hours on GPUs: the lab passes its data-parallel hooks (`parallel`) and a checkpoint file; without them it trains
in this one process. The losses live beside their models (`eagle.eagle_loss`, `block.block_loss`); what they
minimise per position is `objectives`."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch
from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup_lr_rate

from .core.hidden import capture_hidden
from .prompts import format_prompt


def greedy_continuations(target, tokenizer, rows: list[dict], new_tokens: int, batch_size: int = 64) -> list[list[int]]:
    """The target's greedy continuation of each row (batched, left-padded), cut after EOS."""
    tokenizer.padding_side = "left"
    eos, out = tokenizer.eos_token_id, []
    for i in range(0, len(rows), batch_size):
        texts = [format_prompt(tokenizer, r) for r in rows[i:i + batch_size]]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(target.device)
        gen = target.generate(**enc, max_new_tokens=new_tokens, do_sample=False, top_p=None, top_k=None,
                              temperature=None, pad_token_id=eos)[:, enc.input_ids.shape[1]:].tolist()
        out += [g[:g.index(eos) + 1] if eos in g else g for g in gen]
    return out


def continuation_corpus(target, tokenizer, rows: list[dict], new_tokens: int) -> list[dict]:
    """A corpus of the target's own text: each row's prompt followed by the target's greedy continuation
    (`{"ids": [...]}` per row), what a drafter learns to predict."""
    continuations = greedy_continuations(target, tokenizer, rows, new_tokens)
    prompts = [tokenizer(format_prompt(tokenizer, r), add_special_tokens=False).input_ids for r in rows]
    return [{"ids": p + c} for p, c in zip(prompts, continuations)]


def batch(corpus, idx, max_len: int | None, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) [len(idx), longest] of the corpus rows `idx`, right-padded with 0 and cut to
    `max_len` tokens (None: whole rows). A corpus object with its own `batch` method pads on its own."""
    if hasattr(corpus, "batch"):
        return corpus.batch(idx, max_len, device)
    seqs = [corpus[i]["ids"][:max_len] for i in idx]
    length = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), length, dtype=torch.long)
    mask = torch.zeros(len(seqs), length, dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, :len(s)] = torch.tensor(s)
        mask[row, :len(s)] = 1
    return ids.to(device), mask.to(device)


def lr_schedule(peak: float, warmup: int, total: int, floor: float):
    """The learning rate at a step, as a function (of a fractional step too, for a time budget): transformers'
    linear warm-up to `peak` over `warmup` steps, then cosine decay to `floor`, reached at the last of `total`
    steps (`get_cosine_with_min_lr_schedule_with_warmup_lr_rate`, whose first step already trains at
    peak / warmup), and `floor` after it (the library's cosine would rise again)."""
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak)  # the library schedules an optimizer
    factor = get_cosine_with_min_lr_schedule_with_warmup_lr_rate(probe, warmup, total, min_lr=floor).lr_lambdas[0]
    return lambda step: peak * factor(min(step, total - 1))


def target_pass(target, drafter, ids, mask):
    """The frozen target's features (at the layers the drafter reads, `drafter.target_hidden`) and logits."""
    with torch.no_grad(), capture_hidden(target, drafter.target_hidden) as feats:
        logits = target(input_ids=ids, attention_mask=mask).logits
    return feats[0], logits


class OneProcess:
    """The data-parallel hooks of `train` for a single process: every copy is this one."""

    @staticmethod
    def world_size() -> int:
        return 1

    @staticmethod
    def is_main() -> bool:
        return True

    @staticmethod
    def agree_max(value: float, device) -> float:
        return value

    @staticmethod
    def shard(indices: list) -> list:
        return indices

    @staticmethod
    def average_gradients(params) -> None:
        return None

    @staticmethod
    def load_checkpoint(path, device) -> dict | None:
        return None if path is None or not Path(path).exists() else torch.load(path, map_location=device,
                                                                                weights_only=False)

    @staticmethod
    def save_checkpoint(path, state: dict) -> None:
        torch.save(state, Path(path).with_suffix(".tmp"))
        Path(path).with_suffix(".tmp").replace(path)


def train(drafter, target, corpus, recipe: dict, steps: int, batch_size: int, lr: float, max_len: int, loss,
          seed: int = 0, time_budget_s: float = float("inf"), log_every: int = 50, verbose: bool = True,
          checkpoint: Path | None = None, checkpoint_every: int = 0, until: int | None = None,
          parallel=OneProcess) -> list[dict]:
    """Train `drafter` (an EAGLE head or a block drafter, reading the frozen `target`) on `corpus` with
    `loss(drafter, features, ids, mask, target_logits, recipe)` -> (loss, agreements): AdamW on fp32 master
    weights, linear warm-up over the first 2% of `steps`, cosine decay to 10% of `lr` (`lr_schedule`), gradients
    clipped at 0.5; batches of `batch_size` rows drawn without replacement, cut to `max_len` tokens. Returns the
    log (every `log_every` steps: loss, agreement per step or slot, lr, seconds).

    `parallel`: data-parallel hooks (the lab's `distributed` under torchrun: each copy trains on its slice of one
    global sample of `batch_size` x world rows and the gradients are averaged). `checkpoint` (a file): written every
    `checkpoint_every` steps and at the end, and read back if it exists when training starts, so training goes on
    in several sittings. `until`: end this sitting after that many steps in all (the schedule still spans `steps`)."""
    device = target.device
    drafter.train()
    params = [p for p in drafter.parameters() if p.requires_grad]
    master = [p.detach().float().clone().requires_grad_(True) for p in params]  # fp32 master weights
    opt = torch.optim.AdamW(master, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    rate = lr_schedule(lr, max(1, steps // 50), steps, 0.1 * lr)
    rng = random.Random(seed)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    log, spent, first = [], 0.0, 0
    state = parallel.load_checkpoint(checkpoint, device)
    if state is not None:
        with torch.no_grad():
            for p, m, saved in zip(params, master, state["master"]):
                m.copy_(saved)
                p.copy_(m)
        opt.load_state_dict(state["opt"])
        rng.setstate(state["rng"])
        log, spent, first = state["log"], state["seconds"], state["step"]
    world, start, step = parallel.world_size(), time.time() - spent, first - 1
    for step in range(first, steps):
        done = parallel.agree_max(max(step / steps, (time.time() - start) / time_budget_s), device)
        for group in opt.param_groups:
            group["lr"] = rate(min(done, 1) * steps)
        picks = rng.sample(range(len(corpus)), min(batch_size * world, len(corpus)))
        ids, mask = batch(corpus, parallel.shard(picks), max_len, device)
        feats, logits = target_pass(target, drafter, ids, mask)
        with autocast:
            value, agree = loss(drafter, feats, ids, mask, logits, recipe)
        for p in params:
            p.grad = None
        value.backward()
        parallel.average_gradients(params)
        for p, m in zip(params, master):
            m.grad = p.grad.float() if p.grad is not None else torch.zeros_like(m)
        torch.nn.utils.clip_grad_norm_(master, 0.5)
        opt.step()
        with torch.no_grad():
            for p, m in zip(params, master):
                p.copy_(m)
        last = done >= 1 or step == steps - 1 or step + 1 == until
        if step % log_every == 0 or last:
            entry = {"step": step, "loss": value.item(), "agreement": agree, "lr": opt.param_groups[0]["lr"],
                     "seconds": round(time.time() - start, 1)}
            log.append(entry)
            if verbose and parallel.is_main():
                print(json.dumps(entry), flush=True)
        if checkpoint is not None and checkpoint_every and ((step + 1) % checkpoint_every == 0 or last):
            parallel.save_checkpoint(checkpoint, {
                "master": [m.detach() for m in master], "opt": opt.state_dict(), "rng": rng.getstate(),
                "log": log, "seconds": time.time() - start, "step": step + 1})
        if last:
            break
    drafter.trained_steps = step + 1
    drafter.eval()
    return log
