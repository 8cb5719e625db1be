"""Tests for specdec_utils.core.sampling: logit warping and lossless speculative (rejection) sampling.

The statistical tests (marked `stat`) use fixed seeds, so they are deterministic; each checks a
distribution with the course's Pearson chi-square test (`specdec_utils.exactness`), and two planted bugs
(a residual replaced by p, and a residual mixed 5% with p) prove the check has teeth. Next to each test:
the smallest bias (total variation, in the worst direction) it detects with 90% power at alpha 1e-3,
from `exactness.min_detectable_tv` run once on its exact distribution and trial count.
"""
import math

import pytest
import torch

from specdec_utils.core import sampling
from specdec_utils.core.sampling import rejection_sample, sample_token, warp_logits
from specdec_utils.exactness import chi_square_p_value

TRIALS = 8_000
MIN_P_VALUE = 1e-3  # a correct sampler passes; the planted bug below scores far below 1e-10


# ---------------------------------------------------------------------------------- helpers
def accepted_length_probs(draft_probs: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """P(n accepted) for n = 0..k when each x_i ~ q_i independently: position i is accepted with
    alpha_i = sum_x min(p_i(x), q_i(x)) (Leviathan et al. 2023, Definition 3.1)."""
    alphas = torch.minimum(draft_probs, target_probs[:-1]).sum(-1).double()
    reach = torch.cat([torch.ones(1, dtype=torch.float64), alphas.cumprod(0)])  # P(n >= i)
    return reach - torch.cat([reach[1:], torch.zeros(1, dtype=torch.float64)])


def residual_probs(target_row: torch.Tensor, draft_row: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what a rejection must emit (Leviathan et al. 2023, Sec. 2.3), computed here,
    not by the code under test."""
    rest = (target_row.double() - draft_row.double()).clamp(min=0)
    return rest / rest.sum()


def speculative_p_values(draft_probs, target_probs, trials=TRIALS, seed=0) -> dict[str, float]:
    """Run rejection_sample `trials` times on fixed rows (k >= 1, draft tokens x_i ~ q_i) and
    test: the first emitted token ~ p_0; the second, given the first draft was accepted, ~ p_1;
    the number of accepted tokens ~ accepted_length_probs; and the token emitted after a rejection
    of the first draft ~ the residual norm(max(0, p_0 - q_0)): a low-dimensional summary that sees a
    residual off by a few percent, which the first-token marginal dilutes by P(rejection)."""
    generator = torch.Generator().manual_seed(seed)
    k, vocab = draft_probs.shape
    drafts = torch.multinomial(draft_probs, trials, replacement=True, generator=generator).T
    outputs = [rejection_sample(draft_probs, target_probs, x, generator).tolist() for x in drafts]
    first = torch.tensor([out[0] for out in outputs])
    second = torch.tensor([out[1] for out in outputs if len(out) > 1])
    after_rejection = torch.tensor([out[0] for out in outputs if len(out) == 1])  # the first draft rejected
    lengths = torch.tensor([len(out) for out in outputs])
    return {
        "first token": chi_square_p_value(torch.bincount(first, minlength=vocab), target_probs[0]),
        "accepted count": chi_square_p_value(torch.bincount(lengths - 1, minlength=k + 1),
                                             accepted_length_probs(draft_probs, target_probs)),
        "second token": chi_square_p_value(torch.bincount(second, minlength=vocab),
                                           target_probs[1]),
        "after a rejection": chi_square_p_value(torch.bincount(after_rejection, minlength=vocab),
                                                residual_probs(target_probs[0], draft_probs[0])),
    }


def random_rows(rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Random distributions [rows, vocab], peaked enough that two draws differ clearly."""
    return (1.5 * torch.randn(rows, vocab, generator=generator)).softmax(-1)


def greedy_reference(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> list[int]:
    """Greedy verification: accept while the draft token is the target's argmax, then add the
    target's argmax at the first mismatch (or after the last draft token)."""
    target_choice = target_logits.argmax(-1).tolist()
    out = []
    for token, choice in zip(draft_tokens.tolist(), target_choice):
        if token != choice:
            break
        out.append(token)
    return out + [target_choice[len(out)]]


# --------------------------------------------------------------------------------- warp_logits
def test_warp_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
    for temperature in (0.5, 1.0, 2.0):
        expected = (logits / temperature).softmax(-1)
        torch.testing.assert_close(warp_logits(logits, temperature), expected)
    assert warp_logits(logits, 2.0).max() < warp_logits(logits, 0.5).max()  # hotter = flatter


def test_warp_output_is_float32_probabilities_of_the_same_shape():
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0)).half()
    probs = warp_logits(logits, temperature=0.7, top_k=4, top_p=0.9)
    assert probs.shape == logits.shape and probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3))


