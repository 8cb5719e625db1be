"""Distil small drafts from the target (knowledge distillation, as in DistillSpec, Zhou et al. 2024).

The target writes its own training text: greedy (and some sampled) continuations of the course's
training prompts, of prompts whose first tokens it sampled itself (for variety), and of windows of
Python standard-library source (real code that exists offline). A draft is trained to match the
target's full next-token distribution on that text (forward KL, Sec. 4 of DistillSpec), in a
reduced vocabulary: the `vocab_size` tokens the target writes most often, plus one slot for all
others (see `models.ReducedVocabLlamaForCausalLM`).

    python -m specdec_lab.train_draft --names draft-s,draft-m --device cuda   # the shipped drafts
    python -m specdec_lab.train_draft --names draft-s --device cpu --sequences 64 --steps 30 \
        --new-tokens 32 --out /tmp/drafts                                        # a CPU smoke run
    python -m specdec_lab.train_draft --names ngram --device cpu --dtype bfloat16 \
        --corpus corpus.pt                                                       # notebook 05's n-gram table
    torchrun --nproc_per_node 4 -m specdec_lab.train_draft --names draft-m --corpus corpus.pt \
        --objective kl+lk --checkpoint draft-m.state                             # four GPUs, resumable sittings

`ngram` is not trained but counted: `ngram.NgramDraft.build` over the same target-written corpus
(the continuation tokens only), evaluated like the drafts (top-1 agreement with the target's greedy
continuations of the held-out prompts, with the live text as context) and saved with its log.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import sysconfig
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import LlamaConfig

from specdec_utils import objectives, report, theory
from specdec_utils.core.ngram import NgramDraft
from specdec_utils.models import MODELS_DIR, NGRAM_NAME, ReducedVocabLlamaForCausalLM, load_model, unpacked
from specdec_utils.prompts import build_prompts, format_prompt
from specdec_utils.training import batch, greedy_continuations, lr_schedule
from specdec_utils.utils import command_line, get_device, progress, seed_everything

from . import distributed

DRAFT_SHAPES = {
    "draft-s": dict(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=768),
    "draft-m": dict(num_hidden_layers=4, hidden_size=320, num_attention_heads=5,
                    num_key_value_heads=1, intermediate_size=960),
}


# ----------------------------------------------------------------------------- data
def stdlib_windows(tokenizer, n: int, tokens: int, seed: int) -> list[list[int]]:
    """`n` random windows of `tokens` tokens from the Python standard library's source."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    rng = random.Random(seed)
    out = []
    while len(out) < n and files:
        text = rng.choice(files).read_text(errors="ignore")
        start = rng.randrange(max(1, len(text) - 8 * tokens))
        ids = tokenizer(text[start:start + 8 * tokens], add_special_tokens=False).input_ids
        if len(ids) > tokens:
            start = rng.randrange(len(ids) - tokens)
            out.append(ids[start:start + tokens])
    return out


def _strip(row: torch.Tensor, mask: torch.Tensor, eos_id: int, prompt_len: int) -> list[int]:
    """Drop left padding and everything after the first EOS of the continuation."""
    ids = row[mask.bool()].tolist() if mask is not None else row.tolist()
    head, tail = ids[:prompt_len], ids[prompt_len:]
    if eos_id in tail:
        tail = tail[:tail.index(eos_id) + 1]
    return head + tail


