"""Drafting policies: how many tokens the draft proposes (notebooks 03 and 04).

A policy answers four questions of the engine (`engine.decode`):

- `round_gamma()`: before a round, the most tokens it may draft (round level, notebook 03), never more
  than its `gamma`: for every method `gamma` means the most draft tokens a round may propose (along any
  path of a tree);
- `stop_before(step)` / `stop_after(step)`: while drafting, whether to drop the token the draft is
  about to propose, or to propose it and stop (token level, notebook 04);
- `observe(stats)`: after the target verified the round, what happened (`engine.RoundStats`).

Why every policy here keeps speculative sampling exact: each decision depends only on the past
rounds and on what the draft has produced so far, never on the random numbers the verifier will use,
and a decision to drop a position is made before the draft draws its token there (the engine does
not show a sampled token to `stop_before`). Rejection sampling emits exactly the target's
distribution at a drafted position and the bonus draw does at an undrafted one, so a choice between
the two that is made before the token is drawn keeps every position exact (a stopping time of the
draft's own process; notebook 04, section 2). The oracle is the exception that proves the rule: it
peeks at the target's answer, so it exists only for greedy decoding, as an upper bound.
"""
from __future__ import annotations

import math

import torch

from .checks import is_count, is_number, require

_number, _count = is_number, is_count  # short names for the checks below


class DraftingPolicy:
    """The fixed-gamma policy of Leviathan et al. (2023): always draft `gamma` tokens. Every other
    policy overrides a hook or two; `gamma` is always the most tokens a round may draft."""
    name = "fixed"
    reason = "policy"      # the stop reason recorded when a hook stops drafting
    needs_hidden = False   # True if stop_before/stop_after read `step.hidden`

    def __init__(self, gamma: int = 4):
        require("gamma", gamma, _count(gamma, 0), "an integer >= 0 (the most draft tokens per round)")
        self.gamma = self.initial_gamma = gamma

    def round_gamma(self) -> int:
        return self.gamma

    def stop_before(self, step) -> bool:
        return False

    def stop_after(self, step) -> bool:
        return False

    def observe(self, stats) -> None:
        pass


# ------------------------------------------------------------------ round level (notebook 03)
class HeuristicGamma(DraftingPolicy):
    """Hugging Face's `num_assistant_tokens_schedule="heuristic"` (transformers
    `AssistedCandidateGenerator.update_candidate_strategy`): +2 after a round whose candidates were
    all accepted, -1 (never below 1) otherwise, starting from `start`. `gamma=None`: no upper bound, as
    in transformers (the token budget still caps a round)."""
    name = "adaptive-hf"

    def __init__(self, start: int = 4, gamma: int | None = None):
        require("gamma", gamma, gamma is None or _count(gamma), "an integer >= 1 or None (no cap)")
        require("start", start, _count(start), "an integer >= 1")
        super().__init__(start if gamma is None else min(start, gamma))
        self.max_gamma = gamma

    def observe(self, stats) -> None:
        if stats.drafted and stats.accepted == stats.drafted:
            self.gamma += 2
            if self.max_gamma is not None:
                self.gamma = min(self.gamma, self.max_gamma)
        elif stats.drafted:
            self.gamma = max(1, self.gamma - 1)


class DualSignalGamma(DraftingPolicy):
    """The dual signal: the last round's acceptance (accepted / drafted) above `high` -> +1,
    below `low` -> -1; in between, a confident draft (mean entropy of the round's drafted tokens
    below `entropy_threshold` nats) with acceptance >= 0.5 -> +1. A round's length starts at `start` and
    stays in [min_gamma, gamma]."""
    name = "adaptive-dual"

    def __init__(self, start: int = 4, high: float = 0.8, low: float = 0.3, entropy_threshold: float = 2.0,
                 min_gamma: int = 1, gamma: int = 8):
        max_gamma = gamma
        require("start", start, _count(start), "an integer >= 1")
        for name, value in (("high", high), ("low", low)):
            require(name, value, _number(value, 0, 1), "a number in [0, 1]")
        require("entropy_threshold", entropy_threshold, _number(entropy_threshold, 0), "a number >= 0 (nats)")
        require("min_gamma", min_gamma, _count(min_gamma), "an integer >= 1")
        require("gamma", max_gamma, _count(max_gamma, min_gamma), f"an integer >= min_gamma ({min_gamma})")
        super().__init__(min(max(start, min_gamma), max_gamma))
        self.high, self.low, self.entropy_threshold = high, low, entropy_threshold
        self.min_gamma, self.max_gamma = min_gamma, max_gamma
        self.entropies: list[float] = []

    def round_gamma(self) -> int:
        self.entropies = []
        return self.gamma

    def stop_after(self, step) -> bool:
        self.entropies.append(step.entropy)
        return False

    def observe(self, stats) -> None:
        if not stats.drafted:
            return
        rate = stats.accepted / stats.drafted
        mean_entropy = sum(self.entropies[:stats.drafted]) / stats.drafted
        if rate > self.high:
            step = 1
        elif rate < self.low:
            step = -1
        else:
            step = int(rate >= 0.5 and mean_entropy < self.entropy_threshold)
        self.gamma = min(max(self.gamma + step, self.min_gamma), self.max_gamma)