def test_warp_top_k_keeps_the_k_largest():
    logits = torch.tensor([1.0, 4.0, 2.0, 3.0])
    kept = torch.tensor([0.0, math.exp(4.0), 0.0, math.exp(3.0)])
    torch.testing.assert_close(warp_logits(logits, top_k=2), kept / kept.sum())
    assert warp_logits(logits, top_k=10).gt(0).all()  # k >= V keeps everything
    assert warp_logits(torch.tensor([1.0, 3.0, 3.0, 0.0]), top_k=1).gt(0).tolist() == [
        False, True, True, False]  # ties with the k-th largest are kept


@pytest.mark.parametrize("top_p, kept", [(0.3, [0]), (0.6, [0, 1]), (0.74, [0, 1]),
                                         (0.8, [0, 1, 3]), (0.95, [0, 1, 2, 3]),
                                         (1.0, [0, 1, 2, 3])])
def test_warp_top_p_keeps_the_smallest_set_reaching_top_p(top_p, kept):
    target = torch.tensor([0.5, 0.25, 0.1, 0.15])  # cumulative, sorted: .5 .75 .9 1
    probs = warp_logits(target.log(), top_p=top_p)
    assert probs.nonzero().flatten().tolist() == kept
    torch.testing.assert_close(probs[kept], target[kept] / target[kept].sum())


def test_warp_top_p_stops_as_soon_as_the_mass_equals_top_p():
    logits = torch.tensor([4.0, 2.0, 1.0, 1.0]).log()  # softmax is exactly .5 .25 .125 .125
    assert warp_logits(logits, top_p=0.5).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert warp_logits(logits, top_p=0.75).gt(0).tolist() == [True, True, False, False]


def test_warp_top_p_breaks_ties_towards_the_lowest_index():
    probs = warp_logits(torch.tensor([1.0, 2.0, 2.0, 0.0]), top_p=0.3)
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_warp_applies_top_k_before_top_p():
    target = torch.tensor([0.4, 0.3, 0.2, 0.1])
    # After top_k=2 the renormalized masses are 4/7 and 3/7, so top_p=0.5 keeps only the first.
    assert warp_logits(target.log(), top_k=2, top_p=0.5).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_warp_temperature_zero_is_a_one_hot_argmax():
    logits = torch.tensor([[0.1, 2.0, 2.0, -1.0], [3.0, -math.inf, 0.0, 1.0]])
    expected = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])  # ties: lowest index
    assert torch.equal(warp_logits(logits, temperature=0), expected)
    assert torch.equal(warp_logits(logits, temperature=0, top_k=3, top_p=0.5), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.5, 0, 0.9),
                                                       (2.0, 2, 1.0), (1e-6, 0, 1.0)])