@torch.no_grad()
def generate_corpus(target, tokenizer, n_sequences: int, new_tokens: int, batch_size: int,
                    seed: int = 0, sampled_fraction: float = 0.25, max_prefix: int = 24,
                    time_budget_s: float = float("inf")) -> list[dict]:
    """Token sequences written by the target: prompt (+ a few sampled tokens) + continuation.

    Each batch is one kind: training prompts (raw, or through the chat template), or standard
    library windows; a random number (0..max_prefix) of tokens is first sampled at temperature 1
    for variety, then the continuation is greedy, or (for `sampled_fraction` of batches) sampled.
    """
    rng = random.Random(seed)
    prompts = build_prompts("train")
    device = target.device
    tokenizer.padding_side = "left"
    eos = tokenizer.eos_token_id
    corpus, start = [], time.time()
    bar = progress(range(math.ceil(n_sequences / batch_size)), desc="target writes the corpus")
    for _ in bar:
        if time.time() - start > time_budget_s:
            break
        if rng.random() < 0.2:
            windows = stdlib_windows(tokenizer, batch_size, rng.randint(16, 64), rng.randrange(1 << 30))
            texts = [tokenizer.decode(w) for w in windows]
            kind = "code"
        else:
            rows = [dict(rng.choice(prompts)) for _ in range(batch_size)]
            for r in rows:
                r["chat"] = r["chat"] or rng.random() < 0.2
            texts = [format_prompt(tokenizer, r) for r in rows]
            kind = "prompt"
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        ids, mask = enc.input_ids, enc.attention_mask
        prefix = rng.randint(0, max_prefix)
        keep = torch.ones(len(texts), dtype=torch.bool)
        if prefix:
            ids = target.generate(ids, attention_mask=mask, max_new_tokens=prefix, do_sample=True,
                                  temperature=1.0, top_p=0.95, top_k=None, pad_token_id=eos)
            keep = (ids[:, mask.shape[1]:] != eos).all(1).cpu()  # drop rows that ended early
            mask = torch.cat([mask, torch.ones_like(ids[:, mask.shape[1]:])], 1)
        sampled = rng.random() < sampled_fraction
        out = target.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=sampled,
                              temperature=1.0 if sampled else None, top_p=None, top_k=None,
                              pad_token_id=eos)
        full_mask = torch.cat([mask, torch.ones_like(out[:, mask.shape[1]:])], 1)
        for row, m in zip(out.cpu()[keep], full_mask.cpu()[keep]):
            prompt_len = int(m[:ids.shape[1]].sum())
            seq = _strip(row, m, eos, prompt_len)
            if len(seq) > prompt_len + 1:
                corpus.append({"ids": seq, "prompt_len": prompt_len, "kind": kind,
                               "mode": "sampled" if sampled else "greedy"})
    return corpus


def choose_vocab(corpus: list[dict], vocab_size: int, full_vocab_size: int) -> torch.Tensor:
    """The `vocab_size` most frequent token ids of the corpus (continuations weigh double)."""
    if hasattr(corpus, "continuation_tokens"):  # a `write_corpus.TokenCorpus`: counted without a Python loop
        every = corpus.tokens[torch.arange(corpus.tokens.shape[1])[None] < corpus.lengths[:, None]]
        counts = (torch.bincount(every.long(), minlength=full_vocab_size)
                  + torch.bincount(corpus.continuation_tokens().long(), minlength=full_vocab_size)).float()
        return torch.sort(counts.topk(min(vocab_size, full_vocab_size)).indices).values
    counts = torch.zeros(full_vocab_size)
    for seq in corpus:
        ids = torch.tensor(seq["ids"])
        counts.index_add_(0, ids, torch.ones(len(ids)))
        counts.index_add_(0, ids[seq["prompt_len"]:], torch.ones(len(ids) - seq["prompt_len"]))
    vocab_size = min(vocab_size, full_vocab_size)
    return torch.sort(counts.topk(vocab_size).indices).values


# ----------------------------------------------------------------------------- model
def make_draft(name: str, target, vocab_ids: torch.Tensor) -> ReducedVocabLlamaForCausalLM:
    """A fresh draft of shape DRAFT_SHAPES[name], its embedding initialised from the target's:
    the rows of the draft vocabulary projected on their top principal components."""
    if name not in DRAFT_SHAPES:
        raise ValueError(f"unknown draft shape {name!r}; allowed: {', '.join(DRAFT_SHAPES)}")
    tc = target.config
    config = LlamaConfig(**DRAFT_SHAPES[name], vocab_size=len(vocab_ids) + 1, head_dim=64,
                         full_vocab_size=tc.vocab_size, tie_word_embeddings=True,
                         max_position_embeddings=tc.max_position_embeddings, rms_norm_eps=tc.rms_norm_eps,
                         rope_parameters=getattr(tc, "rope_parameters", None),
                         bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id,
                         pad_token_id=tc.pad_token_id)
    draft = ReducedVocabLlamaForCausalLM(config)
    draft.set_vocab(vocab_ids)
    with torch.no_grad():
        emb = target.get_input_embeddings().weight.float().cpu()[vocab_ids]
        centered = emb - emb.mean(0)
        _, _, v = torch.linalg.svd(centered, full_matrices=False)
        proj = centered @ v[:config.hidden_size].T
        proj = proj / proj.std() * config.initializer_range * 2
        draft.get_input_embeddings().weight[:-1] = 0  # fewer tokens than dimensions: the rest stay 0
        draft.get_input_embeddings().weight[:-1, :proj.shape[1]] = proj
        draft.get_input_embeddings().weight[-1] = 0
    return draft


