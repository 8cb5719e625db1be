"""Notebook 03's teaching implementations of the round-level policies, run straight out of the notebook:
through the engine they must choose the same gamma every round and give the same tokens as the package's
policies (`specdec_utils.policies`), greedy and sampled, and greedy output must equal the target's."""
import pytest
import torch

from specdec_utils import generate
from specdec_utils.policies import DraftingPolicy
from conftest import noisy_copy, random_model, random_prompt, teaching_namespace

NOTEBOOK = "03_adaptive_draft_length.ipynb"

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def notebook():
    return teaching_namespace(NOTEBOOK, {"DraftingPolicy": DraftingPolicy}, min_cells=3)


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
            package = generate(target, input_ids, 30, method=method, draft=draft, gamma=3, temperature=temperature,
                               generator=torch.Generator().manual_seed(seed), params=kwargs)
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
        package = generate(target, input_ids, 25, method="oracle", draft=drafts["close"], params={"reference": reference})
        assert ours.new_token_ids == package.new_token_ids == reference
        assert [r.drafted for r in ours.rounds] == [r.drafted for r in package.rounds]
        assert ours.accepted == ours.drafted > 0
