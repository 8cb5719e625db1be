"""The trainers' objectives (specdec_utils/objectives.py): the acceptance term is speculative sampling's
acceptance probability, computed here from its definition (accept a drafted x with min(1, p(x)/q(x))) and by running
the course's own accept/reject step; KL is KL; a bad name is refused with one line."""
import pytest
import torch

from specdec_utils import objectives
from specdec_utils.core.sampling import rejection_sample


def dists(seed, n=6, shape=(3,)):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(*shape, n, generator=g), -1)
    q = torch.softmax(2 * torch.randn(*shape, n, generator=g), -1)
    return p, q


@pytest.mark.parametrize("seed", range(5))
def test_acceptance_is_the_probability_that_speculative_sampling_accepts(seed):
    p, q = dists(seed)
    by_definition = (q * torch.clamp(p / q, max=1)).sum(-1)  # draw x from q, accept with min(1, p/q)
    assert torch.allclose(objectives.acceptance(p, q.log()), by_definition, atol=1e-6)
    assert torch.allclose(objectives.acceptance(p, q.log()), 1 - 0.5 * (p - q).abs().sum(-1), atol=1e-6)


def test_acceptance_matches_the_course_verifier_run_many_times():
    """The same number as the accept rate of `sampling.rejection_sample` over 20,000 one-token rounds (a planted
    bug, max instead of min, is 0.3 or more away: this test would fail on it)."""
    p, q = dists(7, shape=())
    g = torch.Generator().manual_seed(0)
    n, accepted = 20_000, 0
    target_probs = torch.stack([p, p])  # the round's p_0 and the distribution of the token after it
    for _ in range(n):
        x = torch.multinomial(q, 1, generator=g)
        accepted += len(rejection_sample(q[None], target_probs, x, generator=g)) == 2  # x kept, plus one more
    rate = accepted / n
    alpha = objectives.acceptance(p, q.log()).item()
    assert abs(rate - alpha) < 4 * (alpha * (1 - alpha) / n) ** 0.5 + 1e-3
    assert abs(torch.maximum(p, q).sum().item() - rate) > 0.3


def test_kl_and_the_objectives():
    p, q = dists(3)
    logq = q.log()
    assert torch.allclose(objectives.kl(p, logq), (p * (p.log() - logq)).sum(-1))
    assert torch.equal(objectives.per_position(p, logq, "kl"), objectives.kl(p, logq))
    lk = objectives.per_position(p, logq, "lk")
    assert torch.allclose(lk, -objectives.acceptance(p, logq).log())
    assert torch.allclose(objectives.per_position(p, logq, "kl+lk", weight=0.5), objectives.kl(p, logq) + 0.5 * lk)
    assert torch.allclose(objectives.per_position(p, p.log(), "lk"), torch.zeros(3), atol=1e-6)  # q = p: alpha 1


def test_the_acceptance_gradient_moves_mass_where_the_target_has_more():
    p, q = dists(11, shape=())
    logits = q.log().clone().requires_grad_(True)
    objectives.per_position(p, torch.log_softmax(logits, -1), "lk").backward()
    under = p > q  # descending the loss raises q where q < p
    assert (-logits.grad[under]).sum() > 0 > (-logits.grad[~under]).sum()


def test_an_unknown_objective_is_refused_with_one_line():
    p, q = dists(0)
    with pytest.raises(ValueError, match="unknown objective 'tv'; allowed: kl, lk, kl\\+lk"):
        objectives.per_position(p, q.log(), "tv")
