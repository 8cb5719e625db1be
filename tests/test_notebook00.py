"""Notebook 00's teaching code, run straight out of the notebook on tiny random models.

The cells marked `# teaching implementation` are `greedy_decode` (plain decoding, one pass per token),
`roll_back_dynamic` (a DynamicCache rolled back by slicing) and `roll_back_static` (a StaticCache rolled back
by moving its pointer). `greedy_decode` must give the package's plain decoding's tokens; both rollbacks must
leave a cache whose next logits equal a fresh pass's, and the slicing one exactly what `trim_cache` leaves.
"""
import pytest
import torch
from transformers import DynamicCache, StaticCache

from specdec_utils.core.kv_cache import cache_length, trim_cache
from specdec_utils.speculative import autoregressive_generate

from conftest import random_model, random_prompt, teaching_namespace

NOTEBOOK = "00_why_decoding_is_slow.ipynb"

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def notebook():
    """The namespace left by executing the notebook's teaching-implementation cells (and nothing else)."""
    return teaching_namespace(NOTEBOOK, {"torch": torch, "DynamicCache": DynamicCache, "cache_length": cache_length},
                              min_cells=3)


@pytest.fixture(scope="module")
def model():
    return random_model("tiny-llama", seed=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_decode_is_the_package_plain_decoding(notebook, model, seed):
    prompt = random_prompt(7, seed=seed)
    ours = notebook["greedy_decode"](model, prompt, 12)
    assert ours == autoregressive_generate(model, prompt, 12).new_token_ids


def filled(model, cache, ids):
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("keep", [0, 3, 8])
def test_roll_back_dynamic_leaves_what_trim_cache_leaves(notebook, model, keep):
    ids = random_prompt(16, seed=3)
    ours = filled(model, DynamicCache(config=model.config), ids[:, :8 + 8])
    package = filled(model, DynamicCache(config=model.config), ids[:, :8 + 8])
    notebook["roll_back_dynamic"](ours, 8 + keep)
    trim_cache(package, 8 + keep)
    assert cache_length(ours) == cache_length(package) == 8 + keep
    for a, b in zip(ours.layers, package.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.mark.parametrize("roll_back", ["roll_back_dynamic", "roll_back_static"])
def test_a_rolled_back_cache_gives_the_fresh_logits(notebook, model, roll_back):
    ids = random_prompt(14, seed=4)
    make = {"roll_back_dynamic": lambda: DynamicCache(config=model.config),
            "roll_back_static": lambda: StaticCache(config=model.config, max_cache_len=32)}[roll_back]
    cache = filled(model, make(), ids[:, :12])          # 8 prompt tokens + 4 drafts
    notebook[roll_back](cache, 10)                       # keep 2 drafts
    with torch.no_grad():
        rolled = model(input_ids=ids[:, 12:13], past_key_values=cache, use_cache=True).logits[:, -1]
        fresh = model(input_ids=torch.cat([ids[:, :10], ids[:, 12:13]], dim=1)).logits[:, -1]
    torch.testing.assert_close(rolled, fresh, atol=1e-4, rtol=1e-4)
