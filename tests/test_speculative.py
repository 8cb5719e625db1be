"""Tests of specdec_utils.speculative: greedy speculative decoding is token-identical to greedy
decoding, speculative sampling follows the target's distribution, the KV caches roll back right,
and bad arguments fail clearly. Tiny random models keep it fast; one slow test uses the real target.
"""
import copy
import math

import pytest
import torch

from specdec_utils.core.sampling import warp_logits
from specdec_utils.exactness import chi_square_p_value, total_variation
from specdec_utils.models import UnknownModelError, load_model
from specdec_utils.prompts import eval_subset, format_prompt
from specdec_utils.speculative import autoregressive_generate, speculative_generate

from conftest import TINY_VOCAB, noisy_copy, random_model, random_prompt

VOCAB = TINY_VOCAB
MAX_NEW_TOKENS = 29  # not a multiple of any gamma > 1 below
GAMMAS = (1, 2, 4, 7)
FAMILIES = ("tiny-llama", "tiny-gpt2")


pytestmark = pytest.mark.usefixtures("single_thread")


PROMPTS = [random_prompt(length, seed) for seed, length in enumerate((1, 6, 17))]


@pytest.fixture(scope="module", params=FAMILIES)
def models(request):
    """target, plus two drafts: an unrelated model (mostly rejected) and a close one."""
    target = random_model(request.param, seed=0)
    return {"target": target, "unrelated": random_model(request.param, seed=1),
            "close": noisy_copy(target, noise=0.01, seed=2)}


# --- greedy: token-identical to the target's own greedy decoding ------------------------------

@pytest.mark.parametrize("draft_kind", ["unrelated", "close"])
@pytest.mark.parametrize("gamma", GAMMAS)
def test_greedy_speculative_equals_greedy_decoding(models, draft_kind, gamma):
    target, draft = models["target"], models[draft_kind]
    for input_ids in PROMPTS:
        expected = autoregressive_generate(target, input_ids, MAX_NEW_TOKENS)
        assert expected.target_calls == MAX_NEW_TOKENS
        result = speculative_generate(target, draft, input_ids, MAX_NEW_TOKENS, gamma=gamma)
        assert result.new_token_ids == expected.new_token_ids
        assert sum(result.accepted_per_position) == result.accepted <= result.drafted
        assert result.accepted_per_position == sorted(result.accepted_per_position, reverse=True)
        assert result.drafted == result.draft_calls < MAX_NEW_TOKENS * gamma
        # Every round emits its accepted tokens plus one.
        assert len(result.new_token_ids) == result.accepted + result.target_calls


def test_the_close_draft_is_partly_accepted(models):
    """Guards the test above: the close draft must exercise both acceptance and rollback."""
    result = speculative_generate(models["target"], models["close"], PROMPTS[1], MAX_NEW_TOKENS, gamma=4)
    assert 0.3 < result.acceptance_rate < 1.0


@pytest.mark.parametrize("gamma", GAMMAS)
def test_greedy_stops_after_eos(models, gamma):
    target, draft = models["target"], models["close"]
    free_run = autoregressive_generate(target, PROMPTS[1], MAX_NEW_TOKENS).new_token_ids
    eos = free_run[10]
    expected = free_run[:free_run.index(eos) + 1]
    assert autoregressive_generate(target, PROMPTS[1], MAX_NEW_TOKENS, eos_token_id=eos).new_token_ids == expected
    result = speculative_generate(target, draft, PROMPTS[1], MAX_NEW_TOKENS, gamma=gamma, eos_token_id=[eos])
    assert result.new_token_ids == expected


@pytest.mark.parametrize("max_new_tokens", [1, 2, 4, 5, 6, 11])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_identical_draft_is_always_accepted(models, max_new_tokens, temperature):
    """A draft equal to the target (with its own cache) is always accepted; this also shows that
    the draft's cache misses no token after fully accepted rounds. The first target pass is the
    prefill and verifies the first gamma drafts, so each pass yields gamma + 1 tokens."""
    target, gamma = models["target"], 4
    draft = copy.deepcopy(target)
    result = speculative_generate(target, draft, PROMPTS[2], max_new_tokens, gamma=gamma,
                                  temperature=temperature, generator=torch.Generator().manual_seed(0))
    assert len(result.new_token_ids) == max_new_tokens
    assert result.accepted == result.drafted == max_new_tokens - result.target_calls
    assert result.target_calls == math.ceil(max_new_tokens / (gamma + 1))


