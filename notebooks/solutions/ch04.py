"""Solutions to the exercises of notebook 04 (entropy self-verify); `tests/test_solutions.py` checks them."""
import torch

from specdec_utils.policies import EntropyStop, LearnedStop, min_cost_threshold


# Exercise 1 ------------------------------------------------------------------------------------
class EntropyStopBefore(EntropyStop):
    """HSDDW's adaptive entropy threshold, but the unsure token is dropped instead of proposed."""
    name = "entropy-stop-before"

    def stop_after(self, step) -> bool:
        return False

    def stop_before(self, step) -> bool:
        self.entropies.append(step.entropy)
        return step.entropy > self.tau


# Exercise 2 ------------------------------------------------------------------------------------
def roc_thresholds(probs, accepted, costs=(1.0, 3.0, 10.0)) -> dict:
    """For each false-negative cost c, the confidence threshold minimising FPR + c FNR on recorded
    (draft probability of its token, accepted?) pairs; c = 3 is what transformers converges to."""
    labels = [int(a) for a in accepted]
    return {c: min_cost_threshold(list(map(float, probs)), labels, false_negative_cost=c) for c in costs}


# Exercise 3 ------------------------------------------------------------------------------------
def peeking_emission(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The token emitted at one position by a rule that drafts x ~ q only where p(x) >= q(x) (always
    accepted there) and otherwise lets the target emit a bonus token from p; with its TV distance to p."""
    p, q = p.double(), q.double()
    p, q = p / p.sum(), q / q.sum()  # float32 inputs sum to 1 only within ~1e-8
    drafted = torch.where(p >= q, q, torch.zeros_like(q))
    emitted = drafted + (1 - drafted.sum()) * p
    return emitted, 0.5 * float((emitted - p).abs().sum())


# Exercise 4 ------------------------------------------------------------------------------------
class CostAwareStop(LearnedStop):
    """Draft token j only if its expected value, survival * a_j tokens at `token_ms` each, exceeds
    what it costs: one draft step plus the growth of the verification pass from j to j + 1 tokens.
    `head` predicts a_j (a `stop_head.StopHead`); `t_verify[k]` is a pass over k tokens in ms. The
    survival bookkeeping is `LearnedStop`'s; only its stop test changes."""
    name = "cost-aware-stop"
    reason = "cost"

    def __init__(self, head, t_draft: float, t_verify: dict, token_ms: float, max_gamma: int = 10):
        super().__init__(head=head, max_gamma=min(max_gamma, max(t_verify) - 1))
        self.t_draft, self.t_verify, self.token_ms = t_draft, t_verify, token_ms

    def stops(self, survival: float, step) -> bool:
        j = step.position + 1  # drafting this token makes the verification pass j + 1 tokens wide
        return survival * self.token_ms < self.t_draft + self.t_verify[j + 1] - self.t_verify[j]
