"""Train EAGLE heads on the frozen target (notebook 07), online: each step runs the target over a batch of
target-written text (`write_corpus`), captures its features, and trains the head to predict the target's
own next-token distributions from them.

Recipes (`--variants`, each one change on the previous: the ablation of notebook 07):

| variant | layer | features | loss | unrolled steps (ttt) | draft vocabulary |
|---|---|---|---|---|---|
| `eagle1` | fc([emb; f]) -> layer (EAGLE-1) | last, post-norm | smooth-L1 on f + 0.1 soft CE, input noise | 1 | full |
| `eagle3-layer` | [norm(emb); norm(fc(f))] -> layer, own output norm (EAGLE-3) | last, pre-norm | soft CE | 1 | full |
| `fused` | EAGLE-3 | layers 2, 15, 27 (pre-norm) | soft CE | 1 | full |
| `ttt` | EAGLE-3 | layers 2, 15, 27 | soft CE, sum of 0.8^k x step k | 5 | full |
| `eagle3` | EAGLE-3 | layers 2, 15, 27 | the same | 5 | the 8,192 tokens the target writes most |

The objective (`--objectives`, `objectives.py`): KL to the target's distribution (EAGLE's soft cross-entropy, the
default), the acceptance objective -log sum min(p, q) (after LK losses), or both.
AdamW (betas 0.9, 0.95), linear warm-up then cosine decay to 10% (`train_draft.lr_schedule`), gradient clip
0.5 (EAGLE's), bf16 autocast on CUDA; a time budget per variant. After training, each head is measured on
the target's greedy continuations of the held-out prompts: first-token agreement and the chain's tau at
gamma 4 and 6, simulated exactly from one unrolled forward (greedy: a drafted chain is accepted up to its
first mismatch; step k of the unrolled forward, counting from 0, *is* draft k + 1 when the earlier ones were right).

    python -m specdec_utils.tools.train_eagle --corpus corpus.pt --device cuda --variants eagle3 \
        --time-budget-s 330 --out data/models/eagle-head                      # the shipped head (H100)
    python -m specdec_utils.tools.train_eagle --corpus corpus.pt --device cuda \
        --variants eagle1,eagle3-layer,fused,ttt,eagle3 --time-budget-s 88 --eval-prompts 88 --ablation ablation.json
    torchrun --nproc_per_node 4 -m specdec_utils.tools.train_eagle --corpus corpus.pt --variants eagle3 \
        --objectives kl,lk,kl+lk --steps 3000 --eval-prompts 176 --ablation objectives.json  # the objectives' ablation
    python -m specdec_utils.tools.train_eagle --corpus corpus.pt --device cpu --variants eagle3 --steps 5 \
        --batch-size 2 --max-len 64 --eval-prompts 4 --out /tmp/head           # a CPU smoke run
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import report
from ..core.eagle import EagleHead, load_eagle
from ..core.hidden import capture_hidden, final_norm
from ..models import has_weights
from ..prompts import build_prompts, format_prompt
from ..utils import command_line, seed_everything
from . import distributed, objectives
from .train_draft import device_name, frozen_target, greedy_continuations, in_float32, lr_schedule

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


def target_pass(target, head: EagleHead, ids, mask):
    """The frozen target's features (at the head's layers) and logits on a batch."""
    with torch.no_grad(), capture_hidden(target, head.target_hidden) as feats:
        logits = target(input_ids=ids, attention_mask=mask).logits
    return feats[0], logits


def train(head: EagleHead, target, corpus, recipe: dict, steps: int, batch_size: int, lr: float, max_len: int,
          seed: int = 0, time_budget_s: float = float("inf"), log_every: int = 50, verbose: bool = True,
          checkpoint: Path | None = None, checkpoint_every: int = 0, until: int | None = None,
          loss=None) -> list[dict]:
    """Train `head` with `recipe` (a `VARIANTS` entry): AdamW on fp32 master weights, the schedule and budget of
    `train_draft.train`. Returns the log (every `log_every` steps: loss, per-step agreement, lr, seconds).
    `loss(head, features, ids, mask, target_logits, recipe)` -> (loss, agreements): `eagle_loss` by default; the
    block drafter's trainer (`train_block`) passes its own, so both train in this one loop.

    Under torchrun (`distributed`) every copy trains on its slice of one global sample of `batch_size` x world rows
    (`batch_size` per GPU) and the gradients are averaged, so the copies keep the same weights. `checkpoint` (a
    file): written by the first copy every `checkpoint_every` steps and at the end, and read back if it exists when
    training starts: the head, its master weights, the optimizer, the sampler, the step and the time spent all go
    on from there (a machine held for a limited time trains in several sittings). `until`: end this sitting after
    that many steps in all (the schedule still spans `steps`)."""
    device = target.device
    head.train()
    params = [p for p in head.parameters() if p.requires_grad]
    master = [p.detach().float().clone().requires_grad_(True) for p in params]  # fp32 master weights
    opt = torch.optim.AdamW(master, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    rate = lr_schedule(lr, max(1, steps // 50), steps, 0.1 * lr)
    rng = random.Random(seed)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    log, spent, first = [], 0.0, 0
    state = distributed.load_checkpoint(checkpoint, device)
    if state is not None:
        with torch.no_grad():
            for p, m, saved in zip(params, master, state["master"]):
                m.copy_(saved)
                p.copy_(m)
        opt.load_state_dict(state["opt"])
        rng.setstate(state["rng"])
        log, spent, first = state["log"], state["seconds"], state["step"]
    world, start, step = distributed.world_size(), time.time() - spent, first - 1
    for step in range(first, steps):
        done = distributed.agree_max(max(step / steps, (time.time() - start) / time_budget_s), device)
        for group in opt.param_groups:
            group["lr"] = rate(min(done, 1) * steps)
        picks = rng.sample(range(len(corpus)), min(batch_size * world, len(corpus)))
        ids, mask = corpus.batch(distributed.shard(picks), max_len, device)
        feats, logits = target_pass(target, head, ids, mask)
        with autocast:
            value, agree = (loss or eagle_loss)(head, feats, ids, mask, logits, recipe)
        for p in params:
            p.grad = None
        value.backward()
        distributed.average_gradients(params)
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
            if verbose and distributed.is_main():
                print(json.dumps(entry), flush=True)
        if checkpoint is not None and checkpoint_every and ((step + 1) % checkpoint_every == 0 or last):
            distributed.save_checkpoint(checkpoint, {
                "master": [m.detach() for m in master], "opt": opt.state_dict(), "rng": rng.getstate(),
                "log": log, "seconds": time.time() - start, "step": step + 1})
        if last:
            break
    head.trained_steps = step + 1
    head.eval()
    return log


# ----------------------------------------------------------------------------- evaluation
def chain_rounds(matches: torch.Tensor, gamma: int) -> list[int]:
    """Greedy chain rounds over one continuation: `matches[m, k]` says whether the k-th token drafted in a round
    whose newest token is continuation token m is right (False past the end). Each round accepts the leading
    matches (at most gamma) and adds the target's token; returns the tokens each drafting round produced (the
    prefill, which has no features to draft from, is not counted)."""
    produced, m = [], 0
    while m < matches.shape[0] - 1:
        accepted = 0
        while accepted < gamma and bool(matches[m, accepted]):
            accepted += 1
        produced.append(accepted + 1)
        m += accepted + 1
    return produced


def acceptance_by_position(matches: torch.Tensor, gamma: int) -> tuple[list[int], list[int]]:
    """The rounds of `chain_rounds`, counted by draft position: `reached[k]`, the rounds whose first k drafts were all
    accepted and whose (k+1)-th draft lies inside the continuation; `accepted[k]`, those of them that accepted it.
    accepted[k] / reached[k] is the conditional acceptance of position k + 1."""
    reached, accepted, m, count = [0] * gamma, [0] * gamma, 0, matches.shape[0]
    while m < count - 1:
        k = 0
        while k < gamma and m + 1 + k < count:
            reached[k] += 1
            if not bool(matches[m, k]):
                break
            accepted[k] += 1
            k += 1
        m += k + 1
    return reached, accepted


def by_position(pairs: list[tuple[list[int], list[int]]]) -> dict:
    """`acceptance_by_position` summed over prompts: the counts and each position's rate."""
    reached = [sum(col) for col in zip(*(r for r, _ in pairs))]
    accepted = [sum(col) for col in zip(*(a for _, a in pairs))]
    return {"reached": reached, "accepted": accepted,
            "rate": [round(a / r, 4) if r else None for a, r in zip(accepted, reached)]}


