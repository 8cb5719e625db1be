"""The one-engine refactor changed no output: `speculative_generate` and `autoregressive_generate`
(now `generate` with method "greedy" / "ar") give the tokens that the pre-refactor code gave,
recorded in tests/data/pinned_outputs.json by the code of commit c6a2099: greedy float32 and
seeded sampling (temperature, top-k, top-p), tiny models of two families and the real target with
both shipped drafts. The file names the draft weights its real rows used (`draft_weights`): when a draft is
retrained, its rows are recorded again by c6a2099's code with the new weights (a worktree of that commit with the
new `model.safetensors` in its `data/models/<name>/`), as `draft-m`'s were on 2026-11-29."""
import json
from pathlib import Path

import pytest
import torch

from specdec_utils.models import load_model, weights_facts
from specdec_utils.prompts import eval_subset, format_prompt
from specdec_utils.speculative import autoregressive_generate, speculative_generate

from conftest import noisy_copy, random_model, random_prompt

PINNED = json.loads((Path(__file__).parent / "data" / "pinned_outputs.json").read_text())


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module", params=("tiny-llama", "tiny-gpt2"))
def family_models(request):
    target = random_model(request.param, seed=0)
    return request.param, target, {"close": noisy_copy(target, noise=0.01, seed=2),
                                   "unrelated": random_model(request.param, seed=1)}


def test_tiny_models_give_the_pinned_tokens(family_models):
    family, target, drafts = family_models
    records = [r for r in PINNED["tiny"] if r["family"] == family]
    assert len(records) == 84
    for r in records:
        ids = random_prompt(r["prompt_len"], r["prompt_seed"])
        generator = torch.Generator().manual_seed(r["seed"])
        if r["method"] == "ar":
            result = autoregressive_generate(target, ids, 29, generator=generator, **r["settings"])
        else:
            result = speculative_generate(target, drafts[r["draft"]], ids, 29, gamma=r["gamma"],
                                          generator=generator, **r["settings"])
            assert (result.target_calls, result.accepted, result.drafted) == (
                r["target_calls"], r["accepted"], r["drafted"]), r
        assert result.new_token_ids == r["tokens"], r


@pytest.mark.slow
def test_real_target_gives_the_pinned_tokens():
    for name, pinned in PINNED["draft_weights"].items():
        assert weights_facts(name)["weights_sha256"] == pinned, (
            f"{name}'s weights changed since its rows were pinned ({pinned}): record them again (module docstring)")
    target, tokenizer = load_model("smollm2-135m", device="cpu", dtype=torch.float32)
    rows = {row["id"]: row for row in eval_subset(1)}
    drafts = {}
    for r in PINNED["real"]:
        if r["draft"] not in drafts:
            drafts[r["draft"]] = load_model(r["draft"], device="cpu", dtype=torch.float32)[0]
        ids = tokenizer(format_prompt(tokenizer, rows[r["prompt_id"]]), return_tensors="pt").input_ids
        result = speculative_generate(target, drafts[r["draft"]], ids, r["max_new_tokens"], gamma=r["gamma"],
                                      eos_token_id=tokenizer.eos_token_id,
                                      generator=torch.Generator().manual_seed(r["seed"]), **r["settings"])
        assert result.new_token_ids == r["tokens"], (r["prompt_id"], r["draft"], r["settings"])
        assert (result.target_calls, result.accepted) == (r["target_calls"], r["accepted"])
