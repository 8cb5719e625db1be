"""Notebook 02's teaching implementation of speculative sampling, run straight out of the notebook.

The cells marked `# teaching implementation` (`draw`, `verify_draft`) must give exactly the tokens of
`specdec_utils.core.sampling.rejection_sample` from the same random numbers, and be exact in distribution
by a check that a wrong rule (always accept, or resample from p) cannot pass by luck.
"""
import math

import pytest
import torch

from specdec_utils.core.sampling import rejection_sample, sample_token, warp_logits
from specdec_utils.exactness import chi_square_p_value, total_variation

from conftest import teaching_namespace

NOTEBOOK = "02_speculative_sampling.ipynb"
TRIALS = 4_000
MIN_P_VALUE = 1e-3  # the course's chi-square test (specdec_utils.exactness); the wrong rules score < 1e-10


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def notebook():
    """The namespace left by executing the notebook's teaching-implementation cells (and nothing else)."""
    return teaching_namespace(NOTEBOOK, {"torch": torch})


def sample_drafts(draft_probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.tensor([sample_token(row, generator) for row in draft_probs], dtype=torch.long)


@pytest.mark.parametrize("warp", [{}, {"temperature": 0}, {"top_k": 2}, {"temperature": 0.6, "top_p": 0.7}])
@pytest.mark.parametrize("relation", ["independent", "equal", "disjoint"])
def test_teaching_code_equals_the_package_bit_for_bit(notebook, warp, relation):
    verify_draft = notebook["verify_draft"]
    cases = torch.Generator().manual_seed(0)
    for trial in range(60):
        k, vocab = trial % 5, (2, 7, 40)[trial % 3]
        draft_logits = 2 * torch.randn(k, vocab, generator=cases)
        target_logits = 2 * torch.randn(k + 1, vocab, generator=cases)
        if relation == "equal":
            target_logits[:k] = draft_logits
        elif relation == "disjoint":  # the draft proposes from the first half, the target from the rest
            draft_logits[:, vocab // 2:] = -math.inf
            target_logits[:, :vocab // 2] = -math.inf
        draft_probs, target_probs = warp_logits(draft_logits, **warp), warp_logits(target_logits, **warp)
        draft_tokens = sample_drafts(draft_probs, cases)
        ours, theirs = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        out = verify_draft(draft_probs, target_probs, draft_tokens, ours)
        assert torch.equal(out, rejection_sample(draft_probs, target_probs, draft_tokens, theirs))
        assert torch.equal(ours.get_state(), theirs.get_state())
        assert out.dtype == torch.long and 1 <= len(out) <= k + 1
        assert torch.equal(out[:-1], draft_tokens[:len(out) - 1])


def test_teaching_code_handles_an_empty_residual(notebook):
    """Unnormalized p <= q (a caller's rounding): a rejection must fall back to p, not divide 0/0."""
    draft_probs = torch.tensor([[0.5, 0.5, 0.0]])
    target_probs = torch.tensor([[0.25, 0.25, 0.0], [0.0, 0.0, 1.0]])
    generator = torch.Generator().manual_seed(0)
    outputs = {tuple(notebook["verify_draft"](draft_probs, target_probs, torch.tensor([0]), generator).tolist())
               for _ in range(200)}
    assert outputs == {(0,), (1,), (0, 2)}


def first_two_tokens(rule, draft_probs, target_probs, seed=0):
    """Run `rule` TRIALS times with drafts x_i ~ q_i; return the counts of the first emitted token and
    of the second one in the rounds that emitted at least two."""
    generator = torch.Generator().manual_seed(seed)
    vocab = draft_probs.shape[1]
    outputs = [rule(draft_probs, target_probs, sample_drafts(draft_probs, generator), generator)
               for _ in range(TRIALS)]
    first = torch.bincount(torch.stack([out[0] for out in outputs]), minlength=vocab)
    second = torch.bincount(torch.stack([out[1] for out in outputs if len(out) > 1]), minlength=vocab)
    return first, second


def always_accept(draft_probs, target_probs, draft_tokens, generator):
    return torch.cat([draft_tokens, torch.multinomial(target_probs[-1], 1, generator=generator)])


def resample_from_p(draft_probs, target_probs, draft_tokens, generator):
    """The rule with the planted bug of exercise 1: after a rejection, draw from p, not the residual."""
    for i, x in enumerate(draft_tokens.tolist()):
        if torch.rand((), generator=generator) * draft_probs[i, x] >= target_probs[i, x]:
            return torch.cat([draft_tokens[:i], torch.multinomial(target_probs[i], 1, generator=generator)])
    return torch.cat([draft_tokens, torch.multinomial(target_probs[-1], 1, generator=generator)])


DRAFT_PROBS = torch.tensor([[0.05, 0.40, 0.30, 0.05, 0.10, 0.10],
                            [0.30, 0.05, 0.05, 0.40, 0.10, 0.10]])
TARGET_PROBS = torch.tensor([[0.35, 0.10, 0.10, 0.25, 0.05, 0.15],
                             [0.05, 0.40, 0.30, 0.05, 0.10, 0.10],
                             [1 / 6] * 6])


@pytest.mark.stat
def test_teaching_code_follows_the_target_distribution(notebook):
    """Leviathan et al. 2023, Appendix A.1 (Chen et al. 2023, Theorem 1), with the induction over positions:
    the first token follows p_1, the second p_2, although the
    draft is far from both (the targets here do not depend on the prefix).
    4,000 rounds detect TV >= 0.043 on the first token and 0.063 on the second (from the ~1,800 rounds
    that accept the first draft): 90% power at alpha 1e-3, worst direction (`exactness.min_detectable_tv`)."""
    first, second = first_two_tokens(notebook["verify_draft"], DRAFT_PROBS, TARGET_PROBS)
    assert chi_square_p_value(first, TARGET_PROBS[0]) > MIN_P_VALUE, total_variation(first, TARGET_PROBS[0])
    assert chi_square_p_value(second, TARGET_PROBS[1]) > MIN_P_VALUE, total_variation(second, TARGET_PROBS[1])


@pytest.mark.stat
@pytest.mark.parametrize("wrong_rule", [always_accept, resample_from_p])
def test_the_exactness_check_fails_wrong_rules(wrong_rule):
    assert total_variation(DRAFT_PROBS[0], TARGET_PROBS[0]) > 0.4
    first, _ = first_two_tokens(wrong_rule, DRAFT_PROBS, TARGET_PROBS)
    assert chi_square_p_value(first, TARGET_PROBS[0]) < 1e-10
