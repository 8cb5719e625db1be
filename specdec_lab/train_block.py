"""Train a block drafter (`core/block.py`, DFlash's recipe) on target-written text, on one GPU or several.

Each step runs the frozen target over a batch of rows the target wrote itself (`write_corpus`), capturing the
features at the drafter's layers and the target's logits (`training.target_pass`), then draws `anchors` random
anchor positions per row. The block anchored at position s reads the context before s (`block.block_mask`: what
exists at decode time when s is the newest token) and its slot i learns the target's distribution of token s + i
(the target's logits at position s + i - 1), in the draft vocabulary, weighted 0.8^(i-1): slot i only counts when
slots 1..i-1 were accepted, the same weighting as the EAGLE trainer's unrolled steps. The objective is KL by
default, or the acceptance objective (`objectives.py`). One loop trains it and the EAGLE heads
(`training.train`: AdamW on float32 master weights, the schedule, the time budget, data-parallel copies under
torchrun, resumable checkpoints).

    python -m specdec_lab.train_block --corpus corpus.pt --device cuda --steps 6000 \\
        --out data/models/block-drafter                                          # one GPU
    torchrun --nproc_per_node 4 -m specdec_lab.train_block --corpus corpus.pt --steps 6000 \\
        --checkpoint block.state --out data/models/block-drafter                 # four GPUs, resumable sittings
    python -m specdec_lab.train_block --corpus corpus.pt --device cpu --steps 5 --batch-size 2 \\
        --max-len 64 --eval-prompts 4 --vocab-size 256 --out /tmp/block          # a CPU smoke run

After training the drafter is measured on the target's greedy continuations of the held-out prompts: tau per
drafting round at gamma 3, 5 and block_size - 1, exact for greedy decoding (the block anchored at a round's newest
token is what that round drafts; `theory.simulate_rounds` counts the engine's rounds over those matches).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from specdec_utils import objectives, report, theory
from specdec_utils.core.block import BlockDrafter, block_loss, block_mask
from specdec_utils.prompts import build_prompts, format_prompt
from specdec_utils.training import target_pass
from specdec_utils.utils import command_line, seed_everything

from . import distributed
from .train_draft import device_name, frozen_target, greedy_continuations, in_float32
from .train_eagle import by_position, choose_vocab, train


@torch.no_grad()
def block_matches(drafter: BlockDrafter, target, ids: torch.Tensor, n: int) -> torch.Tensor:
    """`matches[m, k]`: is the k-th draft right in the round whose newest token is ids[0, n + m] (one block per
    continuation token, all drafted in one batched pass over the target's features of `ids` [1, length])?"""
    length = ids.shape[1]
    feats, _ = target_pass(target, drafter, ids, None)
    starts = torch.arange(n, length, device=ids.device)[None]
    logits = drafter(drafter.fuse(feats), ids.gather(1, starts), starts, block_mask(starts, length))[0]
    wanted = starts[0, :, None] + 1 + torch.arange(drafter.block_size - 1, device=ids.device)
    # the Markov head reads the token before each slot: the true one, which a round drafted too while it matched
    guesses = drafter.draft_ids(logits + drafter.markov(ids[0, (wanted - 1).clamp(max=length - 1)]))
    return ((wanted < length) & (guesses == ids[0, wanted.clamp(max=length - 1)])).cpu()


@torch.no_grad()
def evaluate(drafter: BlockDrafter, target, tokenizer, rows: list[dict], continuations: list[list[int]],
             gammas=(3, 5)) -> dict:
    """First-slot agreement and tau per drafting round on the target's greedy continuations (exact for greedy
    decoding): a round whose newest token is continuation token m (position n + m) drafts the block anchored
    there, and its k-th draft is right when it equals the token at position n + m + 1 + k."""
    b = drafter.block_size
    gammas = sorted({g for g in (*gammas, b - 1) if g <= b - 1})
    first, total, produced, positions = 0, 0, {g: [] for g in gammas}, []
    for row, cont in zip(rows, continuations):
        prompt = tokenizer(format_prompt(tokenizer, row), add_special_tokens=False).input_ids
        ids = torch.tensor([prompt + cont], device=target.device)
        matches = block_matches(drafter, target, ids, len(prompt))
        first += int(matches[:-1, 0].sum())
        total += max(len(cont) - 1, 0)
        positions.append(theory.position_counts(theory.simulate_rounds(matches, b - 1), b - 1))
        for g in gammas:
            rounds = [r.new_tokens for r in theory.simulate_rounds(matches, g)]
            produced[g].append((sum(rounds), len(rounds)))
    out = {"first_token_agreement": first / max(total, 1), "prompts": len(rows), "positions": total,
           f"acceptance_by_position_gamma{b - 1}": by_position(positions)}
    for g in gammas:
        tau = report.ratio_interval(produced[g])
        out[f"tau_gamma{g}"], out[f"tau_gamma{g}_interval"] = tau.value, [tau.low, tau.high]
        out[f"tau_gamma{g}_per_prompt"] = produced[g]  # (tokens, rounds) per prompt: paired comparisons
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="target-written text (write_corpus)")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    ap.add_argument("--block-size", type=int, default=8, help="the anchor and block_size - 1 drafted slots")
    ap.add_argument("--layers", type=int, default=1, help="draft layers")
    ap.add_argument("--markov-rank", type=int, default=0,
                    help="DSpark's sequential correction: a Markov head of this rank over the draft vocabulary "
                         "(0: none)")
    ap.add_argument("--vocab-size", type=int, default=8192, help="draft vocabulary (the tokens the target writes most)")
    ap.add_argument("--anchors", type=int, default=8, help="blocks per training row")
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--time-budget-s", type=float, default=float("inf"))
    ap.add_argument("--batch-size", type=int, default=16, help="rows per GPU")
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--objective", choices=objectives.OBJECTIVES, default="kl")
    ap.add_argument("--lk-weight", type=float, default=1.0)
    ap.add_argument("--eval-prompts", type=int, default=0, help="held-out prompts to measure on (0 = all)")
    ap.add_argument("--out", type=Path, default=None, help="save the drafter here, e.g. data/models/block-drafter")
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="save the training state here every --checkpoint-every steps, and resume from it")
    ap.add_argument("--checkpoint-every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for arg, low in (("block_size", 2), ("layers", 1), ("markov_rank", 0), ("vocab_size", 1), ("anchors", 1),
                     ("steps", 1), ("batch_size", 1), ("max_len", 3)):
        if getattr(args, arg) < low:
            ap.error(f"--{arg.replace('_', '-')} must be >= {low}, got {getattr(args, arg)}")
    if not args.corpus.exists():
        ap.error(f"--corpus {args.corpus}: no such file (write it with python -m specdec_lab.write_corpus)")
    return args


