"""Notebook 11's teaching implementation, run straight out of the notebook: its draft layer (the context's keys and
values through the layer's own projections) must compute the package's `_BlockLayer`, and the block drafter's pass
written there must compute the package's logits and draft the package's tokens (`BlockProposer`), over several block
sizes, prompt lengths, full and reduced vocabularies, with and without a Markov head; and a planted mask bug in it is
caught."""
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


@pytest.mark.parametrize("block_size,length", [(4, 1), (8, 9), (5, 23)])
def test_teaching_layer_equals_the_package_layer(notebook, block_size, length):
    """The layer alone: random slots and context, a random mask (some keys hidden, as in training)."""
    target = random_model("tiny-llama", seed=3)
    drafter = nudged_drafter(target, 11, block_size=block_size, layers=2)
    g = torch.Generator().manual_seed(block_size * 100 + length)
    x = torch.randn(2, block_size, drafter.hidden_size, generator=g)
    context = torch.randn(2, length, drafter.hidden_size, generator=g)
    mask = torch.rand(2, block_size, length + block_size, generator=g) < 0.7
    mask[..., length:] = True  # every slot keeps at least its block
    rope_block = drafter._rope(length + torch.arange(block_size).expand(2, block_size))
    rope_context = drafter._rope(torch.arange(length).expand(2, length))
    with torch.no_grad():
        for layer in drafter.layers:
            mine = notebook["block_layer"](layer, x, context, rope_block, rope_context, mask)
            theirs = layer(x, context, rope_block, rope_context, mask)
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
            # the context matters: other features, other output
            other = notebook["block_layer"](layer, x, context + 1, rope_block, rope_context, mask)
            assert not torch.allclose(mine, other, atol=1e-4)


MASK_LINE = "mask = torch.ones(1, b, m + b, dtype=torch.bool, device=context.device)"


def test_a_causal_block_mask_is_caught(notebook):
    """The planted bug: slots attend causally inside the block (as a decoder's would) instead of bidirectionally;
    the pass is then no longer the package's."""
    cells = json.loads((NOTEBOOKS / NOTEBOOK).read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if "def draft_block" in "".join(c["source"]))
    assert MASK_LINE in source
    planted = source.replace(MASK_LINE, MASK_LINE + "; mask[0, :, m:] = torch.ones(b, b, dtype=torch.bool).tril()")
    buggy = teaching_namespace(NOTEBOOK, {"torch": torch})  # block_layer and the rest, then the planted pass
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


def test_exercise_4_cached_context_equals_the_teaching_layer(notebook):
    """The solution's split (the context's keys and values once, the block per round) computes the notebook's layer."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("ch11", NOTEBOOKS / "solutions" / "ch11.py")
    ch11 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ch11)
    target = random_model("tiny-llama", seed=3)
    drafter = nudged_drafter(target, 5, block_size=6, layers=2)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 6, drafter.hidden_size, generator=g)
    context = torch.randn(1, 9, drafter.hidden_size, generator=g)
    rope_block, rope_context = drafter._rope(9 + torch.arange(6)[None]), drafter._rope(torch.arange(9)[None])
    mask = torch.ones(1, 6, 15, dtype=torch.bool)
    with torch.no_grad():
        for layer in drafter.layers:
            cached = ch11.block_layer_cached(layer, x, ch11.context_kv(layer, context, rope_context), rope_block, mask)
            plain = notebook["block_layer"](layer, x, context, rope_block, rope_context, mask)
            torch.testing.assert_close(cached, plain)
