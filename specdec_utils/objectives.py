"""What the draft trainer (`train_draft --objective`) minimises at each position, given the target's
distribution `p` and the draft's log-probabilities `logq` over the same vocabulary (the last dimension).

- `kl`: KL(p || q), the distillation the course's drafts were trained with (the same gradient as soft cross-entropy).
- `lk`: -log alpha, where alpha = sum_x min(p(x), q(x)) is the probability that speculative sampling at temperature 1
  accepts the draft's token (Leviathan et al. 2023: accept with min(1, p/q), so alpha = sum_x q min(1, p/q)); the
  draft is trained on the acceptance rate itself, as LK losses propose (arXiv 2602.23881). Its gradient reaches
  only the tokens where q < p (there min picks q), so it moves mass to where the target has more of it and
  ignores how the draft spreads what is left.
- `kl+lk`: KL + `weight` x (-log alpha), KL keeping the whole distribution in view, the acceptance term sharpening
  the overlap.

alpha is also what a greedy round cares about only indirectly (greedy verification accepts when the argmaxes agree);
the trainer logs both alpha and top-1 agreement beside the KL. The three trainers share these: `train_draft
--objective`, `train_eagle --objectives` (an ablation over them) and `train_block --objective`.
"""
from __future__ import annotations

import torch

OBJECTIVES = ("kl", "lk", "kl+lk")
FLOOR = 1e-6  # alpha is at least this inside the log (a draft that puts no mass where p has any)


def acceptance(p: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """sum_x min(p(x), q(x)) per position: speculative sampling's acceptance probability at temperature 1."""
    return torch.minimum(p, logq.exp()).sum(-1)


def kl(p: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per position (terms with p = 0 contribute nothing)."""
    return (p * (torch.log(p.clamp_min(1e-12)) - logq)).sum(-1)


def per_position(p: torch.Tensor, logq: torch.Tensor, objective: str = "kl", weight: float = 1.0) -> torch.Tensor:
    """The objective's value at each position (shape: p's without the last dimension)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; allowed: {', '.join(OBJECTIVES)}")
    if objective == "kl":
        return kl(p, logq)
    lk = -torch.log(acceptance(p, logq).clamp_min(FLOOR))
    return lk if objective == "lk" else kl(p, logq) + weight * lk
