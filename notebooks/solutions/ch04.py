"""Solutions to the exercises of notebook 04 (entropy self-verify); `tests/test_solutions.py` checks them.

Each exercise has code and, in `ANSWERS`, its answer in words: what to conclude, and for a measured answer what
to look at in your own run (the numbers belong to your machine, so they are computed, not typed here).
"""
import torch

from specdec_utils.core.policies import EntropyStop, LearnedStop, min_cost_threshold


ANSWERS = {
    1: "Proposing the unsure token pays when it is still accepted often enough and one more verified position is "
       "cheap. Its draft step is paid either way (the draft already computed the distribution whose entropy said "
       "stop), so the choice weighs only one more position in the target's pass against the chance of one more "
       "token: propose when P(accepted | this entropy) x (time of a target step) > T(k + 1) - T(k). "
       "Where one more verified position is cheap (on the course CPU in bfloat16 at the 2-3-token passes "
       "`entropy-stop` mostly uses, section 4's box; on a GPU) proposing pays, most of all in sampled decoding where even high-entropy tokens are often accepted; where "
       "a wider pass costs more (float32 on the course CPU, where 2 and 3 tokens cost more than 5), dropping it "
       "pays. Compare `EntropyStopBefore` with `EntropyStop` through `report.speedup(records, "
       "'entropy-stop-before', 'entropy-stop')` and let `report.verdict` say which is faster on your machine. Compare "
       "them at the same fixed θ: an adaptive θ fed only by the tokens it lets through can only fall (every rejected "
       "entropy is at most θ) and locks at drafting nothing.",
    2: "FPR + w FNR weighs a missed good token (a false negative: stopping before a token the target would have "
       "accepted) w times a wasted bad one (a false positive). The right weight w is the ratio of those two costs on the "
       "machine: a missed token costs about a target step (the round ends early and the token comes one pass "
       "later), a wasted one costs a draft step plus one more position in the verification pass. "
       "`matching_cost(t_draft, t_verify)` computes that ratio from the costs section 4 measures: where "
       "verification is nearly free (a GPU; on a CPU, read section 4's box) it is large and w = 10 matches better; "
       "where each verified position costs a sizeable fraction of a target step it is small, nearer 1. Compute it "
       "from `cost_ms[dtype]` for each dtype and pick the nearest of 1, 3, 10. A larger "
       "w gives a lower confidence threshold, so the rule drafts more.",
    3: "The peeking rule emits min(p, q) on the tokens where p >= q plus the undrafted mass times p. The draft's "
       "mass on tokens it overrates (q > p) is handed to a fresh draw from p instead of to the residual (p - q)+, so "
       "overrated tokens come out at m p(x) < p(x) and underrated ones too often; `peeking_emission` returns the "
       "total-variation distance to p, (1 - m) P_o (m, P_o: the draft's and the target's mass on the overrated "
       "tokens), zero only in degenerate cases such as p = q. The bias comes from "
       "deciding after reading x; deciding from p and q alone, before drawing, would be exact.",
    4: "It depends on the machine, and the run decides it. A cost-aware stop avoids the drafts whose expected "
       "gain is below their cost, so it helps most where costs are uneven: in float32 on the course CPU, where a 2- "
       "or 3-token pass costs more than a 5-token one, it can beat a fixed threshold; where verification grows "
       "little at the widths the rule uses, the cost term is close to a draft step and its decisions approach a fixed threshold on the survival "
       "probability, so expect a tie within the spread. Benchmark `CostAwareStop` next to the best fixed "
       "threshold of the lab notebook's sweep (`notebooks/lab/04_entropy_self_verify_lab.ipynb`) on both dtypes and read `report.verdict(report.speedup(records, 'cost-aware-stop', "
       "'<that threshold>'))`.",
}


def matching_cost(t_draft: float, t_verify: dict, widths=range(2, 6)) -> float:
    """The false-negative cost c that matches a machine (exercise 2): a target step (what a missed token
    costs) over a draft step plus the mean growth of the verification pass by one position (what a wasted
    draft costs), over the pass widths `widths` a round typically uses."""
    growth = sum(max(t_verify[k + 1] - t_verify[k], 0.0) for k in widths) / len(widths)
    return t_verify[1] / (t_draft + growth)


# Exercise 1 ------------------------------------------------------------------------------------
class EntropyStopBefore(EntropyStop):
    """HSDDW's entropy test at a fixed threshold θ, but the unsure token is dropped instead of proposed.
    Answer in words: ANSWERS[1]."""
    name = "entropy-stop-before"

    def __init__(self, theta: float, **kwargs):
        super().__init__(theta0=theta, **kwargs)
        self.theta = theta  # fixed: an adaptive θ fed only by the tokens it lets through would only fall

    def stop_after(self, step) -> bool:
        return False

    def stop_before(self, step) -> bool:
        self.entropies.append(step.entropy)
        return step.entropy > self.theta


# Exercise 2 ------------------------------------------------------------------------------------
def roc_thresholds(probs, accepted, costs=(1.0, 3.0, 10.0)) -> dict:
    """For each false-negative cost c, the confidence threshold minimising FPR + c FNR on recorded
    (draft probability of its token, accepted?) pairs; c = 3 is what transformers converges to. Which c
    matches a machine: `matching_cost` and ANSWERS[2]."""
    labels = [int(a) for a in accepted]
    return {c: min_cost_threshold(list(map(float, probs)), labels, false_negative_cost=c) for c in costs}


# Exercise 3 ------------------------------------------------------------------------------------
def peeking_emission(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The token emitted at one position by a rule that drafts x ~ q only where p(x) >= q(x) (always
    accepted there) and otherwise lets the target emit a bonus token from p; with its TV distance to p.
    Answer in words: ANSWERS[3]."""
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
    survival bookkeeping is `LearnedStop`'s; only its stop test changes. Whether it beats a fixed
    threshold: ANSWERS[4]."""
    name = "cost-aware-stop"
    reason = "cost"

    def __init__(self, head, t_draft: float, t_verify: dict, token_ms: float, gamma: int = 10):
        super().__init__(head=head, gamma=min(gamma, max(t_verify) - 1))
        self.t_draft, self.t_verify, self.token_ms = t_draft, t_verify, token_ms

    def stops(self, survival: float, step) -> bool:
        j = step.position + 1  # drafting this token makes the verification pass j + 1 tokens wide
        return survival * self.token_ms < self.t_draft + self.t_verify[j + 1] - self.t_verify[j]
