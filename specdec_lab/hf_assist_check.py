"""Does Hugging Face's assisted generation propose what its draft would? Run per transformers version:

    python -m specdec_lab.hf_assist_check --out data/bench/hf_assist_check.json

For each prompt, `hf-assisted` (bench's settings: constant schedule, gamma tokens, no confidence stop, greedy) runs
with a spy on transformers' `AssistedCandidateGenerator.get_candidates`. Each round's candidates are compared with
the draft's own greedy continuation of the same prefix, computed without a cache; and the assistant's cache length
after the round is compared with the positions it should hold (the candidates' sequence minus its last token). Both
loops are lossless either way (the target verifies); a proposal that differs changes how many tokens a round keeps.
The file keeps one run per transformers version and `--label` (`runs`), so runs of two environments, or of the code
before and after a change, sit side by side."""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch
import transformers
from transformers.generation import candidate_generator

from specdec_utils.measure import run_method
from specdec_utils.models import load_model
from specdec_utils.prompts import eval_subset, format_prompt
from specdec_utils.utils import command_line


def greedy_continuation(draft, ids: list[int], n: int) -> list[int]:
    """The draft's `n` greedy tokens after `ids`, each from a full forward pass (no cache to go stale)."""
    ids = list(ids)
    for _ in range(n):
        ids.append(int(draft(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(ids) - n:]


def assisted_rounds(target, draft, input_ids, gamma: int, max_new_tokens: int, eos_token_id, pad_token_id
                    ) -> list[tuple[list[int], list[int], int | None]]:
    """`hf-assisted` (greedy) on one prompt, with each round's (prefix, proposal, cache excess): the positions the
    assistant's cache holds beyond its sequence after the round, 0 in a sound loop (None: no cache)."""
    rounds = []
    original = candidate_generator.AssistedCandidateGenerator.get_candidates

    def spy(self, ids, *args, **kwargs):
        candidates, logits = original(self, ids, *args, **kwargs)
        cache = self.assistant_kwargs.get("past_key_values")
        held = cache.get_seq_length() if cache is not None else None
        rounds.append((ids[0].tolist(), candidates[0, ids.shape[1]:].tolist(),
                       None if held is None else held - (candidates.shape[1] - 1)))
        return candidates, logits

    candidate_generator.AssistedCandidateGenerator.get_candidates = spy
    try:
        run_method("hf-assisted", target, draft, input_ids, max_new_tokens, gamma, 0.0, 1.0, 0, eos_token_id,
                   pad_token_id)
    finally:
        candidate_generator.AssistedCandidateGenerator.get_candidates = original
    return rounds


def check_prompt(target, draft, tokenizer, row: dict, gamma: int, max_new_tokens: int) -> dict:
    """One prompt's rounds, how many proposed the draft's own greedy continuation, and the largest cache excess."""
    input_ids = tokenizer(format_prompt(tokenizer, row), return_tensors="pt").input_ids
    rounds = assisted_rounds(target, draft, input_ids, gamma, max_new_tokens, tokenizer.eos_token_id,
                             tokenizer.pad_token_id)
    same = sum(proposal == greedy_continuation(draft, prefix, len(proposal)) for prefix, proposal, _ in rounds)
    excess = [e for _, _, e in rounds if e is not None]
    return {"id": row["id"], "rounds": len(rounds), "same_as_draft": same,
            "cache_excess_max": max(excess) if excess else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_lab.hf_assist_check",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="draft-m")
    ap.add_argument("--per-category", type=int, default=1, help="held-out prompts per category (default 1)")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--label", default="", help="words to key this run by, after the transformers version")
    ap.add_argument("--out", type=Path, default=None, help="JSON file; a run replaces the one under the same key")
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    target, tokenizer = load_model(args.target, device="cpu", dtype=torch.float32)
    draft, _ = load_model(args.draft, device="cpu", dtype=torch.float32)
    prompts = [check_prompt(target, draft, tokenizer, row, args.gamma, args.max_new_tokens)
               for row in eval_subset(args.per_category)]
    run = {"command": command_line("specdec_lab.hf_assist_check", argv), "torch": torch.__version__,
           "date": datetime.date.today().isoformat(), "target": args.target, "draft": args.draft, "dtype": "float32",
           "gamma": args.gamma, "max_new_tokens": args.max_new_tokens, "prompts": prompts}
    rounds, same = sum(p["rounds"] for p in prompts), sum(p["same_as_draft"] for p in prompts)
    print(f"transformers {transformers.__version__}: {same} of {rounds} rounds proposed the draft's own greedy "
          f"continuation; largest cache excess {max((p['cache_excess_max'] or 0) for p in prompts)}")
    if args.out is not None:
        record = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
        record["runs"][" ".join(filter(None, (transformers.__version__, args.label)))] = run
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
