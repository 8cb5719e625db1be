"""The course's statistics helpers (specdec_utils.exactness): one chi-square test and one total variation for
counters and tensors alike, and the resolution estimate quoted next to every distributional test."""
from collections import Counter

import pytest
import torch

from specdec_utils.exactness import chi_square_p_value, min_detectable_tv, total_variation


def test_tensors_and_mappings_give_the_same_answers():
    probs = torch.tensor([0.2, 0.0, 0.5, 0.3], dtype=torch.float64)
    counts = torch.tensor([25, 0, 40, 35])
    as_dicts = Counter({0: 25, 2: 40, 3: 35}), dict(enumerate(probs.tolist()))
    assert chi_square_p_value(counts, probs) == pytest.approx(chi_square_p_value(*as_dicts), abs=1e-15)
    assert 1e-3 < chi_square_p_value(counts, probs) < 0.5
    assert total_variation(counts, probs) == pytest.approx(0.1) == pytest.approx(total_variation(*as_dicts))
    assert total_variation(probs, probs) == 0.0


def test_an_impossible_outcome_fails_and_one_cell_tests_nothing():
    probs = torch.tensor([0.2, 0.0, 0.5, 0.3])
    assert chi_square_p_value(torch.tensor([20, 1, 50, 30]), probs) == 0.0    # probability 0, observed once
    assert chi_square_p_value(Counter({(1, 2): 30, (9,): 1}), {(1, 2): 0.5, (2, 1): 0.5}) == 0.0  # not in probs
    assert chi_square_p_value(Counter({"x": 50}), {"x": 1.0}) == 1.0            # a single cell


def test_min_detectable_tv_matches_the_normal_approximation():
    """Two equally likely outcomes: the statistic is ((2 sqrt(n) delta + Z)^2), so 90% power at alpha 1e-3
    needs 2 sqrt(n) delta = z(0.9995) + z(0.9) = 3.29 + 1.28: delta = 0.072 at n = 1,000."""
    assert min_detectable_tv(2, 1000, simulations=200) == pytest.approx(0.072, abs=0.008)
    assert min_detectable_tv(2, 4000, simulations=200) == pytest.approx(0.036, abs=0.005)  # 1 / sqrt(n)
    assert min_detectable_tv(10, 20) == float("inf")  # every outcome expected < 5 times: one pooled cell
