"""Notebook 03's teaching implementations, run straight out of the notebook: the round-level policies must
choose the same gamma every round and give the same tokens as the package's policies
(`specdec_utils.core.policies`), greedy and sampled, and greedy output must equal the target's; the short greedy
decode loop (`decode_loop`, self-contained) must give the same tokens and rounds as the package's `engine.decode`
for every kind of round the notebook runs (plain decoding, fixed and adaptive gamma, the oracle)."""
import pytest
import torch

from specdec_utils import generate
from specdec_utils.core import engine, policies
from specdec_utils.core.policies import DraftingPolicy

from conftest import noisy_copy, random_model, random_prompt, teaching_namespace

NOTEBOOK = "03_adaptive_draft_length.ipynb"

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def notebook():
    from dataclasses import dataclass

    from specdec_utils import cache_length, trim_cache
    from specdec_utils.speculative import forward_uncached
    return teaching_namespace(NOTEBOOK, {"DraftingPolicy": DraftingPolicy, "engine": engine, "torch": torch,
                                         "dataclass": dataclass, "forward_uncached": forward_uncached,
                                         "trim_cache": trim_cache, "cache_length": cache_length}, min_cells=5)


@pytest.fixture(scope="module")
def models():
    target = random_model("tiny-llama", seed=0)
    return target, {"close": noisy_copy(target, noise=0.01, seed=1), "unrelated": random_model("tiny-llama", seed=2)}


@pytest.mark.parametrize("name, method, kwargs", [("HeuristicGamma", "adaptive-hf", {}),
                                                  ("DualSignalGamma", "adaptive-dual", {"entropy_threshold": 2.0})])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_notebook_policies_equal_the_package(notebook, models, name, method, kwargs, temperature):
    target, drafts = models
    for draft in drafts.values():
        for seed, length in enumerate((2, 9)):
            input_ids = random_prompt(length, seed)
            ours = generate(target, input_ids, 30, method=notebook[name](3), draft=draft, temperature=temperature,
                            generator=torch.Generator().manual_seed(seed))
            package = generate(target, input_ids, 30, method=method, draft=draft, temperature=temperature,
                               generator=torch.Generator().manual_seed(seed), params={"start": 3, **kwargs})
            assert ours.new_token_ids == package.new_token_ids
            assert [r.gamma for r in ours.rounds] == [r.gamma for r in package.rounds]
            if temperature == 0:
                assert ours.new_token_ids == generate(target, input_ids, 30, method="ar").new_token_ids


def test_notebook_oracle_equals_the_package_and_wastes_nothing(notebook, models):
    target, drafts = models
    for seed, length in enumerate((3, 8)):
        input_ids = random_prompt(length, seed)
        reference = generate(target, input_ids, 25, method="ar").new_token_ids
        ours = generate(target, input_ids, 25, method=notebook["Oracle"](reference), draft=drafts["close"])
        package = generate(target, input_ids, 25, method="oracle", draft=drafts["close"],
                           params={"reference": reference})
        assert ours.new_token_ids == package.new_token_ids == reference
        assert [r.drafted for r in ours.rounds] == [r.drafted for r in package.rounds]
        assert ours.accepted == ours.drafted > 0


def _policy(name, gamma, reference):
    return {"ar": lambda: DraftingPolicy(0), "fixed": lambda: DraftingPolicy(gamma),
            "adaptive-hf": lambda: policies.HeuristicGamma(gamma),
            "adaptive-dual": lambda: policies.DualSignalGamma(gamma),
            "oracle": lambda: policies.Oracle(reference=reference)}[name]()


@pytest.mark.parametrize("name", ["ar", "fixed", "adaptive-hf", "adaptive-dual", "oracle"])
def test_notebook_decode_loop_equals_the_engine(notebook, models, name):
    """The notebook's self-contained greedy loop (its own Round and Step records, notebook 01's cache helpers)
    gives the package engine's tokens and rounds, with an end-of-sequence token inside the budget too."""
    target, drafts = models
    for draft in drafts.values():
        for seed, (length, budget, eos) in enumerate([(2, 30, None), (9, 17, None), (5, 25, 7), (5, 25, 11)]):
            input_ids = random_prompt(length, seed)
            reference = generate(target, input_ids, budget, method="ar", eos_token_id=eos).new_token_ids
            proposer = engine.NoDraft() if name == "ar" else engine.DraftModelProposer(draft)
            package = engine.decode(target, proposer, _policy(name, 3, reference), input_ids, budget,
                                    engine.Sampler(0.0), set() if eos is None else {eos})
            tokens, rounds = notebook["decode_loop"](target, draft, _policy(name, 3, reference), input_ids, budget, eos)
            assert tokens == package.new_token_ids == reference
            assert [(r.gamma, r.drafted, r.accepted, r.new_tokens) for r in rounds] == \
                [(r.gamma, r.drafted, r.accepted, r.new_tokens) for r in package.rounds]


def test_notebook_step_entropy_is_the_engines(notebook):
    """The notebook's Step.entropy is the engine's DraftStep.entropy (the dual-signal rule reads it)."""
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    ours = notebook["Step"](0, 0, int(logits.argmax()), logits)
    package = engine.DraftStep(0, 0, logits, int(logits.argmax()), None)
    assert ours.entropy == package.entropy


@pytest.mark.slow
def test_notebook_decode_loop_on_the_real_target(notebook):
    """The course's target and draft, greedy float32: the loop gives the package's tokens and rounds."""
    from specdec_utils.models import load_model
    target, tokenizer = load_model("smollm2-135m", device="cpu", dtype=torch.float32)
    draft, _ = load_model("draft-m", device="cpu", dtype=torch.float32)
    input_ids = tokenizer("In short, the Nile is", return_tensors="pt").input_ids
    for policy, method, settings in [(DraftingPolicy(4), "greedy", {"gamma": 4}),
                                     (policies.HeuristicGamma(4), "adaptive-hf", {"params": {"start": 4}})]:
        package = generate(target, input_ids, 24, method=method, draft=draft, eos_token_id=tokenizer.eos_token_id,
                           **settings)
        tokens, rounds = notebook["decode_loop"](target, draft, policy, input_ids, 24, tokenizer.eos_token_id)
        assert tokens == package.new_token_ids
        assert [(r.drafted, r.accepted) for r in rounds] == [(r.drafted, r.accepted) for r in package.rounds]
