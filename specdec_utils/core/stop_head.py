"""A learned stop for drafting (notebook 04), in the manner of SpecDec++ (Huang et al. 2024).

A tiny head reads the draft's last hidden state (the input of its output head) at the position that
produced a drafted token's distribution, plus three numbers of that distribution (its entropy, its
largest probability and that probability's log), and predicts the probability that the target
accepts the token: in greedy decoding (does the draft's argmax equal the target's?) and in sampling at
temperature 1 (the expected min(1, p/q) of a drafted token, sum_x min(p(x), q(x))). It is trained on
text the target wrote itself, with those exact acceptance probabilities as soft labels (binary cross
entropy), in a few minutes on a CPU. `policies.LearnedStop` multiplies its predictions along a round
and stops when the predicted probability that the round has already failed exceeds a threshold.

This module is what runs at decode time (the head, its features, finding a draft's head); the training
pipeline is `specdec_lab/train_stop_head.py`:

    python -m specdec_lab.train_stop_head --drafts draft-s,draft-m   # the shipped heads
"""
from __future__ import annotations

from pathlib import Path

import torch
from sklearn.metrics import roc_auc_score
from torch import nn

HEAD_FILE = "stop_head.pt"
LOG_FILE = "stop_head_log.json"  # its training log, beside it
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
    def load(cls, path: Path) -> StopHead:
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
                             f"Train one: python -m specdec_lab.train_stop_head --drafts NAME --out FOLDER "
                             f"(writes FOLDER/NAME/{HEAD_FILE}), then pass params={{'head': path}}")
    path = Path(head)
    if not path.exists():
        raise ValueError(f"stop head {path} does not exist")
    device = next(draft.parameters()).device if draft is not None else "cpu"
    return StopHead.load(path).to(device)


def roc_auc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """Area under the ROC curve (scikit-learn's `roc_auc_score`): the probability that a random positive
    scores above a random negative, ties counting half; nan without both kinds."""
    positive = positive.bool().cpu()
    if positive.all() or not positive.any():
        return float("nan")
    return float(roc_auc_score(positive.numpy(), scores.detach().double().cpu().numpy()))