class Oracle(DraftingPolicy):
    """Knows the target's greedy output (`reference`, the new token ids of plain greedy decoding)
    and drafts exactly the tokens the target will accept, then stops: no draft is ever wasted, and
    the target's token comes as the bonus. An upper bound for any gamma policy with this draft
    (greedy only: it reads the target's answer). `gamma` caps one round's verification width.
    In float32 the engine's greedy output equals the reference; in bfloat16 a near tie can make it
    depart from the reference, and from there on the oracle's knowledge is wrong (it drafts little),
    so it is no upper bound there."""
    name = "oracle"
    reason = "oracle"

    def __init__(self, gamma: int = 16, reference: list[int] | None = None):
        if reference is None:
            raise ValueError("method 'oracle' needs params={'reference': <the target's greedy new token ids>}")
        if isinstance(reference, torch.Tensor):
            reference = reference.flatten().tolist()
        require("reference", reference, isinstance(reference, (list, tuple))
                and all(_count(token, 0) for token in reference), "a list of token ids (integers >= 0)")
        super().__init__(gamma)
        self.reference = list(reference)

    def stop_before(self, step) -> bool:
        return step.index >= len(self.reference) or step.token != self.reference[step.index]


# ------------------------------------------------------------------ token level (notebook 04)
class EntropyStop(DraftingPolicy):
    """SD + self-verify (HSDDW, Syu & Lee 2025; their code, `KVCacheModelEntropyGamma`): the draft
    proposes its token, then stops drafting if the entropy of the distribution it drew it from is
    above the threshold theta (nats). With `theta=None`, theta is the running mean of the entropies of the draft
    tokens the target rejected so far (one per round: the first rejected one), starting from `theta0` (0 in
    HSDDW's two-model code: one token per round until the first rejection); with a number, theta stays fixed.
    (HSDDW call the threshold tau; the course keeps tau for tokens per target pass.)"""
    name = "entropy-stop"
    reason = "entropy"

    def __init__(self, gamma: int = 10, theta: float | None = None, theta0: float = 0.0):
        require("theta", theta, theta is None or _number(theta, 0), "a number >= 0 (nats) or None (adaptive)")
        require("theta0", theta0, _number(theta0, 0), "a number >= 0 (nats)")
        super().__init__(gamma)
        self.adaptive = theta is None
        self.theta = theta0 if theta is None else theta
        self.rejected_entropies: list[float] = []
        self.entropies: list[float] = []

    def round_gamma(self) -> int:
        self.entropies = []
        return self.gamma

    def stop_after(self, step) -> bool:
        self.entropies.append(step.entropy)
        return step.entropy > self.theta

    def observe(self, stats) -> None:
        if stats.accepted < stats.drafted:  # the first rejected draft token of the round
            self.rejected_entropies.append(self.entropies[stats.accepted])
            if self.adaptive:
                self.theta = sum(self.rejected_entropies) / len(self.rejected_entropies)


class ConfidenceStop(DraftingPolicy):
    """Hugging Face's `assistant_confidence_threshold` (transformers `ConfidenceCriteria`): propose
    the token, then stop if the draft's probability of it is below the threshold (0.4 by default).
    With `refit`, the threshold is re-chosen after every round from the ROC curve of (draft
    probability, accepted?) pairs seen so far, minimising FPR + 3 FNR, once there are more than 5
    pairs with both kinds among them (`AssistedCandidateGenerator.update_candidate_strategy`, which
    does it only when scikit-learn is installed; `min_cost_threshold` uses the same `roc_curve`)."""
    name = "confidence-stop"
    reason = "confidence"

    def __init__(self, gamma: int = 10, threshold: float = 0.4, refit: bool = True):
        require("threshold", threshold, _number(threshold, 0, 1), "a probability in [0, 1]")
        require("refit", refit, isinstance(refit, bool), "True or False")
        super().__init__(gamma)
        self.threshold, self.refit = threshold, refit
        self.probs: list[float] = []    # judged draft tokens: the draft's probability of each ...
        self.matches: list[int] = []    # ... and whether the target accepted it
        self.round_probs: list[float] = []

    def round_gamma(self) -> int:
        self.round_probs = []
        return self.gamma

    def stop_after(self, step) -> bool:
        self.round_probs.append(step.token_prob)
        return step.token_prob < self.threshold

    def observe(self, stats) -> None:
        judged = stats.accepted + (stats.accepted < stats.drafted)  # tokens after a rejection are never judged
        self.probs += self.round_probs[:judged]
        self.matches += [1] * stats.accepted + [0] * (judged - stats.accepted)
        if self.refit and len(self.probs) > 5 and 0 in self.matches and 1 in self.matches:
            self.threshold = min_cost_threshold(self.probs, self.matches)


