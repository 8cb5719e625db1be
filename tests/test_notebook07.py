"""Notebook 07's teaching implementation, run straight out of the notebook: the cache-free EAGLE chain must draft
the same tokens as the package's `EagleProposer` (both recipes, full and reduced vocabularies, prompts of several
lengths), and a planted position bug in it must be caught."""
import pytest
import torch

from specdec_utils.core.eagle import EagleChainPolicy, EagleProposer, eagle_head_for
from specdec_utils.core.engine import Sampler
from specdec_utils.core.hidden import capture_hidden

from conftest import random_model, random_prompt, teaching_namespace

NOTEBOOK = "07_eagle_features_as_drafts.ipynb"

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def notebook():
    return teaching_namespace(NOTEBOOK, {"torch": torch})


def make_head(target, seed, **options):
    head = eagle_head_for(target, seed=seed, **options)
    with torch.no_grad():  # an untrained head is a near-copy of its inputs: make every part matter
        for p in head.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
    return head.eval()


def package_chain(head, target, ids, gamma):
    with torch.no_grad(), capture_hidden(target, head.features) as captured:
        target(input_ids=ids[:, :-1])
    proposer = EagleProposer(head)
    proposer.observe_target(captured[0][0])
    return captured[0][0], proposer.propose(ids, gamma, EagleChainPolicy(gamma), Sampler(), None, 0).tokens.tolist()


@pytest.mark.parametrize("options", [{"layer": "eagle3"}, {"layer": "eagle1"},
                                     {"layer": "eagle3", "vocab_ids": torch.arange(10, 200)}],
                         ids=["eagle3", "eagle1", "reduced-vocab"])
def test_notebook_chain_equals_the_proposer(notebook, options):
    for seed in range(4):
        target = random_model("tiny-llama", seed)
        head = make_head(target, seed, **options)
        ids = random_prompt(3 + 4 * seed, seed)
        features, theirs = package_chain(head, target, ids, 5)
        with torch.no_grad():
            assert notebook["draft_chain"](head, features, ids, 5) == theirs


def test_a_position_bug_in_the_notebook_chain_is_caught(notebook):
    """The drafted entries placed one position too far: the chains differ (RoPE sees another distance)."""
    bugged = dict(notebook)
    source = teaching_source()
    exec(compile(source.replace("positions.append(positions[-1] + 1)", "positions.append(positions[-1] + 2)"),
                 "bugged", "exec"), bugged)
    differ = 0
    for seed in range(4):
        target = random_model("tiny-llama", seed)
        head = make_head(target, seed)
        ids = random_prompt(6, seed)
        features, theirs = package_chain(head, target, ids, 5)
        with torch.no_grad():
            differ += bugged["draft_chain"](head, features, ids, 5) != theirs
    assert differ >= 2


def teaching_source() -> str:
    import json

    from conftest import NOTEBOOKS, TEACHING_MARKER
    cells = json.loads((NOTEBOOKS / NOTEBOOK).read_text())["cells"]
    return next("".join(c["source"]) for c in cells
                if c["cell_type"] == "code" and "".join(c["source"]).startswith(TEACHING_MARKER))