def distill_loss(draft, target, ids, mask, objective: str = "kl", weight: float = 1.0):
    """The `objective` (`objectives.per_position`: KL(p_target || q_draft), the acceptance objective, or both) per
    token, in the draft's vocabulary: the target's mass outside it goes to the draft's extra slot. Returns (mean
    objective, mean top-1 agreement, mean KL, mean acceptance sum min(p, q))."""
    with torch.no_grad():
        p = torch.softmax(target(input_ids=ids, attention_mask=mask).logits.float(), -1)
        p_in = p[..., draft.draft_to_full]
        p_red = torch.cat([p_in, (1 - p_in.sum(-1, keepdim=True)).clamp_min(0)], -1)
        top1 = p.argmax(-1)
        del p
    logq = torch.log_softmax(draft.draft_logits(input_ids=ids, attention_mask=mask).logits.float(), -1)
    loss = objectives.per_position(p_red, logq, objective, weight)
    m = mask.float()
    with torch.no_grad():
        kl = objectives.kl(p_red, logq) if objective != "kl" else loss
        alpha = objectives.acceptance(p_red, logq)
        agree = (draft.draft_to_full[logq[..., :-1].argmax(-1)] == top1).float()
    mean = lambda x: (x * m).sum() / m.sum()  # noqa: E731
    return mean(loss), mean(agree), mean(kl), mean(alpha)


@torch.no_grad()
def heldout_batch(target, tokenizer, rows: list[dict], continuations: list[list[int]]):
    """(ids, mask of scored positions, target argmax) for a quick held-out agreement check."""
    seqs, starts = [], []
    for row, cont in zip(rows, continuations):
        prompt = tokenizer(format_prompt(tokenizer, row), add_special_tokens=False).input_ids
        seqs.append(prompt + cont)
        starts.append(len(prompt))
    length = max(map(len, seqs))
    ids = torch.zeros(len(seqs), length, dtype=torch.long)
    scored = torch.zeros(len(seqs), length, dtype=torch.bool)
    for i, (s, n) in enumerate(zip(seqs, starts)):
        ids[i, :len(s)] = torch.tensor(s)
        scored[i, n - 1:len(s) - 1] = True  # positions whose next token is a continuation token
    ids, scored = ids.to(target.device), scored.to(target.device)
    lengths = torch.tensor(list(map(len, seqs)), device=ids.device)
    mask = (torch.arange(length, device=ids.device)[None] < lengths[:, None]).long()
    top1 = target(input_ids=ids, attention_mask=mask).logits.argmax(-1)
    return ids, mask, scored, top1


@torch.no_grad()
def heldout_agreement(draft, batch) -> float:
    ids, mask, scored, top1 = batch
    was_training = draft.training
    draft.eval()
    guess = draft.draft_to_full[draft.draft_logits(input_ids=ids, attention_mask=mask).logits[..., :-1].argmax(-1)]
    draft.train(was_training)
    return (guess == top1)[scored].float().mean().item()