@torch.no_grad()
def evaluate(head: EagleHead, target, tokenizer, rows: list[dict], continuations: list[list[int]],
             gammas=(4, 6)) -> dict:
    """First-token agreement and chain tau (gamma 4 and 6: tokens per drafting round) on the target's greedy
    continuations, exact for greedy decoding: the unrolled forward's step k at the round's last committed entry
    is the k-th draft when the earlier ones were right."""
    steps = max(gammas)
    first, total, positions = 0, 0, []
    produced = {g: [] for g in gammas}
    for row, cont in zip(rows, continuations):
        prompt = tokenizer(format_prompt(tokenizer, row), add_special_tokens=False).input_ids
        ids = torch.tensor([prompt + cont], device=target.device)
        n, length = len(prompt), ids.shape[1]
        feats, _ = target_pass(target, head, ids, None)
        outs = head.ttt_forward(feats, ids, steps)
        guesses = torch.stack([head.logits(h[0]).argmax(-1) for h in outs], 1)  # [L, steps]
        if head.vocab_ids is not None:
            guesses = head.vocab_ids[guesses]
        # a round whose newest token is continuation token m (position n + m) drafts from entry n + m - 1;
        # its k-th draft is right when it equals the token at position n + m + 1 + k
        count = length - n  # continuation tokens
        matches = torch.zeros(count, steps, dtype=torch.bool)
        for m in range(count):
            for k in range(steps):
                pos = n + m + 1 + k
                if pos < length:
                    matches[m, k] = bool(guesses[n + m - 1, k] == ids[0, pos])
        first += int(matches[:-1, 0].sum())
        total += max(count - 1, 0)
        positions.append(acceptance_by_position(matches, steps))
        for g in gammas:
            rounds = chain_rounds(matches, g)
            produced[g].append((sum(rounds), len(rounds)))
    out = {"first_token_agreement": first / max(total, 1), "prompts": len(rows), "positions": total,
           f"acceptance_by_position_gamma{steps}": by_position(positions)}
    for g in gammas:
        tau = report.ratio_interval(produced[g])
        out[f"tau_gamma{g}"], out[f"tau_gamma{g}_interval"] = tau.value, [tau.low, tau.high]
        out[f"tau_gamma{g}_per_prompt"] = produced[g]  # (tokens, rounds) per prompt: paired comparisons
    return out