def test_forward_passes_are_counted_and_none_is_wasted(models):
    """Hooks count the real forward passes; each draft pass feeds at most 2 tokens after the
    prefill (its last proposal after a fully accepted round, then the newest token)."""
    target, draft = models["target"], models["close"]
    fed = {"target": [], "draft": []}
    hooks = [model.register_forward_hook(lambda module, args, kwargs, out, name=name: fed[name].append(
        kwargs["input_ids"].shape[1]), with_kwargs=True) for name, model in (("target", target), ("draft", draft))]
    try:
        result = speculative_generate(target, draft, PROMPTS[2], MAX_NEW_TOKENS, gamma=4)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(fed["target"]) == result.target_calls and len(fed["draft"]) == result.draft_calls
    assert fed["draft"][0] == PROMPTS[2].shape[1] and max(fed["draft"][1:]) <= 2
    assert fed["target"][0] == PROMPTS[2].shape[1] + 4 and max(fed["target"][1:]) <= 5


# --- sampling ---------------------------------------------------------------------------------

@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sampling_is_reproducible_with_a_seeded_generator(models, top_p):
    target, draft = models["target"], models["unrelated"]

    def run(seed):
        return speculative_generate(target, draft, PROMPTS[1], MAX_NEW_TOKENS, gamma=3, temperature=1.0,
                                    top_p=top_p, generator=torch.Generator().manual_seed(seed)).new_token_ids

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_sampling_stops_after_eos(models):
    target, draft = models["target"], models["close"]
    """With the same seed, a run with an EOS is the free run cut after the EOS's first occurrence
    (both runs draw the same random numbers up to there)."""

    def run(eos_token_id=None):
        return speculative_generate(target, draft, PROMPTS[1], MAX_NEW_TOKENS, gamma=4, temperature=1.0,
                                    eos_token_id=eos_token_id,
                                    generator=torch.Generator().manual_seed(0)).new_token_ids

    free_run = run()
    eos = free_run[10]
    assert run(eos) == free_run[:free_run.index(eos) + 1]


STAT_VOCAB = 16
STAT_TRIALS = 1500
MIN_P_VALUE = 1e-3  # the course's chi-square test (specdec_utils.exactness); a wrong draft is off by TV ~0.5


@torch.no_grad()
def exact_first_two_marginals(target, input_ids, **warp):
    """The target's own sampling distributions: the first token p(x1), and the second token's
    marginal sum_x1 p(x1) p(x2 | x1), by enumerating the tiny vocabulary."""
    first = warp_logits(target(input_ids=input_ids).logits[0, -1], **warp)
    continued = torch.cat([input_ids.repeat(STAT_VOCAB, 1), torch.arange(STAT_VOCAB)[:, None]], dim=1)
    second = first @ warp_logits(target(input_ids=continued).logits[:, -1], **warp)
    return first, second


@pytest.mark.stat
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_speculative_sampling_follows_the_target_distribution(top_p):
    """Leviathan et al. 2023, Theorem 3.5: the first and second generated tokens are distributed
    as under the target's own sampling, although the draft's distribution is far from it.
    1,500 generations detect TV >= 0.076-0.082 on either token (90% power, alpha 1e-3, worst direction;
    `exactness.min_detectable_tv`)."""
    target = random_model("tiny-llama", seed=0, vocab=STAT_VOCAB)
    draft = random_model("tiny-llama", seed=1, vocab=STAT_VOCAB)
    input_ids = random_prompt(5, seed=0, vocab=STAT_VOCAB)
    warp = {"temperature": 1.0, "top_p": top_p}
    first, second = exact_first_two_marginals(target, input_ids, **warp)
    draft_first = warp_logits(draft(input_ids=input_ids).logits[0, -1].detach(), **warp)
    assert total_variation(draft_first, first) > 0.3  # the test can tell a wrong distribution

    generator = torch.Generator().manual_seed(0)
    samples = torch.tensor([speculative_generate(target, draft, input_ids, 3, gamma=2, generator=generator,
                                                 **warp).new_token_ids[:2] for _ in range(STAT_TRIALS)])
    for position, exact in enumerate((first, second)):
        counts = torch.bincount(samples[:, position], minlength=STAT_VOCAB)
        assert chi_square_p_value(counts, exact) > MIN_P_VALUE, (position, total_variation(counts, exact))


