"""Train the learned stop's heads (notebook 04; the head itself, `core/stop_head.py`, is what runs at decode time).

The target writes its own text (`train_draft.generate_corpus`, half greedy, half sampled); at every position whose
next token is a continuation token, the draft's hidden state and distribution give the head's input, and the
target's and the draft's distributions give the exact acceptance probabilities of the draft's next token, greedy
and sampled at temperature 1: the soft labels of a binary cross entropy. A few minutes on a CPU.

    python -m specdec_lab.train_stop_head --drafts draft-s,draft-m   # the shipped heads, data/models/<draft>/
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec_utils.core.hidden import capture_hidden
from specdec_utils.core.stop_head import HEAD_FILE, LOG_FILE, MODES, StopHead, roc_auc
from specdec_utils.training import batch
from specdec_utils.utils import command_line, progress, seed_everything


@torch.no_grad()
def collect(target, draft, corpus: list[dict], batch_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and labels along target-written sequences (`train_draft.generate_corpus`): at every
    position whose next token is a continuation token, the head's input (`StopHead.features`), and
    the exact acceptance probabilities of the draft's next token [2]: greedy (argmax q == argmax p)
    and sampled at temperature 1 (sum min(p, q))."""
    features, labels = [], []
    device = next(target.parameters()).device
    for start in progress(range(0, len(corpus), batch_size), desc="stop-head data"):
        rows = corpus[start:start + batch_size]
        ids, mask = batch(corpus, range(start, start + len(rows)), None, device)
        p = target(input_ids=ids, attention_mask=mask).logits.float().softmax(-1)
        with capture_hidden(draft, "head") as hidden:
            draft_logits = draft(input_ids=ids, attention_mask=mask).logits.float()
        for i, row in enumerate(rows):
            positions = torch.arange(row["prompt_len"] - 1, len(row["ids"]) - 1, device=device)
            p_i, q_i = p[i, positions], draft_logits[i, positions].softmax(-1)
            greedy = (p_i.argmax(-1) == q_i.argmax(-1)).float()
            sampled = torch.minimum(p_i, q_i).sum(-1).clamp(0, 1)
            features.append(StopHead.features(hidden[0][i, positions], draft_logits[i, positions]).cpu())
            labels.append(torch.stack([greedy, sampled], -1).cpu())
    return torch.cat(features), torch.cat(labels)


def train_head(features: torch.Tensor, labels: torch.Tensor, steps: int = 2000, batch_size: int = 256,
               lr: float = 1e-3, width: int = 0, weight_decay: float = 1e-2, seed: int = 0,
               val_fraction: float = 0.1) -> tuple[StopHead, dict]:
    """Fit a `StopHead` by binary cross entropy against the soft labels, keeping the weights with the
    lowest loss on a held-out tenth (early stopping: a few thousand examples overfit quickly). Return
    it and a log with the loss curve and, per mode, the held-out area under the ROC curve of its
    predictions and of the draft's own entropy (greedy labels are 0/1; sampled ones are thresholded
    at 0.5 for the AUC)."""
    generator = seed_everything(seed)
    order = torch.randperm(len(features), generator=generator)
    n_val = max(1, int(len(features) * val_fraction))
    val, train = order[:n_val], order[n_val:]
    head = StopHead(features.shape[1] - 3, width)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    log = {"examples": len(train), "held_out": n_val, "steps": steps, "width": width, "curve": []}
    best = (math.inf, None, -1)
    for step in range(steps):
        picked = train[torch.randint(len(train), (batch_size,), generator=generator)]
        loss = F.binary_cross_entropy_with_logits(head(features[picked]), labels[picked])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            with torch.no_grad():
                val_loss = F.binary_cross_entropy_with_logits(head(features[val]), labels[val]).item()
            log["curve"].append({"step": step, "train_loss": loss.item(), "val_loss": val_loss})
            if val_loss < best[0]:
                best = (val_loss, copy.deepcopy(head.state_dict()), step)
    head.load_state_dict(best[1])
    log["best_step"], log["best_val_loss"] = best[2], best[0]
    with torch.no_grad():
        predictions = torch.sigmoid(head(features[val]))
    entropy = features[val, -3]
    log["val_auc"] = {mode: roc_auc(predictions[:, m], labels[val, m] >= 0.5) for m, mode in enumerate(MODES)}
    log["val_auc_entropy"] = {mode: roc_auc(-entropy, labels[val, m] >= 0.5) for m, mode in enumerate(MODES)}
    log["val_mean_label"] = {mode: labels[val, m].mean().item() for m, mode in enumerate(MODES)}
    return head.eval(), log


def main(argv: list[str] | None = None) -> int:
    from specdec_utils.models import MODELS_DIR, UnknownModelError, load_model

    from .train_draft import generate_corpus
    parser = argparse.ArgumentParser(prog="python -m specdec_lab.train_stop_head",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafts", default="draft-s,draft-m", help="comma-separated (default: %(default)s)")
    parser.add_argument("--sequences", type=int, default=384, help="target-written sequences (default: %(default)s)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=MODELS_DIR,
                        help=f"writes OUT/<draft>/{HEAD_FILE} and its log (default: data/models)")
    args = parser.parse_args(argv)
    try:
        target, tokenizer = load_model(args.target, device=args.device, dtype=torch.float32)
        drafts = {name: load_model(name, device=args.device, dtype=torch.float32)[0]
                  for name in args.drafts.split(",")}
    except UnknownModelError as err:
        print(f"train_stop_head: error: {err}", file=sys.stderr)
        return 2
    start = time.time()
    seed_everything(args.seed)
    corpus = generate_corpus(target, tokenizer, args.sequences, args.new_tokens, batch_size=32, seed=args.seed + 1,
                             sampled_fraction=0.5)
    corpus_s = time.time() - start
    for name, draft in drafts.items():
        features, labels = collect(target, draft, corpus)
        head, log = train_head(features, labels, steps=args.steps, seed=args.seed)
        folder = args.out / name
        folder.mkdir(parents=True, exist_ok=True)
        head.save(folder)
        command = command_line("specdec_lab.train_stop_head", argv)
        log.update({"command": command, "target": args.target, "draft": name, "sequences": len(corpus),
                    "positions": len(features), "device": args.device, "corpus_seconds": round(corpus_s, 1),
                    "seconds": round(time.time() - start, 1)})
        (folder / LOG_FILE).write_text(json.dumps(log, indent=1))
        print(f"{name}: {len(features)} positions; held-out AUC greedy {log['val_auc']['greedy']:.3f} "
              f"(entropy alone {log['val_auc_entropy']['greedy']:.3f}), sampled {log['val_auc']['sampled']:.3f} "
              f"(entropy alone {log['val_auc_entropy']['sampled']:.3f}); wrote {folder / HEAD_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
