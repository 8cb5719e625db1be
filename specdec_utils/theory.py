"""Closed-form predictions for speculative decoding (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding", Sec. 3). Used in notebook 00 to plot the speedup to expect.
Also what rounds measure (`acceptance_by_position`) and what they would do on a known continuation
(`simulate_rounds`: the trainers' tau, without a model).

Notation: `alpha` is the acceptance rate (expected probability that the target accepts one drafted
token), `gamma` the number of tokens drafted per round, `cost_ratio` (the paper's c) the time of one
draft forward divided by the time of one target forward. Every function accepts Python floats,
numpy arrays or torch tensors (broadcast against each other) and returns the same kind: a float for
scalar inputs, a float64 numpy array, or a float64 torch tensor on the inputs' device.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


def expected_accepted_length(alpha, gamma):
    """Expected tokens produced per target forward pass, (1 - alpha^(gamma+1)) / (1 - alpha).

    Leviathan et al. 2023, Eq. 1: the accepted drafted tokens plus the one token the target adds
    (its correction or its bonus token). Limits: 1 at alpha = 0, gamma + 1 at alpha = 1.
    `gamma` must be a whole number >= 0 here (gamma = 0 is plain decoding: one token per pass).
    """
    xp, (a, g), scalar = _prepare(alpha, gamma)
    _check(xp, a, g, min_gamma=0)
    return _finish(_accepted(xp, a, g), scalar)


def expected_speedup(alpha, gamma, cost_ratio):
    """Expected wall-time speedup over plain decoding, (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)).

    Leviathan et al. 2023, Theorem 3.8: a round costs gamma draft forwards plus one target forward
    (gamma * c + 1 target-forward times) and yields `expected_accepted_length` tokens. It assumes a
    target forward over gamma + 1 tokens costs what one token costs. Needs gamma >= 1 (a whole
    number) and cost_ratio >= 0.
    """
    xp, (a, g, c), scalar = _prepare(alpha, gamma, cost_ratio)
    _check(xp, a, g, min_gamma=1)
    if _any(xp, (c < 0) | xp.isnan(c)):
        raise ValueError("cost_ratio (draft time / target time) must be >= 0")
    return _finish(_accepted(xp, a, g) / (g * c + 1), scalar)


def optimal_gamma(alpha, cost_ratio, max_gamma: int = 32) -> int:
    """The gamma in 1..max_gamma that maximizes `expected_speedup` for scalar alpha and cost_ratio."""
    gammas = np.arange(1, max_gamma + 1)
    return int(gammas[np.argmax(expected_speedup(float(alpha), gammas, float(cost_ratio)))])


def _accepted(xp, a, g):
    # 1 - a^(g+1) = -expm1((g+1) log a) stays accurate as alpha -> 1, where the plain formula
    # cancels; alpha == 1 exactly takes its limit g + 1.
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = -xp.expm1((g + 1) * xp.log1p(a - 1)) / (1 - a)
    return xp.where(a == 1, g + 1, ratio)


def _prepare(*values):
    """Convert inputs to one array library (torch if any input is a tensor), float64, broadcast."""
    scalar = not any(isinstance(v, (torch.Tensor, np.ndarray, list, tuple)) for v in values)
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if tensors:
        device = tensors[0].device
        arrays = [torch.as_tensor(v, dtype=torch.float64, device=device) for v in values]
        return torch, torch.broadcast_tensors(*arrays), scalar
    return np, np.broadcast_arrays(*[np.asarray(v, dtype=np.float64) for v in values]), scalar


def _check(xp, a, g, min_gamma: int) -> None:
    if _any(xp, (a < 0) | (a > 1) | xp.isnan(a)):
        raise ValueError("alpha (the acceptance rate) must lie in [0, 1]")
    if _any(xp, (g < min_gamma) | (g != xp.floor(g))):
        raise ValueError(f"gamma (tokens drafted per round) must be a whole number >= {min_gamma}")


def _any(xp, mask) -> bool:
    return bool(mask.any()) if xp is torch else bool(np.any(mask))


def _finish(result, scalar: bool):
    return float(result) if scalar else result


def acceptance_by_position(rounds, max_position: int) -> np.ndarray:
    """Measured a_i, i = 1..max_position: the fraction of rounds that drafted token i, after
    tokens 1..i-1 were all accepted, in which the target accepted token i (`engine.RoundStats`
    records: `drafted`, `accepted`). NaN where no round got that far."""
    reached, kept = position_counts(rounds, max_position)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.array(kept, dtype=np.float64) / np.array(reached, dtype=np.float64)


def position_counts(rounds, max_position: int) -> tuple[list[int], list[int]]:
    """The counts behind `acceptance_by_position`, for i = 1..max_position: `reached[i - 1]`, the rounds
    that drafted token i after tokens 1..i-1 were all accepted; `accepted[i - 1]`, those in which the
    target accepted token i. `rounds`: `engine.RoundStats` or `SimulatedRound` records. Plain ints,
    so counts from several texts add up (and go into JSON)."""
    reached, kept = [0] * max_position, [0] * max_position
    for r in rounds:
        for i in range(min(r.drafted, r.accepted + 1, max_position)):  # judged: accepted ones + first rejected
            reached[i] += 1
            kept[i] += i < r.accepted
    return reached, kept


class SimulatedRound(NamedTuple):
    """One round of `simulate_rounds`, its fields named as in `engine.RoundStats`: `drafted` tokens
    proposed, `accepted` of them, `new_tokens` = accepted + 1 (the target's own token added)."""
    drafted: int
    accepted: int
    new_tokens: int


def simulate_rounds(matches, gamma: int, budget: int | None = None) -> list[SimulatedRound]:
    """The rounds greedy speculative decoding runs over one continuation (the target's greedy output),
    from where the draft is right, with no model: each round drafts up to `gamma` tokens, the target
    accepts the leading right ones and adds one token of its own (its correction, or its bonus token
    when every draft was accepted). What the trainers report as tau is sum(new_tokens) / rounds.

    It follows the engine's budget rule (`engine._decode`, `room`): a round drafts at most
    `budget - produced - 1` tokens, so that its accepted drafts plus the target's token never pass
    `budget` (default: the continuation's length, len(matches)), and decoding stops once `budget`
    tokens are out. So the rounds' `new_tokens` add up to `budget`: no bonus token is credited past the
    end. (A continuation cut after an end-of-sequence token gets the same tokens per round as an engine
    run with a larger budget, which stops after that token.)

    `matches` (bools: a list, a numpy array or a tensor) has one of two shapes:

    - [L], a draft that reads tokens only (a draft model): `matches[j]`, whether its greedy token for
      continuation token j, given the true tokens before j (teacher-forced), is token j. The first
      round drafts from the prompt, as `generate(..., method="draft")` does.
    - [L, K] with K >= gamma, a drafter that reads the target's features (an EAGLE head, a block
      drafter): `matches[m, k]`, whether the k-th draft (from 0) of the round whose newest token is
      continuation token m is token m + 1 + k. Such a drafter has nothing to draft from at the prefill,
      whose pass produces token 0 alone; that round is not returned (these are the engine's
      `rounds[1:]` for `eagle-chain` or `block`).
    """
    right = torch.as_tensor(matches, dtype=torch.bool).cpu().numpy()
    if right.ndim not in (1, 2):
        raise ValueError(f"matches must be [L] or [L, K], got {right.ndim} dimensions")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)) or gamma < 0:
        raise ValueError(f"gamma (tokens drafted per round) must be a whole number >= 0, got {gamma!r}")
    if right.ndim == 2 and right.shape[1] < gamma:
        raise ValueError(f"matches has {right.shape[1]} draft steps per round, fewer than gamma = {gamma}")
    length = right.shape[0]
    budget = length if budget is None else budget
    if not 0 <= budget <= length:
        raise ValueError(f"budget must lie in 0..{length} (the continuation's length), got {budget}")
    produced = 1 if right.ndim == 2 else 0  # a feature-reading drafter's first round follows the prefill's token
    rounds = []
    while produced < budget:
        drafted = min(gamma, budget - produced - 1)  # the engine's room: k drafts + 1 target token
        window = right[produced - 1, :drafted] if right.ndim == 2 else right[produced:produced + drafted]
        accepted = int(np.cumprod(window).sum())  # the leading right drafts
        rounds.append(SimulatedRound(drafted, accepted, accepted + 1))
        produced += accepted + 1
    return rounds