@pytest.mark.stat
def test_autoregressive_sampling_follows_the_target_distribution():  # detects TV >= 0.081, as above
    target = random_model("tiny-llama", seed=0, vocab=STAT_VOCAB)
    input_ids = random_prompt(5, seed=0, vocab=STAT_VOCAB)
    first, second = exact_first_two_marginals(target, input_ids, temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    samples = torch.tensor([autoregressive_generate(target, input_ids, 2, temperature=1.0,
                                                    generator=generator).new_token_ids
                            for _ in range(STAT_TRIALS)])
    for position, exact in enumerate((first, second)):
        counts = torch.bincount(samples[:, position], minlength=STAT_VOCAB)
        assert chi_square_p_value(counts, exact) > MIN_P_VALUE, (position, total_variation(counts, exact))


# --- bad arguments ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"gamma": 0}, r"gamma.*>= 1"),
    ({"temperature": -0.5}, r"temperature.*>= 0"),
    ({"top_p": 0.0}, r"top_p.*\(0, 1\]"),
    ({"top_p": 1.5}, r"top_p.*\(0, 1\]"),
    ({"top_k": -1}, r"top_k.*>= 0"),
    ({"max_new_tokens": 0}, r"max_new_tokens.*>= 1"),
    ({"input_ids": PROMPTS[1].repeat(2, 1)}, "batch size 1"),
    ({"input_ids": PROMPTS[1][0]}, "batch size 1"),
])
def test_bad_arguments_are_rejected(kwargs, message):
    """The checks come before any model runs: one family is enough."""
    target = random_model("tiny-llama", seed=0)
    arguments = {"input_ids": PROMPTS[1], "max_new_tokens": 8, **kwargs}
    with pytest.raises(ValueError, match=message):
        speculative_generate(target, random_model("tiny-llama", seed=1), **arguments)
    if "gamma" not in kwargs:
        with pytest.raises(ValueError, match=message):
            autoregressive_generate(target, **arguments)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_with_another_vocabulary_is_rejected(temperature):
    target, draft = random_model("tiny-llama", seed=0), random_model("tiny-llama", seed=1, vocab=VOCAB // 2)
    with pytest.raises(ValueError, match=r"vocabulary.*128 and 256"):
        speculative_generate(target, draft, PROMPTS[1] % (VOCAB // 2), 8, temperature=temperature)


# --- the real target --------------------------------------------------------------------------

@pytest.mark.slow
def test_real_target_with_random_draft_equals_greedy_decoding():
    """SmolLM2-135M in float32 with a random tiny draft: almost every draft token is rejected, so
    every round rolls both caches back; the output must still equal greedy decoding."""
    try:
        target, tokenizer = load_model("smollm2-135m", device="cpu", dtype=torch.float32)
        draft, _ = load_model("tiny-llama", device="cpu", dtype=torch.float32)
    except UnknownModelError as err:
        pytest.skip(str(err))
    row = next(r for r in eval_subset() if r["chat"])
    input_ids = tokenizer(format_prompt(tokenizer, row), return_tensors="pt").input_ids
    expected = autoregressive_generate(target, input_ids, 48)
    result = speculative_generate(target, draft, input_ids, 48, gamma=4)
    assert result.new_token_ids == expected.new_token_ids
    assert result.target_calls > 24  # mostly rejections: about one token per target pass
