"""Tests of specdec_utils.theory: Leviathan et al. 2023, Eq. 1 and Theorem 3.8."""
import math

import numpy as np
import pytest
import torch

from specdec_utils.theory import (
    best_hierarchy_speedup,
    best_pair_speedup,
    expected_accepted_length,
    expected_speedup,
    expected_speedup_hierarchical,
    hierarchy_gain,
    middle_cost_per_token,
    optimal_gamma,
)


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