def expected_tokens_per_round(acceptance, gamma: int) -> float:
    """E[tokens per round] = 1 + sum_{i=1..gamma} prod_{j<=i} a_j for a round that drafts gamma
    tokens, where a_j = P(token j accepted | tokens before it accepted) (`acceptance[j-1]`). With a
    constant a_j = alpha this is `expected_accepted_length(alpha, gamma)` (Leviathan et al. Eq. 1)."""
    a = np.asarray(acceptance, dtype=np.float64)[:gamma]
    if len(a) < gamma:
        raise ValueError(f"need acceptance for {gamma} positions, got {len(a)}")
    return float(1 + np.cumprod(a).sum())


# ------------------------------------------------------------------ two levels of drafting (notebook 05)
def middle_cost_per_token(a12, gamma1, c1, c2):
    """Target-forward time per token the middle level (M2) produces when M1 drafts `gamma1` tokens
    (cost `c1` each) and M2 pre-verifies them in one forward (cost `c2`):
    (gamma1 c1 + c2) / L(a12, gamma1), with L = `expected_accepted_length` (M2 accepts M1's tokens
    at rate a12 and adds one of its own). gamma1 = 0 is M2 drafting alone: c2 per token."""
    xp, (a, g, k1, k2), scalar = _prepare(a12, gamma1, c1, c2)
    _check(xp, a, g, min_gamma=0)
    return _finish((g * k1 + k2) / _accepted(xp, a, g), scalar)