def main(argv=None):
    from .write_corpus import load_corpus
    args = parse_args(argv)
    command = command_line("specdec_lab.train_block", argv)
    copy_device = distributed.setup()  # under torchrun: this copy's GPU
    if copy_device is not None:
        args.device = str(copy_device)
        command = command_line("specdec_lab.train_block", argv, distributed.world_size())
    seed_everything(args.seed)
    target, tokenizer, _ = frozen_target(args)
    corpus = load_corpus(args.corpus)
    vocab_ids, coverage = choose_vocab(corpus, args.vocab_size, target.config.vocab_size)
    drafter = BlockDrafter(target, args.block_size, args.layers, vocab_ids=vocab_ids.to(target.device),
                           markov_rank=args.markov_rank)
    recipe = {"anchors": args.anchors, "objective": args.objective, "lk_weight": args.lk_weight, "seed": args.seed}

    started = time.time()
    log = train(drafter, target, corpus, recipe, args.steps, args.batch_size, args.lr, args.max_len, args.seed,
                args.time_budget_s, checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every, loss=block_loss)
    seconds = time.time() - started
    if distributed.is_main():  # the first copy measures and saves
        rows = build_prompts("eval")
        if args.eval_prompts:
            rows = random.Random(args.seed).sample(rows, min(args.eval_prompts, len(rows)))
        drafter.eval()
        with in_float32(target):  # tau in float32, as the course measures it everywhere
            continuations = greedy_continuations(target, tokenizer, rows, 64)
        with in_float32(target, drafter):  # as saved (bfloat16) and loaded (float32)
            metrics = evaluate(drafter, target, tokenizer, rows, continuations)
        print(json.dumps(metrics), flush=True)
        drafter.log = {"command": command, "objective": args.objective, "gpus": distributed.world_size(),
                       "batch_size_per_gpu": args.batch_size, "corpus_tokens": corpus.num_tokens,
                       "vocab_coverage": coverage, "seconds": round(seconds, 1), "eval": metrics, "train_log": log,
                       "device": device_name(target.device),
                       "dtype": str(next(target.parameters()).dtype).removeprefix("torch.")}
        if args.out is not None:
            drafter.save(args.out)
    distributed.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
