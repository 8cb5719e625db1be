"""Tests of specdec_utils.theory: Leviathan et al. 2023, Eq. 1 and Theorem 3.8, and the round simulator
(`simulate_rounds`) against the engine's own rounds."""
import math
import random

import numpy as np
import pytest
import torch

from specdec_utils.core import policies
from specdec_utils.core.engine import Proposal, Sampler, decode
from specdec_utils.core.methods import generate
from specdec_utils.exactness import ToyLM
from specdec_utils.theory import (
    acceptance_by_position,
    best_hierarchy_speedup,
    best_pair_speedup,
    expected_accepted_length,
    expected_speedup,
    expected_speedup_hierarchical,
    hierarchy_gain,
    middle_cost_per_token,
    optimal_gamma,
    position_counts,
    simulate_rounds,
)

from conftest import noisy_copy


def test_known_values():
    assert expected_accepted_length(0.5, 1) == pytest.approx(1.5)
    assert expected_accepted_length(0.5, 3) == pytest.approx(1.875)  # 1 + .5 + .25 + .125
    assert expected_accepted_length(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)
    assert expected_speedup(0.5, 3, 0.0) == pytest.approx(1.875)
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8**5) / (0.2 * 1.2))


def test_worked_example():
    # alpha 0.8 and a draft 20x cheaper than the target: about 3.1x at gamma 8.
    assert 3.0 < expected_speedup(0.8, optimal_gamma(0.8, 0.05), 0.05) < 3.5
    assert optimal_gamma(0.8, 0.05) == 8


def test_limit_alpha_zero():
    for gamma in (0, 1, 5, 20):
        assert expected_accepted_length(0.0, gamma) == 1.0
    # Nothing is ever accepted: we only pay for the drafts.
    assert expected_speedup(0.0, 4, 0.25) == pytest.approx(1 / 2)


def test_limit_alpha_one():
    for gamma in (0, 1, 5, 20):
        assert expected_accepted_length(1.0, gamma) == gamma + 1
        assert expected_accepted_length(1 - 1e-12, gamma) == pytest.approx(gamma + 1, rel=1e-9)
    assert expected_speedup(1.0, 4, 0.0) == 5.0
    assert expected_speedup(1.0, 4, 0.25) == pytest.approx(5 / 2)


def test_gamma_zero_is_plain_decoding():
    assert expected_accepted_length(np.linspace(0, 1, 11), 0) == pytest.approx(np.ones(11))


def test_monotone_in_alpha_and_gamma():
    alphas = np.linspace(0, 1, 101)
    for gamma in (1, 4, 10):
        assert np.all(np.diff(expected_accepted_length(alphas, gamma)) > 0)
        assert np.all(np.diff(expected_speedup(alphas, gamma, 0.1)) > 0)
    gammas = np.arange(0, 30)
    assert np.all(np.diff(expected_accepted_length(0.7, gammas)) > 0)
    # Speedup falls as drafting gets more expensive.
    assert np.all(np.diff(expected_speedup(0.7, 4, np.linspace(0, 2, 21))) < 0)


def test_speedup_has_interior_optimum():
    gammas = np.arange(1, 40)
    speedup = expected_speedup(0.8, gammas, 0.1)
    best = optimal_gamma(0.8, 0.1, max_gamma=39)
    assert speedup.max() == pytest.approx(expected_speedup(0.8, best, 0.1))
    assert 1 < best < 39 and speedup[-1] < speedup.max()


def test_vectorized_types_and_broadcasting():
    assert isinstance(expected_speedup(0.5, 2, 0.1), float)
    grid = expected_speedup(np.array([[0.5], [0.9]]), np.arange(1, 5), 0.1)
    assert isinstance(grid, np.ndarray) and grid.shape == (2, 4)
    assert grid[1, 2] == pytest.approx(expected_speedup(0.9, 3, 0.1))
    tensor = expected_accepted_length(torch.tensor([0.0, 0.5, 1.0]), 3)
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float64
    assert torch.allclose(tensor, torch.tensor([1.0, 1.875, 4.0], dtype=torch.float64))
    mixed = expected_speedup(0.6, torch.arange(1, 4), np.float64(0.2))
    assert isinstance(mixed, torch.Tensor) and mixed.shape == (3,)
    assert expected_accepted_length([0.5, 0.5], [1, 3]).tolist() == pytest.approx([1.5, 1.875])


@pytest.mark.parametrize("alpha", [-0.1, 1.1, math.nan, [0.5, 2.0], torch.tensor([0.5, -1.0])])
def test_rejects_alpha_outside_unit_interval(alpha):
    with pytest.raises(ValueError, match="alpha"):
        expected_accepted_length(alpha, 3)
    with pytest.raises(ValueError, match="alpha"):
        expected_speedup(alpha, 3, 0.1)


