"""Notebook 11's teaching implementation, run straight out of the notebook: the block drafter's pass written there
must compute the package's logits and draft the package's tokens (`BlockProposer`), over several block sizes, prompt
lengths, full and reduced vocabularies, with and without a Markov head; and a planted mask bug in it is caught."""
import json

import pytest
import torch

from specdec_utils.core.block import BlockPolicy, BlockProposer, block_drafter_for
from specdec_utils.core.engine import Sampler
from specdec_utils.core.hidden import capture_hidden

from conftest import NOTEBOOKS, random_model, random_prompt, teaching_namespace

NOTEBOOK = "11_block_drafting.ipynb"

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def notebook():
    return teaching_namespace(NOTEBOOK, {"torch": torch})


def nudged_drafter(target, seed, **options):
    drafter = block_drafter_for(target, seed=seed, **options)
    with torch.no_grad():  # an untrained drafter starts near zero (its Markov head at zero): make every part matter
        for p in drafter.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
    return drafter.eval()


def package(drafter, target, ids):
    with torch.no_grad(), capture_hidden(target, drafter.features) as captured:
        target(input_ids=ids[:, :-1])
    proposer = BlockProposer(drafter)
    proposer.observe_target(captured[0][0])
    gamma = drafter.block_size - 1
    tokens = proposer.propose(ids, gamma, BlockPolicy(gamma), Sampler(), None, 0).tokens.tolist()
    return drafter.fuse(captured[0][0]).detach(), tokens


@pytest.mark.parametrize("block_size,options", [(4, {}), (8, {"markov_rank": 3}),
                                                (5, {"vocab_ids": torch.arange(10, 200), "markov_rank": 2})],
                         ids=["plain", "markov", "reduced-vocab+markov"])
@pytest.mark.parametrize("length", [2, 9, 23])
def test_teaching_block_pass_equals_the_package(notebook, block_size, options, length):
    target = random_model("tiny-llama", seed=3)
    drafter = nudged_drafter(target, 7, block_size=block_size, **options)
    ids = random_prompt(length, seed=length)
    context, theirs = package(drafter, target, ids)
    m = length - 1
    with torch.no_grad():
        mine = notebook["greedy_block"](drafter, context, ids)
        logits = notebook["draft_block"](drafter, context, ids[0, -1], m)
        expected = drafter(context[None], ids[:, -1:], torch.tensor([[m]]), torch.ones(1, 1, m, dtype=torch.bool))
    assert mine == theirs and len(mine) == block_size - 1
    torch.testing.assert_close(logits, expected[0, 0], rtol=1e-4, atol=1e-4)
    if options.get("markov_rank"):  # the walk matters: without the Markov bias the drafts differ somewhere
        saved = drafter.markov_out.weight.detach().clone()
        with torch.no_grad():
            drafter.markov_out.weight.mul_(50)
            walked = notebook["greedy_block"](drafter, context, ids)
            unbiased = [int(drafter.draft_ids(row)) for row in notebook["draft_block"](drafter, context, ids[0, -1], m)]
            assert walked == package(drafter, target, ids)[1] and walked != unbiased
            drafter.markov_out.weight.copy_(saved)


MASK_LINE = "mask = torch.ones(1, b, m + b, dtype=torch.bool, device=context.device)"


def test_a_causal_block_mask_is_caught(notebook):
    """The planted bug: slots attend causally inside the block (as a decoder's would) instead of bidirectionally;
    the pass is then no longer the package's."""
    cells = json.loads((NOTEBOOKS / NOTEBOOK).read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if "def draft_block" in "".join(c["source"]))
    assert MASK_LINE in source
    planted = source.replace(MASK_LINE, MASK_LINE + "; mask[0, :, m:] = torch.ones(b, b, dtype=torch.bool).tril()")
    buggy = {"torch": torch}
    exec(compile(planted, NOTEBOOK, "exec"), buggy)
    target = random_model("tiny-llama", seed=3)
    drafter = nudged_drafter(target, 7, block_size=6)
    ids = random_prompt(12, seed=1)
    context, theirs = package(drafter, target, ids)
    m = ids.shape[1] - 1
    with torch.no_grad():
        good = notebook["draft_block"](drafter, context, ids[0, -1], m)
        bad = buggy["draft_block"](drafter, context, ids[0, -1], m)
    assert not torch.allclose(good, bad, atol=1e-3)
