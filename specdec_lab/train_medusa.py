"""Train Medusa heads on the frozen target (notebook 06), by distillation on target-written text.

Head k at every position t of every sequence learns the target's own distribution at t + k (forward
KL), read from the same target forward that supplies the hidden states: no labels, no other model.
Recipe: AdamW, peak lr 3e-4 after 500 linear warm-up steps, cosine to 1e-5, gradient
clip 1.0, bf16 autocast on CUDA.

    python -m specdec_lab.train_medusa --device cuda                 # the shipped heads (H100)
    python -m specdec_lab.train_medusa --device cpu --sequences 32 --new-tokens 32 --steps 20 \
        --out /tmp/heads                                               # a CPU smoke run
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

from specdec_utils.core.medusa import (
    HEADS_NAME,
    MedusaHeads,
    capture_hidden,
    head_accuracy,
    heldout_sequences,
    load_heads,
    rank_accuracy,
    train_heads,
)
from specdec_utils.models import MODELS_DIR
from specdec_utils.prompts import build_prompts
from specdec_utils.training import batch
from specdec_utils.utils import command_line, seed_everything

from .train_draft import frozen_target, load_or_write_corpus


def target_batches(target, corpus: list[dict], batch_size: int, max_len: int, seed: int = 0):
    """A `batches` function for `train_heads`: random corpus sequences through the frozen target."""
    rng = random.Random(seed)

    @torch.no_grad()
    def batches():
        ids, mask = batch(corpus, rng.sample(range(len(corpus)), min(batch_size, len(corpus))), max_len,
                          target.device)
        with capture_hidden(target) as hidden:
            logits = target(input_ids=ids, attention_mask=mask).logits
        return hidden[0], logits, mask
    return batches


def measure_ranks(heads, target, tokenizer, args, dtype) -> None:
    """heads.rank_accuracy on `--rank-prompts` train prompts (not the held-out ones the notebook
    evaluates on): P(rank-r guess of head k is the target's greedy token), saved with the heads."""
    rows = random.Random(args.seed).sample(build_prompts("train"), args.rank_prompts)
    heads.rank_accuracy = rank_accuracy(heads, target, heldout_sequences(target, tokenizer, rows), ranks=10)
    heads.rank_accuracy_source = (f"{args.rank_prompts} train prompts, the target's greedy 64-token continuations, "
                                  f"{target.device.type} {str(dtype).replace('torch.', '')}")
    print("rank accuracy:", json.dumps([[round(a, 4) for a in row] for row in heads.rank_accuracy]), flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--device", default=None)
    ap.add_argument("--num-heads", type=int, default=4)
    ap.add_argument("--sequences", type=int, default=12288, help="corpus size (target-written sequences)")
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--gen-batch", type=int, default=512)
    ap.add_argument("--gen-budget-s", type=float, default=float("inf"), help="stop writing the corpus after this")
    ap.add_argument("--corpus", type=Path, default=None, help="cache the corpus here (reused if present)")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--eta-min", type=float, default=1e-5)
    ap.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts for the curves (0 = all)")
    ap.add_argument("--heldout-prompts", type=int, default=0, help="held-out prompts for the final table (0 = all)")
    ap.add_argument("--train-budget-s", type=float, default=float("inf"))
    ap.add_argument("--out", type=Path, default=MODELS_DIR / HEADS_NAME)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ranks-only", action="store_true",
                    help="only (re)measure the rank accuracies of the heads at --out (the sparse tree's input)")
    ap.add_argument("--rank-prompts", type=int, default=96, help="train prompts for the rank accuracies")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    args = ap.parse_args(argv)
    if args.num_heads < 1 or args.steps < 1 or args.batch_size < 1:
        ap.error("--num-heads, --steps and --batch-size must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    seed_everything(args.seed)
    target, tokenizer, dtype = frozen_target(args)
    if args.ranks_only:
        heads = load_heads(args.out, target)
        measure_ranks(heads, target, tokenizer, args, dtype)
        heads.save(args.out)
        return 0
    corpus, n_tokens = load_or_write_corpus(target, tokenizer, args)
    eval_rows = build_prompts("eval")
    if args.heldout_prompts:
        eval_rows = random.Random(args.seed).sample(eval_rows, min(args.heldout_prompts, len(eval_rows)))
    curve_rows = random.Random(args.seed).sample(eval_rows, min(args.eval_prompts or len(eval_rows), len(eval_rows)))
    all_seqs = heldout_sequences(target, tokenizer, eval_rows)
    curve_seqs = [all_seqs[eval_rows.index(r)] for r in curve_rows]
    heads = MedusaHeads(target, args.num_heads)
    step0 = head_accuracy(heads, target, all_seqs)
    print("step 0 (every head = the target's next-token predictor):", json.dumps(step0), flush=True)
    log = train_heads(heads, target_batches(target, corpus, args.batch_size, args.max_len, args.seed),
                      args.steps, args.lr, args.warmup, args.eta_min,
                      evaluate=lambda h: head_accuracy(h, target, curve_seqs, topk=(1,)),
                      time_budget_s=args.train_budget_s)
    final = head_accuracy(heads, target, all_seqs)
    print("trained:", json.dumps(final), flush=True)
    measure_ranks(heads, target, tokenizer, args, dtype)
    heads.save(args.out)
    command = command_line("specdec_lab.train_medusa", argv)
    record = {"name": args.out.name, "command": command, "num_heads": args.num_heads,
              "parameters": sum(p.numel() for p in heads.blocks.parameters()),
              "corpus_sequences": len(corpus), "corpus_tokens": n_tokens,
              "recipe": {"peak_lr": args.lr, "warmup": args.warmup, "eta_min": args.eta_min, "clip": 1.0,
                         "batch_size": args.batch_size, "max_len": args.max_len, "steps": heads.trained_steps},
              "device": torch.cuda.get_device_name() if target.device.type == "cuda" else "cpu",
              "dtype": str(dtype).replace("torch.", ""),
              "eval_prompts": len(eval_rows), "step0": step0, "eval": final, "log": log}
    (args.out / "training_log.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
