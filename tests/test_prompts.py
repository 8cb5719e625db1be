"""Tests of the prompt set: categories, held-out split, the committed files, clear load errors."""
import json

import pytest

from specdec_utils.prompts import CATEGORIES, PROMPTS_DIR, build_prompts, eval_subset, load_prompts


def test_splits_are_disjoint_and_cover_every_category():
    train, test = build_prompts("train"), build_prompts("eval")
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert {r["category"] for r in test} == set(CATEGORIES) == {r["category"] for r in train}
    with pytest.raises(ValueError, match="'train' or 'eval'"):
        build_prompts("dev")


def test_committed_files_match_the_generator():
    for split in ("train", "eval"):
        rows = [json.loads(line) for line in (PROMPTS_DIR / f"{split}.jsonl").read_text().splitlines()]
        assert rows == build_prompts(split), f"rerun `python -m specdec_utils.prompts` ({split})"


def test_eval_subset_is_balanced_and_fixed():
    rows = eval_subset(per_category=2)
    assert len(rows) == 2 * len(CATEGORIES) and rows == eval_subset(per_category=2)


@pytest.mark.parametrize("content, message", [("", "holds no prompts"), ("{bad json\n", "not valid JSON"),
                                              ('{"prompt": "x"}\n', "needs an object with 'id'")])
def test_load_prompts_errors(tmp_path, content, message):
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_prompts(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_prompts(tmp_path / "missing.jsonl")
