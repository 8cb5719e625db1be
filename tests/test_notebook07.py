"""Notebook 07's teaching implementation, run straight out of the notebook: the cache-free EAGLE chain must draft
the same tokens as the package's `EagleProposer` (both recipes, full and reduced vocabularies, prompts of several
lengths), and a planted position bug in it must be caught; EAGLE-2's tree grown cache-free in the notebook must keep
the same nodes with the same parents as the package's device-side tree, and a planted position bug in it must be
caught too."""
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


def package_tree(head, target, ids, gamma, width, keep):
    from specdec_utils.core.eagle import EaglePolicy
    with torch.no_grad(), capture_hidden(target, head.features) as captured:
        target(input_ids=ids[:, :-1])
    proposer = EagleProposer(head, tree=True)
    proposer.observe_target(captured[0][0])
    proposal = proposer.propose(ids, gamma, EaglePolicy(gamma, keep, width), Sampler(), None, 0)
    return captured[0][0], (proposal.tokens.tolist(), proposal.parents.tolist())


def kept_tree(tokens, parents, kept):
    where = {c: i for i, c in enumerate(kept)}
    return [tokens[c] for c in kept], [where.get(parents[c], -1) for c in kept]


@pytest.mark.parametrize("options", [{"layer": "eagle3"}, {"layer": "eagle1"},
                                     {"layer": "eagle3", "vocab_ids": torch.arange(10, 200)}],
                         ids=["eagle3", "eagle1", "reduced-vocab"])
def test_notebook_tree_equals_the_proposer(notebook, options):
    """EAGLE-2's tree grown cache-free in the notebook keeps the same nodes, in the same order with the same parents,
    as the package's device-side tree, for several shapes (keep below, at and above what the levels grow)."""
    for seed in range(3):
        target = random_model("tiny-llama", seed)
        head = make_head(target, seed, **options)
        ids = random_prompt(3 + 4 * seed, seed)
        for gamma, width, keep in [(4, 3, 10), (5, 2, 8), (3, 4, 40), (1, 3, 2)]:
            features, theirs = package_tree(head, target, ids, gamma, width, keep)
            with torch.no_grad():
                tokens, parents, scores, fed, kept = notebook["grow_tree"](head, features, ids, gamma, width, keep)
            assert kept_tree(tokens, parents, kept) == theirs, (seed, gamma, width, keep)
            assert all(parents[c] in kept for c in kept if parents[c] >= 0)   # what is kept is a tree


def test_a_position_bug_in_the_notebook_tree_is_caught(notebook):
    """Fed entries placed one position too far (m + level instead of m + level - 1) grow other trees."""
    bugged = dict(notebook)
    source = next(s for s in teaching_sources() if "def grow_tree" in s)
    planted = source.replace("positions.append(m + level - 1)", "positions.append(m + level)")
    assert planted != source
    exec(compile(planted, "bugged", "exec"), bugged)
    differ = 0
    for seed in range(4):
        target = random_model("tiny-llama", seed)
        head = make_head(target, seed)
        ids = random_prompt(6, seed)
        features, theirs = package_tree(head, target, ids, 5, 3, 12)
        with torch.no_grad():
            tokens, parents, scores, fed, kept = bugged["grow_tree"](head, features, ids, 5, 3, 12)
        differ += kept_tree(tokens, parents, kept) != theirs
    assert differ >= 2


def teaching_sources() -> list[str]:
    import json

    from conftest import NOTEBOOKS, TEACHING_MARKER
    cells = json.loads((NOTEBOOKS / NOTEBOOK).read_text())["cells"]
    return ["".join(c["source"]) for c in cells
            if c["cell_type"] == "code" and "".join(c["source"]).startswith(TEACHING_MARKER)]
