"""Solutions to the exercises of notebook 03 (adaptive draft length); `tests/test_solutions.py` checks them."""
import numpy as np
import torch

from specdec_utils.policies import DraftingPolicy
from specdec_utils.theory import acceptance_by_position, expected_tokens_per_round


# Exercise 1 ------------------------------------------------------------------------------------
class MultiplicativeGamma(DraftingPolicy):
    """Double gamma after a fully accepted round, halve it (never below 1) after a rejection."""
    name = "multiplicative"

    def __init__(self, gamma: int = 4, max_gamma: int = 16):
        super().__init__(gamma)
        self.max_gamma = max_gamma

    def observe(self, stats) -> None:
        if not stats.drafted:
            return
        if stats.accepted == stats.drafted:
            self.gamma = min(2 * self.gamma, self.max_gamma)
        else:
            self.gamma = max(1, self.gamma // 2)


# Exercise 2 ------------------------------------------------------------------------------------
def predicted_speedup(acceptance, gamma: int, t_draft: float, t_verify: dict) -> float:
    """Section 2's model: E[tokens per round] * T_verify(1) / (gamma T_draft + T_verify(gamma + 1))."""
    return expected_tokens_per_round(acceptance, gamma) * t_verify[1] / (gamma * t_draft + t_verify[gamma + 1])


def best_fixed_gamma(acceptance, t_draft: float, t_verify: dict) -> int:
    """The gamma in 1..len(acceptance) that maximises the predicted speedup. `acceptance[i]` is a_(i+1);
    `t_verify[k]` the time of a target pass over k tokens (k = 1 .. len(acceptance) + 1)."""
    return max(range(1, len(acceptance) + 1), key=lambda g: predicted_speedup(acceptance, g, t_draft, t_verify))


# Exercise 3 ------------------------------------------------------------------------------------
def oracle_emissions(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Distribution of the token emitted at one drafted position x ~ q when an oracle knows whether the
    target will accept x: (a) it stops before a rejected x, so the target emits a bonus token from p;
    (b) it drafts x anyway and rejection sampling emits from the residual norm(max(0, p - q)).
    P(propose x and accept it) = min(p(x), q(x)) in both; they differ after a rejection."""
    p, q = p.double(), q.double()
    kept = torch.minimum(p, q)
    rejected = 1 - kept.sum()
    residual = (p - q).clamp(min=0)
    stop_before = kept + rejected * p
    draft_it = kept + (rejected * residual / residual.sum() if residual.sum() > 0 else 0)
    return stop_before, draft_it


# Exercise 4 ------------------------------------------------------------------------------------
def best_gamma_per_category(rounds_by_category: dict, t_draft: float, t_verify: dict, max_gamma: int = 8) -> dict:
    """For each category, the best fixed gamma from its own acceptance by position (positions no round
    reached count as never accepted)."""
    best = {}
    for category, rounds in rounds_by_category.items():
        acceptance = np.nan_to_num(acceptance_by_position(rounds, max_gamma), nan=0.0)
        best[category] = best_fixed_gamma(acceptance, t_draft, t_verify)
    return best
