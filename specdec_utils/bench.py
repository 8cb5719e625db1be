"""Benchmark command line: time plain decoding, our speculative decoding and Hugging Face's
assisted generation on the same prompts, and count every forward pass.

    python -m specdec_utils.bench --target smollm2-135m --draft draft-m \\
        --methods ar,greedy,sampling,hf-assisted --max-new-tokens 64 --gamma 4 --out bench.json

Methods: `ar` (the target alone, `speculative.autoregressive_generate`, at --temperature),
`greedy` (`speculative_generate` at temperature 0), `sampling` (`speculative_generate` at
--temperature and --top-p), `hf-assisted` (`target.generate(assistant_model=draft)` with a constant
gamma, the same algorithm as ours: Leviathan et al. 2023). Forward passes are counted with forward
hooks on both models, so every method is measured the same way. Bad arguments exit with status 2
and one line on stderr.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from .models import UnknownModelError, load_model
from .prompts import eval_subset, format_prompt, load_prompts
from .speculative import GenerationResult, autoregressive_generate, speculative_generate
from .utils import get_device, timer

METHODS = ("ar", "greedy", "sampling", "hf-assisted")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class UsageError(Exception):
    """A bad command line; `main` prints it as one line and exits with status 2."""


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the whole usage block, then exit
        raise UsageError(message)


def _type(check, allowed: str):
    """An argparse type that converts with `check` and says what is allowed when it fails."""
    def convert(text: str):
        try:
            return check(text)
        except (ValueError, TypeError):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}") from None
    return convert


def _at_least(minimum: int):
    def check(text):
        value = int(text)
        if value < minimum:
            raise ValueError
        return value
    return check


def _temperature(text):
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError
    return value


def _top_p(text):
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError
    return value


def _methods(text: str) -> list[str]:
    methods = list(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    unknown = [m for m in methods if m not in METHODS] or ([] if methods else [text])
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown method {unknown[0]!r}; allowed: "
                                         f"a comma-separated list of {', '.join(METHODS)}")
    return methods


def _device(text: str) -> torch.device:
    available = ["auto", "cpu"] + ["cuda"] * torch.cuda.is_available() + ["mps"] * torch.backends.mps.is_available()
    try:
        device = get_device(None if text == "auto" else text)
    except ValueError:
        device = None
    if device is None or device.type not in available:
        raise argparse.ArgumentTypeError(f"{text!r} is not available here; allowed: {', '.join(available)}")
    return device


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m specdec_utils.bench",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m", help="target model name (default: %(default)s)")
    parser.add_argument("--draft", default="draft-m", help="draft model name (default: %(default)s)")
    parser.add_argument("--methods", type=_methods, default="ar,greedy",
                        help=f"comma-separated, from {', '.join(METHODS)} (default: %(default)s)")
    parser.add_argument("--prompts", type=Path, default=None,
                        help="JSONL file, one {\"id\", \"prompt\"[, \"chat\"]} per line "
                             "(default: a small category-balanced eval subset)")
    parser.add_argument("--max-new-tokens", type=_type(_at_least(1), "an integer >= 1"), default=64)
    parser.add_argument("--gamma", type=_type(_at_least(1), "an integer >= 1"), default=4,
                        help="tokens drafted per round (default: %(default)s)")
    parser.add_argument("--temperature", type=_type(_temperature, "a number >= 0 (0 means greedy)"),
                        default=0.0, help="for ar, sampling and hf-assisted (default: %(default)s)")
    parser.add_argument("--top-p", type=_type(_top_p, "a number in (0, 1]"), default=1.0)
    parser.add_argument("--seed", type=_type(int, "an integer"), default=0)
    parser.add_argument("--device", type=_device, default="auto", help="auto, cpu, cuda or mps")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--out", type=Path, default=None, help="write the records to this JSON file")
    return parser


def read_prompts(path: Path | None) -> list[dict]:
    if path is None:
        return eval_subset()
    try:
        return load_prompts(path)
    except (OSError, ValueError) as err:
        raise UsageError(f"argument --prompts: {err}") from None


def load(name: str, argument: str, device, dtype):
    try:
        return load_model(name, device=device, dtype=dtype)
    except UnknownModelError as err:
        raise UsageError(f"argument {argument}: {err}") from None


def check_same_vocabulary(target, tokenizer, draft, draft_tokenizer, target_name, draft_name) -> None:
    """Speculative decoding compares token ids, so the draft must output the target's vocabulary
    (a reduced-vocabulary draft reports it as `config.full_vocab_size`) with the same tokenizer."""
    target_vocab = target.config.vocab_size
    draft_vocab = getattr(draft.config, "full_vocab_size", None) or draft.config.vocab_size
    if (target_vocab, len(tokenizer)) != (draft_vocab, len(draft_tokenizer)):
        raise UsageError(f"argument --draft: {draft_name!r} outputs {draft_vocab} token ids with a "
                         f"{len(draft_tokenizer)}-token tokenizer, but target {target_name!r} outputs "
                         f"{target_vocab} with {len(tokenizer)}; the draft must share the target's tokenizer")


class ForwardCounter:
    """Counts the forward passes of a model (its top-level module) with a forward hook."""

    def __init__(self, model):
        self.calls = 0
        self._handle = model.register_forward_hook(self._count) if model is not None else None

    def _count(self, module, args, output):
        self.calls += 1

    def remove(self):
        if self._handle is not None:
            self._handle.remove()


@contextmanager
def full_vocab_config(draft):
    """Hugging Face's assisted generation takes a `config.vocab_size` different from the target's
    for a different tokenizer. Our reduced-vocabulary drafts report their small head there but
    read and write full-vocabulary ids, so show the full size for the duration of the call."""
    full_vocab_size = getattr(draft.config, "full_vocab_size", None)
    reduced_vocab_size = draft.config.vocab_size
    if full_vocab_size:
        draft.config.vocab_size = full_vocab_size
    try:
        yield draft
    finally:
        draft.config.vocab_size = reduced_vocab_size


def generate(method: str, target, draft, input_ids, max_new_tokens: int, gamma: int,
             temperature: float, top_p: float, seed: int, eos_token_id, pad_token_id) -> GenerationResult:
    """Run one method on one prompt. `drafted`/`accepted` are -1 where the method does not say."""
    if method == "ar":
        return autoregressive_generate(target, input_ids, max_new_tokens, temperature=temperature, top_p=top_p,
                                       eos_token_id=eos_token_id, generator=torch.Generator().manual_seed(seed))
    if method in ("greedy", "sampling"):
        temperature = 0.0 if method == "greedy" else temperature
        return speculative_generate(target, draft, input_ids, max_new_tokens, gamma=gamma,
                                    temperature=temperature, top_p=top_p, eos_token_id=eos_token_id,
                                    generator=torch.Generator().manual_seed(seed))
    draft.generation_config.num_assistant_tokens = gamma
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0  # always draft gamma tokens
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0} if temperature > 0 \
        else {"do_sample": False}
    torch.manual_seed(seed)  # Hugging Face samples from the global generator
    # transformers' own assisted-generation code passes the draft a generation config plus keyword
    # arguments and then warns about it (a deprecation inside the library, nothing we pass): silence it.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with full_vocab_config(draft):
            output = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft,
                                     max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                                     pad_token_id=pad_token_id, **sampling)
    finally:
        hf_logging.set_verbosity(verbosity)
    return GenerationResult(new_token_ids=output[0, input_ids.shape[1]:].tolist(), drafted=-1, accepted=-1)


def run_benchmark(target, draft, tokenizer, rows: list[dict], methods: list[str], max_new_tokens: int,
                  gamma: int, temperature: float, top_p: float, seed: int, dtype_name: str, device) -> list[dict]:
    """One record per (prompt, method). Each method first runs once, untimed, on the first prompt
    with the full token budget: on a GPU, short warm-ups leave kernel and allocator set-up for
    longer sequences inside the first timed prompt."""
    encoded = [tokenizer(format_prompt(tokenizer, row), return_tensors="pt").input_ids.to(device) for row in rows]
    settings = {"gamma": gamma, "temperature": temperature, "top_p": top_p, "seed": seed,
                "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    for method in methods:
        generate(method, target, draft, encoded[0], max_new_tokens, **settings)

    records = []
    for row, input_ids in zip(rows, encoded):
        for method in methods:
            target_calls, draft_calls = ForwardCounter(target), ForwardCounter(draft)
            try:
                with timer(device) as elapsed:
                    result = generate(method, target, draft, input_ids, max_new_tokens, **settings)
            finally:
                target_calls.remove()
                draft_calls.remove()
            new_tokens = len(result.new_token_ids)
            if method == "hf-assisted":  # each target pass verifies a round: accepted + 1 tokens
                result.drafted, result.accepted = draft_calls.calls, new_tokens - target_calls.calls
            records.append({
                "id": row["id"], "method": method, "new_token_ids": result.new_token_ids,
                "text": tokenizer.decode(result.new_token_ids, skip_special_tokens=True),
                "wall_s": elapsed.seconds, "new_tokens": new_tokens, "target_calls": target_calls.calls,
                "draft_calls": draft_calls.calls, "drafted": result.drafted, "accepted": result.accepted,
                "gamma": gamma, "temperature": 0.0 if method == "greedy" else temperature, "top_p": top_p,
                "dtype": dtype_name, "device": str(device)})
    return records


def summary_table(records: list[dict]) -> str:
    """Per method: tokens/s (total new tokens / total wall time), new tokens per target forward
    pass (the mean accepted length, plus one), acceptance rate, and speedup over `ar`."""
    methods = list(dict.fromkeys(r["method"] for r in records))
    totals = {m: {key: sum(r[key] for r in records if r["method"] == m)
                  for key in ("new_tokens", "wall_s", "target_calls", "drafted", "accepted")} for m in methods}
    speed = {m: t["new_tokens"] / t["wall_s"] for m, t in totals.items()}
    lines = [f"{'method':<12} {'tokens/s':>9} {'tokens/target call':>19} {'acceptance':>11} {'speedup vs ar':>14}"]
    for method, total in totals.items():
        acceptance = f"{total['accepted'] / total['drafted']:.2f}" if total["drafted"] > 0 else "-"
        speedup = f"{speed[method] / speed['ar']:.2f}x" if "ar" in speed else "-"
        lines.append(f"{method:<12} {speed[method]:>9.1f} {total['new_tokens'] / total['target_calls']:>19.2f} "
                     f"{acceptance:>11} {speedup:>14}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.out is not None and args.out.is_dir():
            raise UsageError(f"argument --out: {args.out} is a folder; give a file name such as bench.json")
        rows = read_prompts(args.prompts)
        dtype = DTYPES[args.dtype]
        target, tokenizer = load(args.target, "--target", args.device, dtype)
        draft = None
        if any(method != "ar" for method in args.methods):
            draft, draft_tokenizer = load(args.draft, "--draft", args.device, dtype)
            check_same_vocabulary(target, tokenizer, draft, draft_tokenizer, args.target, args.draft)
    except UsageError as err:
        print(f"bench: error: {err}", file=sys.stderr)
        return 2

    print(f"target {args.target}, draft {args.draft if draft is not None else '-'} | {args.device} {args.dtype} | "
          f"gamma {args.gamma}, temperature {args.temperature}, top-p {args.top_p} | "
          f"{len(rows)} prompts x {args.max_new_tokens} new tokens", flush=True)
    records = run_benchmark(target, draft, tokenizer, rows, args.methods, args.max_new_tokens, args.gamma,
                            args.temperature, args.top_p, args.seed, args.dtype, args.device)
    print(summary_table(records))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(records, indent=1))
        print(f"wrote {len(records)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