def train(draft, target, corpus, steps: int, batch_size: int, lr: float, max_len: int = 256,
          seed: int = 0, time_budget_s: float = float("inf"), log_every: int = 25,
          heldout=None, heldout_every: int = 250, objective: str = "kl", weight: float = 1.0,
          checkpoint: Path | None = None, checkpoint_every: int = 0, until: int | None = None) -> list[dict]:
    """AdamW with linear warm-up over the first 2% of `steps` and cosine decay to 10% of `lr` (`lr_schedule`)
    over `steps` or `time_budget_s`, whichever ends first (with a budget, the schedule's step is the larger of
    the step and the elapsed fraction of the budget times `steps`); bf16 autocast on CUDA. `objective` and `weight`:
    what is minimised (`objectives`: "kl", "lk" or "kl+lk"; the log always carries the KL and the acceptance
    sum min(p, q) beside the objective's value). Under torchrun (`distributed`), as in `train_eagle.train`: every copy
    trains on its slice of one global sample of `batch_size` x world rows and the gradients are averaged, so the copies
    keep the same weights. `checkpoint`, `checkpoint_every` and `until`: training in sittings, as in
    `train_eagle.train` (the draft, the optimizer, the sampler, the step and the time spent go on from the saved state;
    `until` ends this sitting after that many steps in all). Returns the log;
    with `heldout` (from `heldout_batch`), entries every `heldout_every` steps also carry held-out agreement."""
    device = target.device
    draft.to(device).train()
    opt = torch.optim.AdamW(draft.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    rate = lr_schedule(lr, max(1, steps // 50), steps, 0.1 * lr)
    rng = random.Random(seed)
    log, spent, first = [], 0.0, 0
    state = distributed.load_checkpoint(checkpoint, device)
    if state is not None:
        draft.load_state_dict(state["draft"])
        opt.load_state_dict(state["opt"])
        rng.setstate(state["rng"])
        log, spent, first = state["log"], state["seconds"], state["step"]
    start = time.time() - spent
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    world = distributed.world_size()
    for step in progress(range(first, steps), desc="distilling",
                         **({} if distributed.is_main() else {"disable": True})):
        done = distributed.agree_max(max(step / steps, (time.time() - start) / time_budget_s), device)
        for group in opt.param_groups:
            group["lr"] = rate(min(done, 1) * steps)
        picks = rng.sample(range(len(corpus)), min(batch_size * world, len(corpus)))
        ids, mask = batch(corpus, distributed.shard(picks), max_len, device)
        with autocast:
            loss, agree, kl, alpha = distill_loss(draft, target, ids, mask, objective, weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        distributed.average_gradients(list(draft.parameters()))
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        last = done >= 1 or step == steps - 1 or step + 1 == until
        if step % log_every == 0 or last:
            entry = {"step": step, "loss": loss.item(), "kl": kl.item(), "acceptance": alpha.item(),
                     "agreement": agree.item(),
                     "lr": opt.param_groups[0]["lr"], "seconds": time.time() - start}
            if heldout is not None and (step % heldout_every == 0 or last):
                with autocast:
                    entry["heldout_agreement"] = heldout_agreement(draft, heldout)
            log.append(entry)
        if checkpoint is not None and checkpoint_every and ((step + 1) % checkpoint_every == 0 or last):
            distributed.save_checkpoint(checkpoint, {
                "draft": draft.state_dict(), "opt": opt.state_dict(), "rng": rng.getstate(), "log": log,
                "seconds": time.time() - start, "step": step + 1})
        if last:
            break
    draft.eval()
    return log


# ----------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(draft, target, tokenizer, rows: list[dict], new_tokens: int = 64, gamma: int = 4,
             continuations: list[list[int]] | None = None) -> dict:
    """Held-out agreement metrics on the target's own greedy continuations of `rows`:
    per-token top-1 agreement with the target's argmax (teacher-forced), tau = tokens per target
    pass at `gamma` (greedy, bonus/correction included; `tau_interval`: its 95% bootstrap interval over the
    prompts), and alpha = E[1 - TV(p, q)] at temperature 1 (Leviathan et al. 2023, Definition 3.1)."""
    device = target.device
    if continuations is None:
        continuations = greedy_continuations(target, tokenizer, rows, new_tokens)
    matches_all, alphas, rounds = [], [], []
    for row, cont in zip(progress(rows, desc="evaluating"), continuations):
        prompt = tokenizer(format_prompt(tokenizer, row), add_special_tokens=False).input_ids
        ids = torch.tensor([prompt + cont], device=device)
        n = len(prompt)
        p_logits = target(ids).logits[0, n - 1:-1].float()
        q_logits = draft(ids.to(draft.device)).logits[0, n - 1:-1].float().to(device)
        matches = (q_logits.argmax(-1) == p_logits.argmax(-1)).tolist()
        matches_all += matches
        blocks = [r.new_tokens for r in theory.simulate_rounds(matches, gamma)]  # the engine's rounds
        rounds.append((sum(blocks), len(blocks)))
        p, q = torch.softmax(p_logits, -1), torch.softmax(q_logits, -1)
        alphas += torch.minimum(p, q).sum(-1).tolist()
    tau = report.ratio_interval(rounds)  # tokens over rounds, pooled over the prompts
    return {"agreement": sum(matches_all) / len(matches_all), "tau": tau.value,
            "tau_interval": [tau.low, tau.high], "tau_per_prompt": rounds, "alpha_tv": sum(alphas) / len(alphas),
            "gamma": gamma,
            "positions": len(matches_all), "prompts": len(rows), "new_tokens": new_tokens,
            "dtype": str(next(draft.parameters()).dtype).removeprefix("torch.")}


# ----------------------------------------------------------------------------- CLI
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", default="draft-s,draft-m",
                    help=f"comma-separated, from {[*DRAFT_SHAPES, NGRAM_NAME]}")
    ap.add_argument("--ngram-min-count", type=int, default=2, help="ngram: drop contexts seen fewer times")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="the target's dtype while it writes the corpus (auto: bfloat16 on cuda, else float32)")
    ap.add_argument("--sequences", type=int, default=24576, help="corpus size (target-written sequences)")
    ap.add_argument("--new-tokens", type=int, default=160, help="continuation length per sequence")
    ap.add_argument("--gen-batch", type=int, default=512)
    ap.add_argument("--vocab-size", type=int, default=8192, help="draft vocabulary (plus one 'other' slot)")
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-prompts", type=int, default=0, help="0 = all held-out eval prompts")
    ap.add_argument("--gen-budget-s", type=float, default=float("inf"))
    ap.add_argument("--train-budget-s", type=float, default=float("inf"), help="per draft")
    ap.add_argument("--corpus", type=Path, default=None, help="cache the corpus here (reused if present)")
    ap.add_argument("--corpus-only", action="store_true", help="write --corpus and stop (train later, reusing it)")
    ap.add_argument("--out", type=Path, default=MODELS_DIR)
    ap.add_argument("--init", type=Path, default=None,
                    help="go on training the saved draft in this folder (one name, its shape and vocabulary), "
                         "e.g. data/models/draft-m; with --steps 0 it is only measured")
    ap.add_argument("--objective", choices=objectives.OBJECTIVES, default="kl",
                    help="what the draft minimises : kl, lk (-log of the acceptance rate), kl+lk")
    ap.add_argument("--lk-weight", type=float, default=1.0, help="kl+lk: the weight of the acceptance term")
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="save the training state here every --checkpoint-every steps, and resume from it if it "
                         "exists (one draft; a machine held for a limited time trains in several sittings)")
    ap.add_argument("--checkpoint-every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    names = args.names.split(",")
    if args.checkpoint is not None and len(names) != 1:
        ap.error(f"--checkpoint: one draft at a time, got --names {args.names}")
    bad = [n for n in names if n not in (*DRAFT_SHAPES, NGRAM_NAME)]
    if bad:
        ap.error(f"--names: unknown draft {bad[0]!r}; allowed: {', '.join([*DRAFT_SHAPES, NGRAM_NAME])}")
    for arg in ("sequences", "new_tokens", "gen_batch", "vocab_size", "steps", "batch_size"):
        if getattr(args, arg) < (0 if arg == "steps" and args.init else 1):
            ap.error(f"--{arg.replace('_', '-')} must be >= 1 (0 with --init: measure a saved draft), "
                     f"got {getattr(args, arg)}")
    if args.corpus_only and not args.corpus:
        ap.error("--corpus-only needs --corpus PATH (where to write the corpus)")
    if args.init is not None and (len(names) != 1 or names[0] == NGRAM_NAME
                                  or not (args.init / "config.json").exists()):
        ap.error(f"--init: one draft name (not ngram) and a folder with a saved draft; got --names {args.names} "
                 f"and --init {args.init}")
    args.names = names
    return args


def ngram_agreement(table: NgramDraft, tokenizer, rows: list[dict], continuations: list[list[int]]) -> dict:
    """Teacher-forced on the target's greedy continuations: how often the table has an answer
    (`coverage`), how often its top-1 is the target's token where it has one (`hit_rate`) and
    overall (`agreement`, no answer counting as a miss), and where the answers came from."""
    answered = hits = positions = 0
    sources: dict[str, int] = {}
    for row, cont in zip(rows, continuations):
        ids = tokenizer(format_prompt(tokenizer, row), add_special_tokens=False).input_ids
        for token in cont:
            found = table.lookup(ids)
            positions += 1
            if found is not None:
                answered += 1
                hits += found[0][0] == token
                sources[table.last_source] = sources.get(table.last_source, 0) + 1
            ids = ids + [token]
    return {"coverage": answered / positions, "hit_rate": hits / max(answered, 1), "agreement": hits / positions,
            "positions": positions, "prompts": len(rows), "sources": sources}


def build_ngram(target, tokenizer, corpus: list[dict], args, command: str) -> None:
    """Count the n-gram table on the corpus, evaluate it on the held-out prompts, save it with its log."""
    started = time.time()
    table = NgramDraft.build([(s["ids"], s["prompt_len"]) for s in corpus], target.config.vocab_size,
                             min_count=args.ngram_min_count)
    eval_rows = build_prompts("eval")
    continuations = greedy_continuations(target, tokenizer, eval_rows, 64)
    metrics = {"with_context": ngram_agreement(table, tokenizer, eval_rows, continuations)}
    table.use_context = False
    metrics["table_only"] = ngram_agreement(table, tokenizer, eval_rows, continuations)
    table.use_context, table.use_table = True, False
    metrics["context_only"] = ngram_agreement(table, tokenizer, eval_rows, continuations)
    table.use_table = True
    print(NGRAM_NAME, table.size, json.dumps(metrics), flush=True)
    out = args.out / NGRAM_NAME
    table.save(out, log={"name": NGRAM_NAME, "command": command, "contexts": {str(n): c for n, c in table.size.items()},
                         "min_count": args.ngram_min_count, "corpus_sequences": len(corpus),
                         "corpus_tokens": sum(len(s["ids"]) for s in corpus),
                         "corpus_continuation_tokens": sum(len(s["ids"]) - s["prompt_len"] for s in corpus),
                         "target_dtype": str(target.dtype).replace("torch.", ""),
                         "eval": metrics, "seconds": time.time() - started})


def device_name(device: torch.device) -> str:
    """What a training record names: the GPU's model, else the device type."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


@contextmanager
def in_float32(*modules, saved=torch.bfloat16):
    """Measure in float32, as the course measures tau everywhere and as the lessons load the shipped weights: the
    trained `modules` (all but the first, the target) are rounded to their saved dtype first, then upcast; every
    module gets its own dtype back afterwards (its parameters: buffers such as rotary frequencies stay as they are,
    float32, never rounded)."""
    def cast(module, dtype):  # parameters only: float32 buffers (rotary frequencies) must not round through bf16
        for p in module.parameters():
            p.data = p.data.to(dtype)
    dtypes = [next(m.parameters()).dtype for m in modules]
    for i, m in enumerate(modules):
        if i:
            cast(m, saved)
        cast(m, torch.float32)
    try:
        yield
    finally:
        for m, d in zip(modules, dtypes):
            cast(m, d)


def frozen_target(args):
    """(target, tokenizer, dtype): `args.target` on `args.device`, bf16 on CUDA and fp32 on the CPU
    unless `args.dtype` says otherwise, with every parameter frozen (the drafts and heads train, it
    does not). Shared by this trainer and `train_medusa`."""
    device = torch.device(args.device) if args.device else get_device()  # the device load_model would pick
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.dtype != "auto":
        dtype = getattr(torch, args.dtype)
    target, tokenizer = load_model(args.target, device=device, dtype=dtype)
    for p in target.parameters():
        p.requires_grad_(False)
    return target, tokenizer, dtype


def load_or_write_corpus(target, tokenizer, args) -> tuple[list[dict], int]:
    """The target-written corpus: read from `args.corpus` if it exists, else generated (and saved
    there when given). Returns (sequences, total tokens)."""
    if args.corpus and args.corpus.exists():
        from .write_corpus import load_corpus
        corpus = load_corpus(args.corpus)  # written by write_corpus (fast, on a GPU) or by this trainer
    else:
        corpus = generate_corpus(target, tokenizer, args.sequences, args.new_tokens, args.gen_batch,
                                 seed=args.seed, time_budget_s=args.gen_budget_s)
        if args.corpus:
            torch.save(corpus, args.corpus)
    n_tokens = corpus.num_tokens if hasattr(corpus, "num_tokens") else sum(len(s["ids"]) for s in corpus)
    print(f"corpus: {len(corpus)} sequences, {n_tokens} tokens", flush=True)
    return corpus, n_tokens


def main(argv=None):
    args = parse_args(argv)
    command = command_line("specdec_lab.train_draft", argv)
    copy_device = distributed.setup()  # under torchrun: this copy's GPU
    if copy_device is not None:
        if args.corpus is None or not args.corpus.exists() or NGRAM_NAME in args.names:
            raise SystemExit("train_draft under torchrun trains drafts from a corpus written before: write it with "
                             "--corpus PATH --corpus-only (or tools.write_corpus) first; ngram is built on one process")
        args.device = str(copy_device)
        command = command_line("specdec_lab.train_draft", argv, distributed.world_size())
    seed_everything(args.seed)
    target, tokenizer, dtype = frozen_target(args)
    corpus, n_tokens = load_or_write_corpus(target, tokenizer, args)
    if args.corpus_only:
        return 0
    if NGRAM_NAME in args.names:
        build_ngram(target, tokenizer, corpus, args, command)
        args.names = [n for n in args.names if n != NGRAM_NAME]
        if not args.names:
            return 0
    vocab = choose_vocab(corpus, args.vocab_size, target.config.vocab_size)
    cont = (corpus.continuation_tokens() if hasattr(corpus, "continuation_tokens")
            else torch.cat([torch.tensor(s["ids"][s["prompt_len"]:]) for s in corpus]))
    coverage = torch.isin(cont, vocab).float().mean().item()
    print(f"draft vocabulary: {len(vocab)} tokens cover {coverage:.2%} of continuation tokens", flush=True)
    eval_rows = build_prompts("eval")
    if args.eval_prompts:
        eval_rows = random.Random(args.seed).sample(eval_rows, min(args.eval_prompts, len(eval_rows)))
    with in_float32(target):  # held-out continuations in float32
        continuations = greedy_continuations(target, tokenizer, eval_rows, 64)
    pick = random.Random(args.seed + 1).sample(range(len(eval_rows)), min(64, len(eval_rows)))
    heldout = heldout_batch(target, tokenizer, [eval_rows[i] for i in pick], [continuations[i] for i in pick])
    for name in args.names:
        seed_everything(args.seed)
        if args.init:  # go on from a saved draft: its shape and vocabulary
            draft = ReducedVocabLlamaForCausalLM.from_pretrained(unpacked(args.init), dtype=torch.float32)
            shape = {k: getattr(draft.config, k) for k in DRAFT_SHAPES[name]}
            if shape != DRAFT_SHAPES[name]:
                raise SystemExit(f"--init {args.init}: that draft's shape {shape} is not {name}'s")
            before = json.loads((args.init / "training_log.json").read_text()) if (
                args.init / "training_log.json").exists() else {}
            before = {k: before.get(k) for k in ("command", "corpus_tokens", "eval")}
            vocab = draft.draft_to_full.cpu()
            coverage = torch.isin(cont, vocab).float().mean().item()
        else:
            draft, before = make_draft(name, target, vocab), None
        log = train(draft, target, corpus, args.steps, args.batch_size, args.lr, seed=args.seed,
                    time_budget_s=args.train_budget_s, heldout=heldout, objective=args.objective,
                    weight=args.lk_weight, checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every)
        if not distributed.is_main():
            continue  # the first copy measures and saves
        with in_float32(target, draft):  # saved in bfloat16, measured as the lessons load it: in float32
            metrics = evaluate(draft, target, tokenizer, eval_rows, continuations=continuations)
        draft = draft.to(dtype=torch.bfloat16)
        print(name, json.dumps(metrics), flush=True)
        out = args.out / name
        draft.save_pretrained(out)
        record = {"name": name, "command": command, "objective": args.objective, "gpus": distributed.world_size(),
                  "batch_size_per_gpu": args.batch_size,
                  "shape": DRAFT_SHAPES[name], "vocab_size": len(vocab), "vocab_coverage": coverage,
                  "corpus_sequences": len(corpus), "corpus_tokens": n_tokens,
                  "parameters": sum(p.numel() for p in draft.parameters()),
                  "device": device_name(target.device), "dtype": str(dtype).removeprefix("torch."),
                  "eval": metrics, "log": log, **({"continued_from": before} if before is not None else {})}
        (out / "training_log.json").write_text(json.dumps(record, indent=1))
    distributed.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
