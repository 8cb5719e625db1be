"""Notebook 03's teaching implementations, run straight out of the notebook: the round-level policies must
choose the same gamma every round and give the same tokens as the package's policies
(`specdec_utils.core.policies`), greedy and sampled, and greedy output must equal the target's; the short decode
loop (`decode_loop`) must give the same tokens and rounds as the package's `engine.decode` for every kind of
round the notebook runs (plain decoding, fixed and adaptive gamma, the oracle; greedy and sampled)."""
import pytest
import torch

from specdec_utils import generate
from specdec_utils.core import engine, policies
from specdec_utils.core.policies import DraftingPolicy
from specdec_utils.core.runner import ModelRunner
from specdec_utils.core.verify import Verifier

from conftest import noisy_copy, random_model, random_prompt, teaching_namespace

NOTEBOOK = "03_adaptive_draft_length.ipynb"

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def notebook():
    return teaching_namespace(NOTEBOOK, {"DraftingPolicy": DraftingPolicy, "engine": engine, "torch": torch,
                                         "ModelRunner": ModelRunner, "Verifier": Verifier}, min_cells=4)


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


@pytest.mark.parametrize("name, temperature", [("ar", 0.0), ("fixed", 0.0), ("fixed", 1.0), ("adaptive-hf", 0.0),
                                               ("adaptive-hf", 1.0), ("adaptive-dual", 1.0), ("oracle", 0.0)])
def test_notebook_decode_loop_equals_the_engine(notebook, models, name, temperature):
    target, drafts = models
    sampler = engine.Sampler(temperature, 0, 0.9 if temperature else 1.0)
    for draft in drafts.values():
        for seed, (length, budget, eos) in enumerate([(2, 30, set()), (9, 17, set()), (5, 25, {7, 11})]):
            input_ids = random_prompt(length, seed)
            reference = generate(target, input_ids, budget, method="ar", eos_token_id=eos).new_token_ids
            proposer = (lambda: engine.NoDraft()) if name == "ar" else (lambda: engine.DraftModelProposer(draft))
            package = engine.decode(target, proposer(), _policy(name, 3, reference), input_ids, budget, sampler, eos,
                                    torch.Generator().manual_seed(seed))
            tokens, rounds = notebook["decode_loop"](target, proposer(), _policy(name, 3, reference), input_ids, budget,
                                                     sampler, eos, torch.Generator().manual_seed(seed))
            assert tokens == package.new_token_ids
            assert [(r.gamma, r.drafted, r.accepted, r.new_tokens, r.stop) for r in rounds] == \
                [(r.gamma, r.drafted, r.accepted, r.new_tokens, r.stop) for r in package.rounds]
            if temperature == 0:
                assert tokens == reference


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
        tokens, rounds = notebook["decode_loop"](target, engine.DraftModelProposer(draft), policy, input_ids, 24,
                                                 engine.Sampler(0.0), {tokenizer.eos_token_id})
        assert tokens == package.new_token_ids
        assert [(r.drafted, r.accepted) for r in rounds] == [(r.drafted, r.accepted) for r in package.rounds]