def expected_speedup_hierarchical(a12, a2p, gamma1, gamma2, c1, c2):
    """Expected speedup of three-level drafting with fixed lengths: M2's pending tokens cost
    `middle_cost_per_token` each instead of c2, and the target accepts them at rate a2p, so
    Leviathan's formula applies with that effective cost: L(a2p, gamma2) / (gamma2 c_eff + 1).
    It assumes i.i.d. acceptances, a pre-verification and a target pass that cost what one token
    costs, and a round of exactly `gamma2` pending tokens (the real one comes in M2-sized chunks)."""
    effective = middle_cost_per_token(a12, gamma1, c1, c2)
    return expected_speedup(a2p, gamma2, effective)


def best_pair_speedup(alpha, cost_ratio, max_gamma: int = 16) -> tuple[float, int]:
    """(speedup, gamma) of the best fixed-gamma two-model pair (`expected_speedup`), gamma in 1..max_gamma."""
    gammas = np.arange(1, max_gamma + 1)
    speedups = expected_speedup(float(alpha), gammas, float(cost_ratio))
    return float(speedups.max()), int(gammas[speedups.argmax()])


def best_hierarchy_speedup(a12, a2p, c1, c2, max_gamma: int = 16) -> tuple[float, int, int]:
    """(speedup, gamma1, gamma2) of the best fixed-length hierarchy (`expected_speedup_hierarchical`),
    gamma2 in 1..max_gamma and gamma1 in 0..gamma2 - 1 (a round holds gamma2 tokens and M2 adds one
    of its own to M1's, as `hierarchy.HierarchicalProposer` does); gamma1 = 0 is the M2 pair itself."""
    g1, g2 = np.meshgrid(np.arange(0, max_gamma + 1), np.arange(1, max_gamma + 1), indexing="ij")
    speedups = expected_speedup_hierarchical(float(a12), float(a2p), g1, g2, float(c1), float(c2))
    speedups = np.where(g1 < g2, speedups, -np.inf)
    i, j = np.unravel_index(np.argmax(speedups), speedups.shape)
    return float(speedups[i, j]), int(g1[i, j]), int(g2[i, j])


def hierarchy_gain(a12, a2p, a1p, c1, c2, max_gamma: int = 16) -> float:
    """Best hierarchy / best of the two pairs (M1 -> target at a1p, c1; M2 -> target at a2p, c2).
    Above 1 a third level pays; the hierarchy includes the M2 pair (gamma1 = 0), so it is never
    below the M2 pair, but the M1 pair may beat both. `a1p=None` leaves the M1 pair out: the gain
    over the M2 pair alone, which does not depend on how M1 would fare by itself."""
    pairs = best_pair_speedup(a2p, c2, max_gamma)[0]
    if a1p is not None:
        pairs = max(pairs, best_pair_speedup(a1p, c1, max_gamma)[0])
    return best_hierarchy_speedup(a12, a2p, c1, c2, max_gamma)[0] / pairs
