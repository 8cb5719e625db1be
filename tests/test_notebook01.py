"""Notebook 01's teaching implementation of greedy speculative decoding, run straight out of the notebook.

The cells marked `# teaching implementation` (`greedy_round`, `greedy_speculative_generate`) must give
the target's own greedy output and exactly what the package's `speculative_generate` gives: the same
tokens, the same number of target passes, the same accepted drafts per round, across gammas, token
budgets that end mid-round, and an EOS that falls inside a round. A draft that agrees often and one that
rarely does exercise both long accepted prefixes and immediate rejections.
"""
import json

import pytest
import torch

from specdec_utils.core.kv_cache import cache_length, trim_cache
from specdec_utils.speculative import autoregressive_generate, forward_uncached, speculative_generate

from conftest import NOTEBOOKS, noisy_copy, random_model, random_prompt, teaching_namespace

NOTEBOOK = "01_greedy_speculative_decoding.ipynb"


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def notebook():
    """The namespace left by executing the notebook's teaching-implementation cells (and nothing else)."""
    return teaching_namespace(NOTEBOOK, {"torch": torch, "forward_uncached": forward_uncached,
                                         "trim_cache": trim_cache, "cache_length": cache_length},
                              min_cells=2)


@pytest.fixture(scope="module")
def models():
    target = random_model("tiny-llama", seed=0)
    return target, {"close": noisy_copy(target, noise=0.01, seed=1),
                    "unrelated": random_model("tiny-llama", seed=2)}


@pytest.mark.parametrize("draft_name", ["close", "unrelated"])
@pytest.mark.parametrize("gamma", [1, 3, 4])
@pytest.mark.parametrize("max_new_tokens", [1, 2, 23])
def test_teaching_loop_equals_target_and_package(notebook, models, draft_name, gamma, max_new_tokens):
    target, drafts = models
    draft = drafts[draft_name]
    for seed, length in enumerate((1, 7)):
        input_ids = random_prompt(length, seed)
        new_ids, rounds = notebook["greedy_speculative_generate"](target, draft, input_ids, max_new_tokens, gamma)
        plain = autoregressive_generate(target, input_ids, max_new_tokens).new_token_ids
        package = speculative_generate(target, draft, input_ids, max_new_tokens, gamma=gamma)
        assert new_ids == plain == package.new_token_ids
        assert len(rounds) == package.target_calls  # one target pass per round
        assert sum(k for k, _ in rounds) == package.drafted
        assert sum(accepted for _, accepted in rounds) == package.accepted
        assert all(0 <= accepted <= k <= gamma for k, accepted in rounds)


def test_close_draft_is_accepted_often_and_unrelated_rarely(notebook, models):
    """Guards the test above against being vacuous: both regimes really occur."""
    target, drafts = models
    rates = {}
    for name, draft in drafts.items():
        _, rounds = notebook["greedy_speculative_generate"](target, draft, random_prompt(5, 0), 40, 4)
        rates[name] = sum(a for _, a in rounds) / sum(k for k, _ in rounds)
    assert rates["close"] > 0.5 > rates["unrelated"]


def test_teaching_loop_stops_at_eos_inside_a_round(notebook, models):
    """Take an EOS id from the middle of the target's greedy output: the output must end right there."""
    target, drafts = models
    input_ids = random_prompt(4, 3)
    plain = autoregressive_generate(target, input_ids, 30).new_token_ids
    eos = next(token for i, token in enumerate(plain) if i >= 5 and token not in plain[:i])
    expected = plain[:plain.index(eos) + 1]
    for draft in drafts.values():
        new_ids, _ = notebook["greedy_speculative_generate"](target, draft, input_ids, 30, 4, eos)
        assert new_ids == expected
        assert new_ids == speculative_generate(target, draft, input_ids, 30, gamma=4,
                                               eos_token_id=eos).new_token_ids


def test_greedy_round_rolls_both_caches_back(notebook, models):
    """After one round the target's cache holds prompt + accepted drafts; the draft's no more than that."""
    target, drafts = models
    input_ids = random_prompt(6, 4)
    for draft in drafts.values():
        drafted, choice, accepted, target_cache, draft_cache = notebook["greedy_round"](
            target, draft, input_ids, None, None, 4)
        assert drafted.shape == (4,) and choice.shape == (5,)
        assert torch.equal(drafted[:accepted], choice[:accepted])
        assert accepted == 4 or drafted[accepted] != choice[accepted]
        assert cache_length(target_cache) == 6 + accepted
        assert cache_length(draft_cache) <= 6 + accepted
        # The rolled-back cache continues exactly like a fresh pass over the committed text.
        committed = torch.cat([input_ids, choice[None, :accepted + 1]], dim=1)
        with torch.no_grad():
            fresh = target(input_ids=committed).logits[0, -1]
            cached, _ = forward_uncached(target, committed, target_cache)
        torch.testing.assert_close(cached[-1], fresh, rtol=1e-4, atol=1e-4)


def test_reference_board_is_rendered_where_nbval_compares_it():
    """The lesson's one result table renders the committed CPU reference boards in a cell nbval checks (no
    ignore tag), from the files alone, so a re-measured board fails CI until the lesson is executed again."""
    cells = json.loads((NOTEBOOKS / NOTEBOOK).read_text())["cells"]
    board = [c for c in cells if c["cell_type"] == "code" and "cpu_avx512bf16_bfloat16.json" in "".join(c["source"])]
    assert len(board) == 1, "one cell renders the reference boards"
    source = "".join(board[0]["source"])
    assert "nbval-ignore-output" not in board[0]["metadata"].get("tags", [])
    assert "cpu_avx512bf16_float32.json" in source
    assert not any(name in source for name in ("QUICK", "DEVICE", "records[", "step_ms")), "it reads the files only"
