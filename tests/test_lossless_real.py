"""Greedy speculative decoding with the shipped drafts is token-identical to the target's own
greedy decoding on the real 135M target, in float32, for generations up to 256 tokens: across
about a hundred rounds with their rollbacks and across the end-of-sequence token. (bfloat16 is not asserted: a
multi-token verify pass may round a near-tie differently; notebook 01 measures how often.)"""
import pytest
import torch

from specdec_utils.models import load_model
from specdec_utils.prompts import format_prompt
from specdec_utils.speculative import autoregressive_generate, speculative_generate

pytestmark = pytest.mark.slow  # the real target

LONG = 256  # new tokens of the raw story, which has no EOS before them
PROMPTS = [
    {"id": "raw-story", "prompt": "It was a cold morning when the robot", "chat": False},   # runs to LONG
    {"id": "chat-haiku", "prompt": "Write a haiku about the sea.", "chat": True},  # stops at EOS (39 tokens)
]


@pytest.fixture(scope="module")
def target():
    return load_model("smollm2-135m", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def plain_outputs(target):
    """The target's own greedy decoding of each prompt, computed once (the slow part)."""
    model, tokenizer = target
    outputs = {}
    for row in PROMPTS:
        input_ids = tokenizer(format_prompt(tokenizer, row), return_tensors="pt").input_ids
        outputs[row["id"]] = autoregressive_generate(model, input_ids, LONG, eos_token_id=tokenizer.eos_token_id)
    return outputs


@pytest.mark.parametrize("draft_name, gamma", [("draft-m", 4), ("draft-s", 6)])
@pytest.mark.parametrize("row", PROMPTS, ids=lambda row: row["id"])
def test_greedy_speculative_equals_target_greedy(target, plain_outputs, draft_name, gamma, row):
    model, tokenizer = target
    draft, _ = load_model(draft_name, device="cpu", dtype=torch.float32)
    input_ids = tokenizer(format_prompt(tokenizer, row), return_tensors="pt").input_ids
    eos = tokenizer.eos_token_id
    plain = plain_outputs[row["id"]]
    spec = speculative_generate(model, draft, input_ids, LONG, gamma=gamma, eos_token_id=eos)
    assert spec.new_token_ids == plain.new_token_ids
    assert spec.target_calls < len(plain.new_token_ids)  # the draft did help
    assert spec.drafted > spec.accepted > 0               # and rollbacks happened
    if row["chat"]:
        assert plain.new_token_ids[-1] == eos and len(plain.new_token_ids) < LONG
    else:
        assert len(plain.new_token_ids) == LONG