def test_warp_masked_logits_get_zero_probability(dtype, temperature, top_k, top_p):
    lowest = torch.finfo(dtype).min
    logits = torch.tensor([2.0, -math.inf, 1.0, lowest, 0.5], dtype=dtype)
    probs = warp_logits(logits, temperature, top_k, top_p)
    assert not probs.isnan().any()
    assert probs[1] == 0 and probs[3] == 0
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0))


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -0.5}, r"temperature.*>= 0"),
    ({"temperature": math.inf}, r"temperature.*finite"),
    ({"temperature": math.nan}, r"temperature.*finite"),
    ({"top_k": -1}, r"top_k.*>= 0"),
    ({"top_k": 2.5}, r"top_k.*integer"),
    ({"top_p": 0.0}, r"top_p.*\(0, 1\]"),
    ({"top_p": 1.5}, r"top_p.*\(0, 1\]"),
    ({"top_p": math.nan}, r"top_p.*\(0, 1\]"),
    # the executors' rules (`core.checks`): a positive temperature below 1e-6 (1e-46 rounds to 0 in float32: the warp
    # gave NaN), and a bool where a number is asked (True was taken as 1)
    ({"temperature": 1e-9}, r"temperature.*>= 1e-6"),
    ({"temperature": 1e-46}, r"temperature.*>= 1e-6"),
    ({"temperature": True}, r"temperature must be .*got True"),
    ({"top_k": True}, r"top_k must be an integer >= 0 .*got True"),
    ({"top_p": True}, r"top_p must be .*got True"),
])
def test_warp_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        warp_logits(torch.zeros(4), **kwargs)


def test_warp_takes_numpy_numbers_as_the_executors_do():
    import numpy as np
    logits = torch.tensor([1.0, 2.0, 3.0])
    assert torch.equal(warp_logits(logits, np.float64(0.5), np.int64(2), np.float32(0.9)),
                       warp_logits(logits, 0.5, 2, 0.9))


def hf_warp(logits, temperature, top_k, top_p):
    """transformers' warpers in generate's order (temperature, top-k, top-p), then softmax."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    scores = TemperatureLogitsWarper(temperature)(None, logits.float().reshape(-1, logits.shape[-1]))
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(-1).reshape(logits.shape)


def test_warp_agrees_with_transformers_warpers_away_from_ties():
    """Random continuous logits (no ties), any temperature, top_k up to past V, any top_p: the same
    distributions as transformers' TemperatureLogitsWarper / TopKLogitsWarper / TopPLogitsWarper."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(400):
        vocab = int(torch.randint(2, 50, (1,), generator=generator))
        logits = torch.randn(3, vocab, generator=generator) * 3
        temperature = float(torch.rand((), generator=generator)) * 2 + 0.05
        top_k = int(torch.randint(0, vocab + 5, (1,), generator=generator))  # 0 (off) .. past V
        top_p = float(torch.rand((), generator=generator)) * 0.99 + 0.01
        torch.testing.assert_close(warp_logits(logits, temperature, top_k, top_p),
                                   hf_warp(logits, temperature, top_k, top_p), rtol=1e-5, atol=1e-6)


