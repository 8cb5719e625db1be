"""A learned stop for drafting (notebook 04), in the manner of SpecDec++ (Huang et al. 2024).

A tiny head reads the draft's last hidden state (the input of its output head) at the position that
produced a drafted token's distribution, plus three numbers of that distribution (its entropy, its
largest probability and that probability's log), and predicts the probability that the target
accepts the token: in greedy decoding (does the draft's argmax equal the target's?) and in sampling at
temperature 1 (the expected min(1, p/q) of a drafted token, sum_x min(p(x), q(x))). It is trained on
text the target wrote itself, with those exact acceptance probabilities as soft labels (binary cross
entropy), in a few minutes on a CPU. `policies.LearnedStop` multiplies its predictions along a round
and stops when the predicted probability that the round has already failed exceeds a threshold.

    python -m specdec_utils.core.stop_head --draft draft-m --out data/models/draft-m   # the shipped heads
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
from torch import nn

from ..utils import progress, seed_everything

HEAD_FILE = "stop_head.pt"
LOG_FILE = "stop_head_log.json"
MODES = ("greedy", "sampled")  # the head's two outputs


class StopHead(nn.Module):
    """features [.., H + 3] -> acceptance logits [.., 2] (greedy, sampled at temperature 1); a linear
    layer by default (`width=0`), else Linear(H + 3, width), SiLU, Linear(width, 2)."""

    def __init__(self, hidden_size: int, width: int = 0):
        super().__init__()
        self.hidden_size, self.width = hidden_size, width
        inputs = hidden_size + 3
        self.net = (nn.Sequential(nn.Linear(inputs, width), nn.SiLU(), nn.Linear(width, 2)) if width
                    else nn.Linear(inputs, 2))

    @staticmethod
    def features(hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The head's input: the hidden state [.., H] and, of softmax(logits) at temperature 1, the
        entropy, the largest probability and its log [.., 3]."""
        probs = logits.float().softmax(-1)
        top = probs.max(-1, keepdim=True).values
        entropy = torch.special.entr(probs).sum(-1, keepdim=True)
        return torch.cat([hidden.float(), entropy, top, top.clamp_min(1e-12).log()], -1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)

    @torch.no_grad()
    def acceptance(self, hidden: torch.Tensor, logits: torch.Tensor, greedy: bool) -> float:
        """Predicted probability that the token drawn from these logits (whose position's hidden state
        is `hidden`) is accepted, in greedy decoding or in sampling."""
        features = self.features(hidden, logits).to(next(self.parameters()).device)
        return float(torch.sigmoid(self(features)[..., 0 if greedy else 1]))

    def save(self, folder: Path) -> Path:
        path = Path(folder) / HEAD_FILE
        torch.save({"hidden_size": self.hidden_size, "width": self.width, "state_dict": self.state_dict()}, path)
        return path

    @classmethod
    def load(cls, path: Path) -> "StopHead":
        saved = torch.load(path, map_location="cpu", weights_only=True)
        head = cls(saved["hidden_size"], saved["width"])
        head.load_state_dict(saved["state_dict"])
        return head.eval()


def resolve_head(head, draft) -> StopHead:
    """A `StopHead`, a path to a saved one, or None: the head saved in the draft's own folder."""
    if isinstance(head, StopHead):
        return head
    if head is None:
        folder = Path(getattr(draft, "name_or_path", "") or "")
        head = folder / HEAD_FILE
        if not head.exists():
            raise ValueError(f"method 'learned-stop' needs a stop head for this draft; none at {head}. "
                             f"Train one: python -m specdec_utils.core.stop_head --draft NAME --out FOLDER, "
                             f"then pass params={{'head': path}}")
    path = Path(head)
    if not path.exists():
        raise ValueError(f"stop head {path} does not exist")
    device = next(draft.parameters()).device if draft is not None else "cpu"
    return StopHead.load(path).to(device)


@torch.no_grad()
def collect(target, draft, corpus: list[dict], batch_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and labels along target-written sequences (`train_draft.generate_corpus`): at every
    position whose next token is a continuation token, the head's input (`StopHead.features`), and
    the exact acceptance probabilities of the draft's next token [2]: greedy (argmax q == argmax p)
    and sampled at temperature 1 (sum min(p, q))."""
    from .hidden import capture_hidden
    features, labels = [], []
    device = next(target.parameters()).device
    for start in progress(range(0, len(corpus), batch_size), desc="stop-head data"):
        rows = corpus[start:start + batch_size]
        length = max(len(r["ids"]) for r in rows)
        ids = torch.zeros(len(rows), length, dtype=torch.long)
        mask = torch.zeros(len(rows), length, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, :len(row["ids"])] = torch.tensor(row["ids"])
            mask[i, :len(row["ids"])] = 1
        ids, mask = ids.to(device), mask.to(device)
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
        batch = train[torch.randint(len(train), (batch_size,), generator=generator)]
        loss = F.binary_cross_entropy_with_logits(head(features[batch]), labels[batch])
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


def roc_auc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """Area under the ROC curve: the probability that a random positive scores above a random
    negative (ties count half)."""
    pos, neg = scores[positive], scores[~positive]
    if not len(pos) or not len(neg):
        return float("nan")
    return ((pos[:, None] > neg[None]).float().mean() + 0.5 * (pos[:, None] == neg[None]).float().mean()).item()


def main(argv: list[str] | None = None) -> int:
    from ..models import MODELS_DIR, UnknownModelError, load_model
    from ..tools.train_draft import generate_corpus
    parser = argparse.ArgumentParser(prog="python -m specdec_utils.core.stop_head", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafts", default="draft-s,draft-m", help="comma-separated (default: %(default)s)")
    parser.add_argument("--sequences", type=int, default=384, help="target-written sequences (default: %(default)s)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=MODELS_DIR,
                        help="writes OUT/<draft>/stop_head.pt and its log (default: data/models)")
    args = parser.parse_args(argv)
    try:
        target, tokenizer = load_model(args.target, device=args.device, dtype=torch.float32)
        drafts = {name: load_model(name, device=args.device, dtype=torch.float32)[0]
                  for name in args.drafts.split(",")}
    except UnknownModelError as err:
        print(f"stop_head: error: {err}", file=sys.stderr)
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
        log.update({"command": "python -m specdec_utils.core.stop_head " + " ".join(sys.argv[1:] if argv is None else argv),
                    "target": args.target, "draft": name, "sequences": len(corpus), "positions": len(features),
                    "device": args.device, "corpus_seconds": round(corpus_s, 1),
                    "seconds": round(time.time() - start, 1)})
        (folder / LOG_FILE).write_text(json.dumps(log, indent=1))
        print(f"{name}: {len(features)} positions; held-out AUC greedy {log['val_auc']['greedy']:.3f} "
              f"(entropy alone {log['val_auc_entropy']['greedy']:.3f}), sampled {log['val_auc']['sampled']:.3f} "
              f"(entropy alone {log['val_auc_entropy']['sampled']:.3f}); wrote {folder / HEAD_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
