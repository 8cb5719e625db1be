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

    python -m specdec_lab.train_eagle --corpus corpus.pt --device cuda --variants eagle3 \
        --time-budget-s 330 --out data/models/eagle-head                      # the shipped head (H100)
    python -m specdec_lab.train_eagle --corpus corpus.pt --device cuda \
        --variants eagle1,eagle3-layer,fused,ttt,eagle3 --time-budget-s 88 --eval-prompts 88 --ablation ablation.json
    torchrun --nproc_per_node 4 -m specdec_lab.train_eagle --corpus corpus.pt --variants eagle3 \
        --objectives kl,lk,kl+lk --steps 3000 --eval-prompts 176 --ablation objectives.json  # the objectives' ablation
    python -m specdec_lab.train_eagle --corpus corpus.pt --device cpu --variants eagle3 --steps 5 \
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

from specdec_utils import objectives, report, theory, training
from specdec_utils.core.eagle import VARIANTS, EagleHead, build_head, eagle_loss, load_eagle
from specdec_utils.models import has_weights
from specdec_utils.prompts import build_prompts, format_prompt
from specdec_utils.utils import command_line, seed_everything

from . import distributed
from .train_draft import device_name, frozen_target, greedy_continuations, in_float32


def train(head, target, corpus, recipe: dict, steps: int, batch_size: int, lr: float, max_len: int,
          seed: int = 0, time_budget_s: float = float("inf"), log_every: int = 50, verbose: bool = True,
          checkpoint: Path | None = None, checkpoint_every: int = 0, until: int | None = None,
          loss=None) -> list[dict]:
    """`training.train` with `eagle_loss` by default (the block drafter's trainer passes `block_loss`), under
    torchrun across the copies (`distributed`)."""
    return training.train(head, target, corpus, recipe, steps, batch_size, lr, max_len, loss or eagle_loss, seed=seed,
                          time_budget_s=time_budget_s, log_every=log_every, verbose=verbose, checkpoint=checkpoint,
                          checkpoint_every=checkpoint_every, until=until, parallel=distributed)


# ----------------------------------------------------------------------------- evaluation
def by_position(pairs: list[tuple[list[int], list[int]]]) -> dict:
    """`theory.position_counts` (reached, accepted) summed over prompts: the counts and each position's rate."""
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
        feats, _ = training.target_pass(target, head, ids, None)
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
        # the engine's rounds (`theory.simulate_rounds`: matches[m, k] is this matrix, the prefill's round left out)
        positions.append(theory.position_counts(theory.simulate_rounds(matches, steps), steps))
        for g in gammas:
            rounds = [r.new_tokens for r in theory.simulate_rounds(matches, g)]
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
                    help=f"comma-separated, from {', '.join(objectives.OBJECTIVES)} (specdec_utils.objectives); each "
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
    command = command_line("specdec_lab.train_eagle", argv)
    copy_device = distributed.setup()  # under torchrun: this copy's GPU
    if copy_device is not None:
        args.device = str(copy_device)
        command = command_line("specdec_lab.train_eagle", argv, distributed.world_size())
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