def test_warp_departs_from_transformers_at_top_p_ties_and_tiny_temperatures():
    """Why warp_logits does not call transformers' warpers (its docstring): ties across the top-p
    boundary keep the lowest indices here and the highest there (the same number of tokens, the same
    mass), and transformers' temperature overflows to NaN at a tiny temperature, which ours refuses in
    one line (below 1e-6, the executors' rule); at the smallest one allowed ours is the one-hot argmax."""
    tied = torch.tensor([1.0, 2.0, 2.0, 0.0])
    assert warp_logits(tied, top_p=0.3).tolist() == [0.0, 1.0, 0.0, 0.0]
    assert hf_warp(tied, 1.0, 0, 0.3).tolist() == [0.0, 0.0, 1.0, 0.0]
    flat = torch.zeros(4)
    assert warp_logits(flat, top_p=0.5).tolist() == [0.5, 0.5, 0.0, 0.0]
    assert hf_warp(flat, 1.0, 0, 0.5).tolist() == [0.0, 0.0, 0.5, 0.5]
    assert sorted(warp_logits(tied, top_p=0.3).tolist()) == sorted(hf_warp(tied, 1.0, 0, 0.3).tolist())
    logits = torch.tensor([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"temperature.*>= 1e-6"):
        warp_logits(logits, temperature=1e-39)
    assert hf_warp(logits, 1e-39, 0, 1.0).isnan().all()
    assert warp_logits(logits, temperature=1e-6).tolist() == [0.0, 0.0, 1.0]


# -------------------------------------------------------------------------------- sample_token
@pytest.mark.stat
def test_sample_token_follows_probs_and_is_reproducible():  # detects TV >= 0.043 (3,000 draws, 3 tokens)
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    generator = torch.Generator().manual_seed(0)
    draws = [sample_token(probs, generator) for _ in range(3000)]
    assert all(isinstance(token, int) for token in draws)
    assert chi_square_p_value(torch.bincount(torch.tensor(draws), minlength=4), probs) > MIN_P_VALUE
    replay = torch.Generator().manual_seed(0)
    assert [sample_token(probs, replay) for _ in range(3000)] == draws


def test_sample_token_needs_a_vector():
    with pytest.raises(ValueError, match=r"probs.*1-D"):
        sample_token(torch.full((1, 4), 0.25))


# ---------------------------------------------------------------------------- rejection_sample
@pytest.mark.stat
@pytest.mark.parametrize("k, vocab, seed", [(1, 6, 1), (2, 8, 2), (3, 10, 3)])
def test_rejection_sample_is_exact(k, vocab, seed):
    # 8,000 rounds detect TV >= 0.030-0.033 on the first token, 0.027-0.028 on the accepted count,
    # 0.038-0.060 on the second token and 0.027-0.040 after a rejection (over the three cases)
    generator = torch.Generator().manual_seed(100 + seed)
    draft_probs = random_rows(k, vocab, generator)
    target_probs = random_rows(k + 1, vocab, generator)
    p_values = speculative_p_values(draft_probs, target_probs, seed=seed)
    assert min(p_values.values()) > MIN_P_VALUE, p_values


@pytest.mark.stat
def test_check_catches_a_wrong_residual(monkeypatch):
    """Planted bug: after a rejection, sample from p instead of norm(max(0, p - q))."""
    generator = torch.Generator().manual_seed(7)
    draft_probs, target_probs = random_rows(2, 8, generator), random_rows(3, 8, generator)
    assert min(speculative_p_values(draft_probs, target_probs, trials=2000).values()) > MIN_P_VALUE
    monkeypatch.setattr(sampling, "_residual_distribution", lambda target_row, _: target_row)
    p_values = speculative_p_values(draft_probs, target_probs, trials=2000)
    assert p_values["first token"] < 1e-10 and p_values["second token"] < 1e-10, p_values


def mixed_residual(mix: float):
    """A residual off by a little: (1 - mix) norm(max(0, p - q)) + mix p."""
    real = sampling._residual_distribution

    def mixed(target_row, draft_row):
        rest = real(target_row, draft_row)
        return (1 - mix) * rest / rest.sum() + mix * target_row / target_row.sum()
    return mixed


@pytest.mark.stat
def test_check_catches_a_residual_mixed_5_percent_with_p(monkeypatch):
    """Planted small bug: the residual mixed 5% with p. The first-token marginal moves by only
    0.05 P(reject) TV(p, residual) = 0.05 * 0.32 * 0.21 = TV 0.0035 here, far under what 8,000 rounds
    resolve (0.03); the token after a rejection moves by 0.05 TV(p, residual), partly (0.97% of its mass,
    ~25 of the ~2,600 rejections) onto tokens the residual never emits (p <= q there), which the
    chi-square test counts as impossible."""
    generator = torch.Generator().manual_seed(7)
    draft_probs, target_probs = random_rows(2, 8, generator), random_rows(3, 8, generator)
    monkeypatch.setattr(sampling, "_residual_distribution", mixed_residual(0.05))
    p_values = speculative_p_values(draft_probs, target_probs)
    assert p_values["after a rejection"] < 1e-10, p_values


def test_rejection_sample_output_shape_and_prefix():
    generator = torch.Generator().manual_seed(0)
    k, vocab = 4, 6
    draft_probs = random_rows(k, vocab, generator)
    target_probs = random_rows(k + 1, vocab, generator)
    lengths = set()
    for _ in range(300):
        draft_tokens = torch.multinomial(draft_probs, 1, generator=generator).squeeze(1)
        out = rejection_sample(draft_probs, target_probs, draft_tokens, generator)
        assert out.dtype == torch.int64 and out.ndim == 1 and 1 <= len(out) <= k + 1
        assert torch.equal(out[:-1], draft_tokens[:len(out) - 1])
        lengths.add(len(out))
    assert lengths == set(range(1, k + 2))


def test_rejection_sample_is_reproducible_with_a_seed():
    rows = torch.Generator().manual_seed(0)
    draft_probs, target_probs = random_rows(3, 8, rows), random_rows(4, 8, rows)
    draft_tokens = torch.tensor([1, 5, 2])

    def run(seed):
        generator = torch.Generator().manual_seed(seed)
        return [rejection_sample(draft_probs, target_probs, draft_tokens, generator).tolist()
                for _ in range(50)]

    assert run(0) == run(0)
    assert run(0) != run(1)


@pytest.mark.stat
def test_rejection_sample_with_k_zero_emits_one_token_from_p0():  # detects TV >= 0.054 (2,000 draws, 3 tokens)
    generator = torch.Generator().manual_seed(0)
    target_probs = torch.tensor([[0.2, 0.0, 0.5, 0.3]])
    no_drafts, no_probs = torch.empty(0, dtype=torch.long), torch.empty(0, 4)
    outputs = [rejection_sample(no_probs, target_probs, no_drafts, generator) for _ in range(2000)]
    assert all(len(out) == 1 for out in outputs)
    counts = torch.bincount(torch.cat(outputs), minlength=4)
    assert chi_square_p_value(counts, target_probs[0]) > MIN_P_VALUE


def test_rejection_sample_accepts_everything_when_draft_equals_target():
    generator = torch.Generator().manual_seed(0)
    probs = random_rows(4, 8, generator)
    for _ in range(200):
        draft_tokens = torch.multinomial(probs[:3], 1, generator=generator).squeeze(1)
        out = rejection_sample(probs[:3], probs, draft_tokens, generator)
        assert len(out) == 4 and torch.equal(out[:3], draft_tokens)


@pytest.mark.stat
def test_rejection_sample_disjoint_supports_reject_at_once_and_emit_from_p():  # detects TV >= 0.054
    draft_probs = torch.tensor([[0.5, 0.3, 0.2, 0.0, 0.0, 0.0]] * 2)
    target_probs = torch.tensor([[0.0, 0.0, 0.0, 0.2, 0.3, 0.5]] * 3)
    generator = torch.Generator().manual_seed(0)
    outputs = [rejection_sample(draft_probs, target_probs, torch.tensor([0, 1]), generator)
               for _ in range(2000)]
    assert all(len(out) == 1 for out in outputs)
    counts = torch.bincount(torch.cat(outputs), minlength=6)
    assert chi_square_p_value(counts, target_probs[0]) > MIN_P_VALUE


def test_rejection_sample_edge_cases_of_zero_probability():
    generator = torch.Generator().manual_seed(0)
    target_probs = torch.tensor([[0.0, 0.5, 0.5], [0.0, 0.5, 0.5]])
    for _ in range(500):
        # p(x) = 0: never accepted, whatever q(x) and u are.
        never = rejection_sample(torch.tensor([[1.0, 0.0, 0.0]]), target_probs, torch.tensor([0]),
                                 generator)
        assert len(never) == 1 and never.item() in (1, 2)
        # q(x) = 0 < p(x) (a caller bug): the ratio is infinite, so x is accepted.
        always = rejection_sample(torch.tensor([[1.0, 0.0, 0.0]]), target_probs, torch.tensor([1]),
                                  generator)
        assert len(always) == 2 and always[0] == 1


def test_rejection_sample_falls_back_to_p_when_the_residual_is_empty():
    # Unnormalized p <= q everywhere: a rejection is possible but max(0, p - q) has no mass.
    generator = torch.Generator().manual_seed(0)
    draft_probs = torch.tensor([[0.5, 0.5, 0.0]])
    target_probs = torch.tensor([[0.25, 0.25, 0.0], [0.0, 0.0, 1.0]])
    outputs = [rejection_sample(draft_probs, target_probs, torch.tensor([0]), generator).tolist()
               for _ in range(200)]
    assert {tuple(out) for out in outputs} == {(0,), (1,), (0, 2)}


def test_rejection_sample_at_temperature_zero_is_greedy_verification():
    generator = torch.Generator().manual_seed(0)
    k, vocab = 4, 5
    for _ in range(300):
        draft_logits = torch.randn(k, vocab, generator=generator)
        # Targets close to the draft so that long accepted runs happen too.
        target_logits = torch.cat([draft_logits, torch.randn(1, vocab, generator=generator)])
        target_logits += 0.7 * torch.randn(k + 1, vocab, generator=generator)
        draft_tokens = draft_logits.argmax(-1)
        out = rejection_sample(warp_logits(draft_logits, temperature=0),
                               warp_logits(target_logits, temperature=0), draft_tokens, generator)
        assert out.tolist() == greedy_reference(draft_tokens, target_logits)


FOUR_ZEROS = torch.zeros(4, dtype=torch.long)


@pytest.mark.parametrize("draft_shape, target_shape, tokens, message", [
    ((4, 6), (4, 6), FOUR_ZEROS, r"target_probs.*k\+1=5"),
    ((3, 6), (5, 6), FOUR_ZEROS, r"draft_probs.*k=4"),
    ((4, 6), (5, 7), FOUR_ZEROS, r"vocabulary.*6 and 7"),
    ((4, 6), (5,), FOUR_ZEROS, r"target_probs.*2-D"),
    ((4, 6), (5, 6), FOUR_ZEROS.float(), r"draft_tokens.*int64"),
    ((4, 6), (5, 6), FOUR_ZEROS[None], r"draft_tokens.*1-D"),
    ((4, 6), (5, 6), torch.tensor([0, 1, 6, 2]), r"draft_tokens.*\[0, 6\)"),
    ((4, 6), (5, 6), torch.tensor([0, -1, 2, 2]), r"draft_tokens.*\[0, 6\)"),
])
def test_rejection_sample_rejects_bad_inputs(draft_shape, target_shape, tokens, message):
    with pytest.raises(ValueError, match=message):
        rejection_sample(torch.full(draft_shape, 0.1), torch.full(target_shape, 0.1), tokens)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rejection_sample_gives_the_same_tokens_on_cuda():
    rows = torch.Generator().manual_seed(0)
    draft_probs, target_probs = random_rows(3, 50, rows), random_rows(4, 50, rows)
    draft_tokens = torch.multinomial(draft_probs, 1, generator=rows).squeeze(1)

    def run(device):
        generator = torch.Generator().manual_seed(0)
        args = (draft_probs.to(device), target_probs.to(device), draft_tokens.to(device))
        return [rejection_sample(*args, generator) for _ in range(100)]

    on_cpu, on_cuda = run("cpu"), run("cuda")
    assert all(out.device.type == "cuda" for out in on_cuda)
    assert [out.tolist() for out in on_cpu] == [out.tolist() for out in on_cuda]