def min_cost_threshold(scores: list[float], labels: list[int], false_negative_cost: float = 3.0) -> float:
    """The score threshold t minimising FPR(t) + cost * FNR(t), where a score >= t predicts label 1: the
    ROC-curve rule of transformers' assisted generation (`AssistedCandidateGenerator.update_candidate_strategy`),
    computed as it does, with scikit-learn's `roc_curve` and the first minimum (the highest t among equal
    costs). Costs that are equal on paper can differ in their last bit, so a reimplementation that rounds
    differently picks another threshold now and then; calling the same function keeps the two identical."""
    import numpy as np
    from sklearn.metrics import roc_curve
    fpr, tpr, thresholds = roc_curve(labels, scores)
    costs = fpr + false_negative_cost * (1 - tpr)
    return float(thresholds[np.argmin(costs)])


class AdaEDL(DraftingPolicy):
    """AdaEDL (Agrawal et al. 2024, arXiv 2410.18351): before drafting a token (never the first of a
    round), stop if the entropy-based lower bound on its acceptance probability,
    1 - sqrt(entropy_factor * H(q)), is below lam. lam adapts after each round as in Draft & Verify
    (Zhang et al. 2024), whose constants AdaEDL reuses: the smoothed acceptance
    AR <- beta1 AR + (1 - beta1) accepted / drafted; lam' = lam + eps if AR < alpha, else lam if the
    round drafted gamma tokens, else lam - eps; lam <- beta2 lam + (1 - beta2) lam'.
    (Taken from Draft & Verify's code and secondary descriptions of AdaEDL; the paper leaves lam0 open.)"""
    name = "adaedl"
    reason = "adaedl"

    def __init__(self, gamma: int = 10, lam0: float = 0.3, entropy_factor: float = 0.2, alpha: float = 0.9,
                 beta1: float = 0.5, beta2: float = 0.9, eps: float = 0.01, adapt: bool = True):
        for name, value in (("lam0", lam0), ("alpha", alpha), ("beta1", beta1), ("beta2", beta2), ("eps", eps)):
            require(name, value, _number(value, 0, 1), "a number in [0, 1]")
        require("entropy_factor", entropy_factor, _number(entropy_factor, 0), "a number >= 0")
        require("adapt", adapt, isinstance(adapt, bool), "True or False")
        super().__init__(gamma)
        self.lam, self.entropy_factor, self.alpha = lam0, entropy_factor, alpha
        self.beta1, self.beta2, self.eps, self.adapt = beta1, beta2, eps, adapt
        self.smoothed_acceptance = alpha

    def stop_before(self, step) -> bool:
        return step.position > 0 and 1 - math.sqrt(self.entropy_factor * step.entropy) < self.lam

    def observe(self, stats) -> None:
        if not (self.adapt and stats.drafted):
            return
        self.smoothed_acceptance = (self.beta1 * self.smoothed_acceptance
                                    + (1 - self.beta1) * stats.accepted / stats.drafted)
        if self.smoothed_acceptance < self.alpha:
            target = self.lam + self.eps
        elif stats.drafted == self.gamma:
            target = self.lam
        else:
            target = self.lam - self.eps
        self.lam = self.beta2 * self.lam + (1 - self.beta2) * target


class LearnedStop(DraftingPolicy):
    """A learned stop in the manner of SpecDec++ (Huang et al. 2024): a tiny head on the draft's last
    hidden state (and its distribution's entropy and top probability) predicts the probability a_j
    that drafted token j will be accepted (`stop_head.StopHead`), and drafting stops when the
    predicted probability that the round fails, 1 - prod_{i<=j} a_i, would exceed `threshold`.
    The head reads the hidden state that produced token j's distribution, so a_j is known before
    token j is proposed: unlike SpecDec++, which submits the token that tips the product over the
    threshold and always drafts at least 2, this rule drops it, and may draft nothing at all (a plain
    target step) when even the first token looks hopeless. `head` is a `StopHead` or a path; by
    default the one shipped in the draft's own folder (`stop_head.resolve_head`)."""
    name = "learned-stop"
    reason = "learned"
    needs_hidden = True

    def __init__(self, gamma: int = 10, threshold: float = 0.7, head=None, draft=None):
        from .stop_head import resolve_head
        require("threshold", threshold, _number(threshold, 0, 1), "a probability in [0, 1]")
        super().__init__(gamma)
        self.threshold = threshold
        self.head = resolve_head(head, draft)
        self.survival = 1.0

    def round_gamma(self) -> int:
        self.survival = 1.0
        return self.gamma

    def stop_before(self, step) -> bool:
        survival = self.survival * self.head.acceptance(step.hidden, step.logits, greedy=step.probs is None)
        if self.stops(survival, step):
            return True
        self.survival = survival
        return False

    def stops(self, survival: float, step) -> bool:
        """Whether drafting `step`'s token, after which the round survives with probability
        `survival`, is not worth it: here, when the round would more likely than `threshold` fail."""
        return 1 - survival > self.threshold