def test_rejects_bad_gamma():
    with pytest.raises(ValueError, match="gamma"):
        expected_accepted_length(0.5, -1)
    with pytest.raises(ValueError, match="gamma"):
        expected_accepted_length(0.5, 2.5)
    with pytest.raises(ValueError, match="gamma"):
        expected_speedup(0.5, 0, 0.1)
    with pytest.raises(ValueError, match="gamma"):
        expected_speedup(0.5, np.array([1, 0]), 0.1)


def test_rejects_negative_cost_ratio():
    with pytest.raises(ValueError, match="cost_ratio"):
        expected_speedup(0.5, 3, -0.01)
    with pytest.raises(ValueError, match="cost_ratio"):
        expected_speedup(0.5, 3, torch.tensor([0.1, -1.0]))


# --- two levels (notebook 05) -------------------------------------------------------------------


def test_middle_cost_per_token():
    assert middle_cost_per_token(0.3, 0, 0.05, 0.1) == pytest.approx(0.1)  # M2 alone
    # M1 always right and free: one M2 pass yields gamma1 + 1 tokens
    assert middle_cost_per_token(1.0, 3, 0.0, 0.1) == pytest.approx(0.1 / 4)
    # M1 never right: its drafts only add cost
    assert middle_cost_per_token(0.0, 3, 0.01, 0.1) == pytest.approx(0.13)


def test_hierarchy_reduces_to_the_middle_pair_and_beats_it_only_with_a_cheap_agreeing_bottom():
    assert expected_speedup_hierarchical(0.5, 0.7, 0, 4, 0.01, 0.1) == pytest.approx(expected_speedup(0.7, 4, 0.1))
    pair, gamma = best_pair_speedup(0.7, 0.1)
    assert pair == pytest.approx(max(expected_speedup(0.7, g, 0.1) for g in range(1, 17))) and gamma >= 1
    speedup, g1, g2 = best_hierarchy_speedup(0.0, 0.7, 0.01, 0.1)  # a useless M1 is left out
    assert (g1, speedup) == (0, pytest.approx(pair))
    assert best_hierarchy_speedup(0.9, 0.7, 0.001, 0.1)[0] > 1.2 * pair  # a free, agreeing M1 pays
    # two drafts of equal cost and near-equal quality: no hierarchy beats the better pair
    assert hierarchy_gain(0.8, 0.66, 0.63, 0.1, 0.1) <= 1.0
    assert hierarchy_gain(0.9, 0.7, 0.2, 0.001, 0.1) > 1.1


# --- the round simulator (the trainers' tau) against the engine ------------------------------------------------


def tokens(rounds) -> list[int]:
    return [r.new_tokens for r in rounds]


@pytest.mark.parametrize("matches, gamma, budget, expected", [
    ([True] * 4, 4, 4, [4]),                   # 3 drafts accepted + the target's last token; no bonus past the end
    ([True] * 4, 4, None, [4]),                # the budget is the continuation's length by default
    ([True] * 8, 4, None, [5, 3]),             # 4 accepted + bonus, then 2 drafts for the 3 left
    ([True] * 8, 4, 6, [5, 1]),                # a budget ending mid-round: the last round drafts nothing
    ([False] * 3, 4, None, [1, 1, 1]),         # every round: only the target's own token
    ([True, False, True, True, True, True, False], 2, None, [2, 3, 2]),
    ([True] * 5, 0, None, [1] * 5),            # gamma 0 is plain decoding
])
def test_simulate_rounds_known_values(matches, gamma, budget, expected):
    rounds = simulate_rounds(matches, gamma, budget)
    assert tokens(rounds) == expected
    assert all(r.new_tokens == r.accepted + 1 and r.accepted <= r.drafted <= gamma for r in rounds)


def test_simulate_rounds_never_passes_the_budget():
    """On random acceptance patterns the rounds' tokens add up to the budget exactly (the old simulators credited a
    bonus token past the end whenever the last drafts all matched: about 0.65 tokens per 64-token text at 0.7)."""
    rng = random.Random(0)
    for _ in range(300):
        length, gamma = rng.randint(1, 64), rng.randint(0, 8)
        matches = [rng.random() < 0.7 for _ in range(length)]
        budget = rng.choice([None, rng.randint(0, length)])
        rounds = simulate_rounds(matches, gamma, budget)
        assert sum(tokens(rounds)) == (length if budget is None else budget)
        assert all(r.drafted == min(gamma, r.drafted) for r in rounds)
        # one matrix row per round start, each reading the 1-D pattern after it: the same rounds once the first
        # token is the prefill's (a draft wrong on token 0)
        grid = [[m + 1 + k < length and matches[m + 1 + k] for k in range(gamma)] for m in range(length)]
        if budget != 0:
            assert simulate_rounds(grid, gamma, budget) == simulate_rounds([False] + matches[1:], gamma, budget)[1:]


