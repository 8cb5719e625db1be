"""Notebook 04's teaching implementations of the token-level stopping rules, run straight out of the
notebook: through the engine they must stop at the same tokens and give the same outputs as the
package's policies (`specdec_utils.core.policies`), greedy and sampled."""
import math
from types import SimpleNamespace

import pytest
import torch

from specdec_utils import generate
from specdec_utils.core import policies
from specdec_utils.core.policies import DraftingPolicy, min_cost_threshold
from specdec_utils.core.stop_head import StopHead

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
    ("EntropyStop", {"theta0": 0.0, "gamma": 6}, "entropy-stop", {"theta0": 0.0, "gamma": 6}),
    ("ConfidenceStop", {"threshold": 0.4, "gamma": 6}, "confidence-stop", {"threshold": 0.4, "gamma": 6}),
    ("AdaEDL", {"lam0": 0.5, "gamma": 6}, "adaedl", {"lam0": 0.5, "gamma": 6}),
    ("LearnedStop", {"threshold": 0.5, "gamma": 6}, "learned-stop", {"threshold": 0.5, "gamma": 6}),
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
                               generator=torch.Generator().manual_seed(seed), gamma=params["gamma"],
                               params={k: v for k, v in params.items() if k != "gamma"})
            assert ours.new_token_ids == package.new_token_ids
            assert [(r.drafted, r.stop) for r in ours.rounds] == [(r.drafted, r.stop) for r in package.rounds]
            if temperature == 0:
                assert ours.new_token_ids == generate(target, input_ids, 30, method="ar").new_token_ids
            stops |= {r.stop for r in ours.rounds}
    assert notebook[name].reason in stops  # the rule really stopped rounds


@pytest.mark.parametrize("entropy", [0.0, 0.05, 0.8, 1.2, 2.45, 3.0, 3.2, 7.5])
def test_notebook_stop_tests_equal_the_package(notebook, entropy):
    """Each rule's one-line stop test in the notebook decides as the package's policy does, on a grid of
    entropies, token probabilities, positions, thresholds and survival probabilities."""
    head = StopHead(8)
    for position in (0, 1, 3):
        step = SimpleNamespace(entropy=entropy, token_prob=math.exp(-entropy), position=position)
        for theta in (0.0, 1.0, 2.45, 3.0, 5.0):
            assert notebook["entropy_stop"](step.entropy, theta) == policies.EntropyStop(theta=theta).stop_after(step)
        for h in (0.0, 0.05, 0.4, 0.9, 1.0):
            assert notebook["confidence_stop"](step.token_prob, h) == \
                policies.ConfidenceStop(threshold=h, refit=False).stop_after(step)
        for lam in (0.0, 0.3, 0.5, 1.0):
            assert notebook["adaedl_stop"](step.position, step.entropy, lam) == \
                policies.AdaEDL(lam0=lam, adapt=False).stop_before(step)
    for survival in (0.0, 0.15, 0.3, 0.5, 0.99, 1.0):
        for h in (0.0, 0.3, 0.5, 0.7, 0.85, 1.0):
            assert notebook["learned_stop"](survival, h) == \
                policies.LearnedStop(threshold=h, head=head).stops(survival, None)