def choose_vocab(corpus, size: int, full: int) -> tuple[torch.Tensor, float]:
    """The `size` tokens the target writes most (continuation tokens of the corpus), and their coverage."""
    counts = torch.bincount(corpus.continuation_tokens().long(), minlength=full)
    top = counts.topk(min(size, full)).indices
    return torch.sort(top).values, float(counts[top].sum() / counts.sum())


# ----------------------------------------------------------------------------- CLI
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="target-written text (write_corpus)")
    ap.add_argument("--variants", default="eagle3", help=f"comma-separated, from {', '.join(VARIANTS)}")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    ap.add_argument("--steps", type=int, default=100000, help="most steps (the time budget usually ends first)")
    ap.add_argument("--time-budget-s", type=float, default=float("inf"), help="per variant")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--eval-prompts", type=int, default=0, help="held-out prompts to measure on (0 = all)")
    ap.add_argument("--out", type=Path, default=None, help="save the (last) head here, e.g. data/models/eagle-head")
    ap.add_argument("--init", type=Path, default=None,
                    help="go on training this saved head (one variant: the head's own recipe), "
                         "e.g. data/models/eagle-head")
    ap.add_argument("--ablation", type=Path, default=None, help="write every variant's measurements here (JSON)")
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="save the training state here every --checkpoint-every steps, and resume from it if it "
                         "exists (one variant)")
    ap.add_argument("--checkpoint-every", type=int, default=200)
    ap.add_argument("--objectives", default="kl",
                    help=f"comma-separated, from {', '.join(objectives.OBJECTIVES)} (tools/objectives.py); each "
                         "variant is trained once per objective (an ablation: the same corpus, seed and steps)")
    ap.add_argument("--lk-weight", type=float, default=1.0, help="kl+lk: the weight of the acceptance term")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.variants = args.variants.split(",")
    args.objectives = args.objectives.split(",")
    bad = [o for o in args.objectives if o not in objectives.OBJECTIVES]
    if bad:
        ap.error(f"argument --objectives: unknown objective {bad[0]!r}; allowed: {', '.join(objectives.OBJECTIVES)}")
    if args.checkpoint is not None and len(args.variants) * len(args.objectives) != 1:
        ap.error(f"--checkpoint: one variant and one objective at a time, got --variants {','.join(args.variants)} "
                 f"--objectives {','.join(args.objectives)}")
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"argument --variants: unknown variant {unknown[0]!r}; allowed: {', '.join(VARIANTS)}")
    if args.init is not None and (len(args.variants) * len(args.objectives) != 1
                                  or not has_weights(args.init, "head.safetensors")):
        ap.error(f"--init: one variant and a folder with head.safetensors (a head saved by train_eagle); got "
                 f"--variants {','.join(args.variants)} and --init {args.init}")
    return args