def test_position_counts_are_acceptance_by_positions_counts():
    rounds = simulate_rounds([True, True, False, True, False, False, True, True, True, True], 3)
    reached, accepted = position_counts(rounds, 4)
    assert (reached, accepted) == ([4, 3, 2, 0], [3, 2, 1, 0])  # rounds (3 drafted, 2 accepted), (3, 1), (3, 0), (3, 3)
    assert sum(accepted) == sum(tokens(rounds)) - len(rounds)
    assert all(isinstance(c, int) for c in reached + accepted)
    np.testing.assert_allclose(acceptance_by_position(rounds, 4), [3 / 4, 2 / 3, 1 / 2, np.nan])


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize("noise", [0.0, 1.5, 3.0])
def test_simulated_rounds_are_the_engines_with_a_draft_model(noise):
    """A toy pair: where the draft is right on the target's greedy text, teacher-forced (what `train_draft.evaluate`
    computes), simulated, gives the engine's rounds (drafted, accepted, new tokens), for every gamma and budget."""
    target = ToyLM(16, seed=0, sharpness=3.0).eval()
    draft = noisy_copy(target, noise=noise, seed=1).eval()
    prompt = torch.tensor([[3, 7, 1]])
    n, length = prompt.shape[1], 40
    continuation = generate(target, prompt, length, method="ar").new_token_ids
    full = torch.cat([prompt, torch.tensor([continuation])], dim=1)
    with torch.no_grad():
        matches = (draft(full).logits[0, n - 1:-1].argmax(-1) == target(full).logits[0, n - 1:-1].argmax(-1)).tolist()
    assert noise or all(matches)
    compared = 0
    for gamma in (1, 3, 4, 7):
        for budget in (length, length - 1, 17, 5, 1):
            result = generate(target, prompt, budget, method="draft", draft=draft, gamma=gamma)
            assert result.new_token_ids == continuation[:budget]
            engine = [(r.drafted, r.accepted, r.new_tokens) for r in result.rounds]
            assert [tuple(r) for r in simulate_rounds(matches, gamma, budget)] == engine, (gamma, budget)
            compared += 1
    assert compared == 20


class MatrixDrafter:
    """A drafter scripted by a `simulate_rounds` matrix: nothing at the prefill (it would read the target's features,
    which do not exist yet), then in the round whose newest token is continuation token m, draft k is the true token
    m + 1 + k where matches[m, k] holds, and a wrong one elsewhere."""

    def __init__(self, continuation: list[int], matches, prompt_length: int, vocab: int):
        self.continuation, self.matches, self.n, self.vocab = continuation, matches, prompt_length, vocab

    def propose(self, tokens, gamma, policy, sampler, generator, index) -> Proposal:
        m = tokens.shape[1] - self.n - 1
        if m < 0 or gamma == 0:
            return Proposal(tokens[0, :0], None, "no draft", 0)
        drafted = []
        for k in range(gamma):
            right = self.continuation[m + 1 + k] if m + 1 + k < len(self.continuation) else 0
            drafted.append(right if self.matches[m][k] else (right + 1) % self.vocab)
        return Proposal(tokens.new_tensor(drafted), None, "gamma", 0, self.vocab)

    def rollback(self, committed: int) -> None:
        pass


@pytest.mark.usefixtures("single_thread")
def test_simulated_rounds_are_the_engines_with_a_feature_drafter():
    """The [L, K] form (EAGLE heads, block drafters): the engine's rounds after the prefill's, for random matrices
    that are often right up to the continuation's end."""
    target = ToyLM(16, seed=2, sharpness=3.0).eval()
    prompt, length, rng = torch.tensor([[5, 9]]), 30, random.Random(1)
    continuation = generate(target, prompt, length, method="ar").new_token_ids
    for trial in range(12):
        gamma, p = rng.randint(1, 6), rng.choice([0.5, 0.8, 1.0])
        matches = [[m + 1 + k < length and rng.random() < p for k in range(gamma)] for m in range(length)]
        budget = rng.choice([length, length - 2, 11])
        result = decode(target, MatrixDrafter(continuation, matches, 2, 16), policies.DraftingPolicy(gamma), prompt,
                        budget, Sampler(), set())
        assert result.new_token_ids == continuation[:budget]
        assert result.rounds[0].drafted == 0 and result.rounds[0].new_tokens == 1
        engine = [(r.drafted, r.accepted, r.new_tokens) for r in result.rounds[1:]]
        assert [tuple(r) for r in simulate_rounds(matches, gamma, budget)] == engine, trial
