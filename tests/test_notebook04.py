"""Notebook 04's teaching implementations of the token-level stopping rules, run straight out of the
notebook: through the engine they must stop at the same tokens and give the same outputs as the
package's policies (`specdec_utils.policies`), greedy and sampled."""
import math

import pytest
import torch

from specdec_utils import generate
from specdec_utils.policies import DraftingPolicy, min_cost_threshold
from specdec_utils.stop_head import StopHead
from conftest import noisy_copy, random_model, random_prompt, teaching_namespace

NOTEBOOK = "04_entropy_self_verify.ipynb"

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def notebook():
    return teaching_namespace(NOTEBOOK, {"DraftingPolicy": DraftingPolicy, "min_cost_threshold": min_cost_threshold,
                                         "math": math}, min_cells=4)


@pytest.fixture(scope="module")
def models():
    target = random_model("tiny-llama", seed=0)
    torch.manual_seed(3)
    return target, {"close": noisy_copy(target, noise=0.01, seed=1), "unrelated": random_model("tiny-llama", seed=2)}, \
        StopHead(64)


CASES = [  # notebook class and its arguments, the package method and its parameters
    ("EntropyStop", {"tau0": 0.0, "max_gamma": 6}, "entropy-stop", {"tau0": 0.0, "max_gamma": 6}),
    ("ConfidenceStop", {"threshold": 0.4, "max_gamma": 6}, "confidence-stop", {"threshold": 0.4, "max_gamma": 6}),
    ("AdaEDL", {"lam0": 0.5, "max_gamma": 6}, "adaedl", {"lam0": 0.5, "max_gamma": 6}),
    ("LearnedStop", {"threshold": 0.5, "max_gamma": 6}, "learned-stop", {"threshold": 0.5, "max_gamma": 6}),
]


@pytest.mark.parametrize("name, ours_kwargs, method, params", CASES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_notebook_rules_equal_the_package(notebook, models, name, ours_kwargs, method, params, temperature):
    target, drafts, head = models
    if name == "LearnedStop":
        ours_kwargs, params = {**ours_kwargs, "head": head}, {**params, "head": head}
    stops = set()
    for draft in drafts.values():
        for seed, length in enumerate((2, 9)):
            input_ids = random_prompt(length, seed)
            ours = generate(target, input_ids, 30, method=notebook[name](**ours_kwargs), draft=draft,
                            temperature=temperature, generator=torch.Generator().manual_seed(seed))
            package = generate(target, input_ids, 30, method=method, draft=draft, temperature=temperature,
                               generator=torch.Generator().manual_seed(seed), params=params)
            assert ours.new_token_ids == package.new_token_ids
            assert [(r.drafted, r.stop) for r in ours.rounds] == [(r.drafted, r.stop) for r in package.rounds]
            if temperature == 0:
                assert ours.new_token_ids == generate(target, input_ids, 30, method="ar").new_token_ids
            stops |= {r.stop for r in ours.rounds}
    assert notebook[name].reason in stops  # the rule really stopped rounds
