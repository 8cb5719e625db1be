"""Solutions to the exercises of notebook 03 (adaptive draft length); `tests/test_solutions.py` checks them.

Each exercise has its code and its answer in words (the `ANSWER_*` strings, also in the docstrings). Where an
answer is a number, the code computes it: run it on your own measurements and read the words for what to look at.
"""
import numpy as np
import torch

from specdec_utils.core.engine import RoundStats
from specdec_utils.core.policies import DraftingPolicy, HeuristicGamma
from specdec_utils.theory import acceptance_by_position, expected_tokens_per_round


# Exercise 1 ------------------------------------------------------------------------------------
class MultiplicativeGamma(DraftingPolicy):
    """Double the round length after a fully accepted round, halve it (never below 1) after a rejection;
    it starts at `start` and never exceeds `gamma`, the most tokens a round may draft."""
    name = "multiplicative"

    def __init__(self, start: int = 4, gamma: int = 16):
        super().__init__(min(start, gamma))
        self.max_gamma = gamma

    def observe(self, stats) -> None:
        if not stats.drafted:
            return
        if stats.accepted == stats.drafted:
            self.gamma = min(2 * self.gamma, self.max_gamma)
        else:
            self.gamma = max(1, self.gamma // 2)


def replay(policy: DraftingPolicy, draft_right: list[bool]) -> dict:
    """Run a policy against a text described by where the draft is right: `draft_right[j]` says whether the
    draft's token at output position j is the target's. A round at position j drafting gamma tokens gets the
    leading run of right tokens (at most gamma) accepted, then the target adds one token of its own. Returns the
    rounds (target passes) and the wasted drafts, with no model and no timing: the shape of a policy's reaction."""
    position = rounds = wasted = 0
    while position < len(draft_right):
        gamma = policy.round_gamma()
        accepted = 0
        while accepted < gamma and position + accepted < len(draft_right) and draft_right[position + accepted]:
            accepted += 1
        policy.observe(RoundStats(gamma, gamma, accepted, "gamma", gamma, accepted + 1, 0.0, 0.0, 0.0))
        rounds, wasted, position = rounds + 1, wasted + gamma - accepted, position + accepted + 1
    return {"rounds": rounds, "wasted": wasted}


def easy_then_hard(easy: int = 60, hard: int = 40) -> dict:
    """Both policies, from gamma 4, on a long easy stretch (the draft always right), then on that stretch
    followed by a hard one (the draft always wrong): rounds and waste of each."""
    texts = {"easy": [True] * easy, "easy then hard": [True] * easy + [False] * hard}
    return {name: {"multiplicative": replay(MultiplicativeGamma(4), text), "adaptive-hf": replay(HeuristicGamma(4), text)}
            for name, text in texts.items()}


ANSWER_1 = """\
Both policies give the target's greedy output (they only choose how many tokens to draft). On an easy stretch
of moderate length (tens of tokens) the multiplicative policy reacts better: gamma grows 4, 8, 16 instead of 4, 6,
8, 10, ..., so it reaches long rounds sooner and needs fewer target passes. On a very long easy stretch
adaptive-hf catches up and passes it, because Hugging Face's schedule has no upper bound while ours stops at 16.
On a hard stretch the multiplicative policy reacts much better: a rejection halves gamma, 16 -> 8 -> 4 -> 2 -> 1
in four rounds, while adaptive-hf's -1 per round takes as many rounds as gamma had grown, and every one of those
rounds drafts tokens that are all thrown away. `easy_then_hard(easy, hard)` counts it without a model: compare
'rounds' on the easy text (try easy = 60 and easy = 300) and 'wasted' on the easy-then-hard text. The price of
the multiplicative rule is overshooting: when an easy stretch ends inside a round of 16, most of it is wasted, and
a wide verification pass can cost more than one target step (the lab page's measured pass costs; a pass over 17
tokens was not measured there). Which one is faster on your machine is a measurement: run both through
`measure.run_benchmark` and compare their speedup intervals (`report.compare`); an overlap is a tie."""


# Exercise 2 ------------------------------------------------------------------------------------
def predicted_speedup(acceptance, gamma: int, t_draft: float, t_verify: dict) -> float:
    """The cost model of a round: E[tokens per round] * T(1) / (gamma t_draft + T(gamma + 1))."""
    return expected_tokens_per_round(acceptance, gamma) * t_verify[1] / (gamma * t_draft + t_verify[gamma + 1])


def best_fixed_gamma(acceptance, t_draft: float, t_verify: dict) -> int:
    """The gamma in 1..len(acceptance) that maximises the predicted speedup. `acceptance[i]` is a_(i+1);
    `t_verify[k]` the time of a target pass over k tokens (k = 1 .. len(acceptance) + 1)."""
    return max(range(1, len(acceptance) + 1), key=lambda g: predicted_speedup(acceptance, g, t_draft, t_verify))


ANSWER_2 = """\
On the lab page, compare `best_fixed_gamma(position_acceptance['greedy'], *cost_ms[dtype])` and the same with
`[pooled_alpha('greedy')] * PROFILE_GAMMA` against the measured best gamma of its sweep (and against the gammas tied
with it). With the measured costs the two acceptance models usually pick the same gamma (check it), and both sit
inside the sweep's tie. Which one is closer in level depends on the run: the profile's a_i come from gamma = 8
rounds, which mostly start after a rejection, so they can underrate a_1 for short gammas. A formula that prices a
pass at one target step (the textbook one) overrates every gamma wherever a wider pass costs more than one step,
so its level is too high; whether its choice of gamma moves too depends on how fast the pass cost grows with the
width: on the notebook's run compare its choice with the measured best. Both models can still be off in level,
since the isolated pass timings are not exactly what the loop pays."""


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


ANSWER_3 = """\
(a) Stopping before a rejected token emits min(p, q) + r * p, where r = 1 - sum(min(p, q)) is the rejection
probability: tokens the draft over-proposes (q > p) keep p(x) from the accepted part and get r * p(x) more, so
the output is biased towards them whenever r > 0 and p != q. (b) Drafting the token and letting rejection
sampling emit from the residual gives min(p, q) + r * (p - q)+ / sum((p - q)+) = min(p, q) + (p - q)+ = p
exactly, because sum((p - q)+) = r. So a sampling oracle must draft the rejected token too ("n + 1"), which makes
it a fixed gamma chosen with hindsight; `oracle_emissions` computes both distributions."""


# Exercise 4 ------------------------------------------------------------------------------------
def best_gamma_per_category(rounds_by_category: dict, t_draft: float, t_verify: dict, max_gamma: int = 8) -> dict:
    """For each category, the best fixed gamma from its own acceptance by position (positions no round
    reached count as never accepted)."""
    best = {}
    for category, rounds in rounds_by_category.items():
        acceptance = np.nan_to_num(acceptance_by_position(rounds, max_gamma), nan=0.0)
        best[category] = best_fixed_gamma(acceptance, t_draft, t_verify)
    return best


def category_gain(rounds_by_category: dict, t_draft: float, t_verify: dict, max_gamma: int = 8) -> dict:
    """Predicted gain of knowing the category: the time to produce every category's tokens (as many as its
    profile rounds produced) with one shared best gamma, divided by the time with each category's own best
    gamma. 1.0 means no gain. Also returns both choices."""
    acceptance = {c: np.nan_to_num(acceptance_by_position(rs, max_gamma), nan=0.0) for c, rs in rounds_by_category.items()}
    tokens = {c: sum(r.accepted + 1 for r in rs) for c, rs in rounds_by_category.items()}

    def seconds(category, gamma):  # time per token x tokens, in the model's units
        per_token = (gamma * t_draft + t_verify[gamma + 1]) / expected_tokens_per_round(acceptance[category], gamma)
        return tokens[category] * per_token

    gammas = range(1, max_gamma + 1)
    shared = min(gammas, key=lambda g: sum(seconds(c, g) for c in acceptance))
    own = {c: min(gammas, key=lambda g: seconds(c, g)) for c in acceptance}
    gain = sum(seconds(c, shared) for c in acceptance) / sum(seconds(c, own[c]) for c in acceptance)
    return {"gain": gain, "shared_gamma": shared, "own_gamma": own}


ANSWER_4 = """\
`category_gain` answers it from the profile rounds (tag each round with its prompt's category in the lab page's
`profile_rounds`; the lab's figure by category shows the measured spread): the ratio of predicted time with one shared gamma to the time with each category's own best.
Look at how far apart the per-category gammas are and how flat the speedup curve is near its top: where the
categories' best gammas sit on the flat top of one shared curve, knowing the category gains little (a ratio near
1); it gains more when one category wants gamma = 1 (the draft is often wrong, a long pass is expensive) and
another a long gamma. It is a bound from the model: a real policy must also detect the category, and the profile's
few prompts per category make each per-category a_i noisy, so check the gain against the spread of the sweep."""