def main(argv=None):
    from .write_corpus import load_corpus
    args = parse_args(argv)
    command = command_line("specdec_utils.tools.train_eagle", argv)
    copy_device = distributed.setup()  # under torchrun: this copy's GPU
    if copy_device is not None:
        args.device = str(copy_device)
        command = command_line("specdec_utils.tools.train_eagle", argv, distributed.world_size())
    main_copy = distributed.is_main()
    seed_everything(args.seed)
    target, tokenizer, dtype = frozen_target(args)
    corpus = load_corpus(args.corpus)
    if main_copy:
        print(f"corpus: {len(corpus)} sequences, {corpus.num_tokens} tokens", flush=True)
    eval_rows = build_prompts("eval")
    if args.eval_prompts:
        eval_rows = random.Random(args.seed).sample(eval_rows, min(args.eval_prompts, len(eval_rows)))
    continuations = None
    if main_copy:
        with in_float32(target):  # tau in float32, as the course measures it everywhere
            continuations = greedy_continuations(target, tokenizer, eval_rows, 64)
    vocab_ids, coverage = choose_vocab(corpus, VARIANTS["eagle3"]["vocab"], target.config.vocab_size)
    print(f"draft vocabulary: {len(vocab_ids)} tokens cover {coverage:.2%} of continuation tokens", flush=True)
    device = device_name(target.device)
    results = []
    runs = [(variant, objective) for variant in args.variants for objective in args.objectives]
    for variant, objective in runs:
        name = variant if len(args.objectives) == 1 and objective == "kl" else f"{variant}/{objective}"
        recipe = {**VARIANTS[variant], "objective": objective, "lk_weight": args.lk_weight}
        seed_everything(args.seed)
        if args.init:  # go on from a saved head: its own layer, features and draft vocabulary
            head = load_eagle(args.init, target)
            if head.config_dict()["layer"] != recipe["layer"] or (head.vocab_ids is None) != (not recipe["vocab"]):
                raise SystemExit(f"--init {args.init}: that head was not trained with the {variant!r} recipe; "
                                 f"pick the variant it was trained with")
            before = {**head.log, "trained_steps": head.trained_steps}  # its log, earlier rounds included
            if head.vocab_ids is not None:
                coverage = float(torch.isin(corpus.continuation_tokens(), head.vocab_ids.cpu()).float().mean())
        else:
            head, before = build_head(target, recipe, vocab_ids), None
        started = time.time()
        log = train(head, target, corpus, recipe, args.steps, args.batch_size, args.lr, args.max_len,
                    args.seed, args.time_budget_s, checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every)
        seconds = time.time() - started
        if not main_copy:
            continue  # the first copy measures and saves
        round_steps = head.trained_steps
        if before is not None:
            head.trained_steps += before["trained_steps"]  # all rounds; "steps" below is this round's
        with in_float32(target, head):  # as saved (bfloat16) and loaded (float32)
            metrics = evaluate(head, target, tokenizer, eval_rows, continuations)
        print(name, json.dumps(metrics), flush=True)
        record = {"variant": name, "recipe": recipe, "steps": round_steps, "seconds": round(seconds, 1),
                  "gpus": distributed.world_size(),
                  "tokens_seen": round_steps * args.batch_size * distributed.world_size() * args.max_len,
                  "parameters": sum(p.numel() for p in head.parameters()), "eval": metrics}
        results.append(record)
        head.log = {"command": command, "device": device, "dtype": str(dtype).replace("torch.", ""),
                    "corpus_tokens": corpus.num_tokens, "corpus_sequences": len(corpus),
                    "vocab_coverage": coverage if recipe["vocab"] else 1.0, "batch_size": args.batch_size,
                    "max_len": args.max_len, "lr": args.lr, **record, "curve": log}
        if before is not None:
            head.log["continued_from"] = before
        if args.ablation:
            args.ablation.write_text(json.dumps({"command": command, "device": device, "variants": results,
                                                 "eval_prompts": len(eval_rows)}, indent=1))
    if args.out and main_copy:
        head.name = args.out.name
        head.save(args.out)
        print(f"saved {args.out}", flush=True)
    distributed.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
