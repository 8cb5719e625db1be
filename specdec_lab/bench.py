"""Benchmark command line: time plain decoding, our speculative decoding methods and Hugging Face's
assisted generation on the same prompts, and count every forward pass.

    python -m specdec_lab.bench --target smollm2-135m --draft draft-m \\
        --methods ar,greedy,sampling,hf-assisted --max-new-tokens 64 --gamma 4 --out bench.json
    python -m specdec_lab.bench --methods ar,greedy,entropy-stop,adaptive-hf,oracle \\
        --param entropy-stop.theta=2.5 --dtype bfloat16

Methods: every method of `specdec_utils.generate` (`methods.METHODS`), plus `hf-assisted`
(`target.generate(assistant_model=draft)` with a constant gamma, the same algorithm as `greedy`:
Leviathan et al. 2023). `hierarchical*` draft with --draft-small (M1) under --draft (M2).
`greedy` and `oracle` always decode greedily; every other method at
--temperature and --top-p (`ar` at temperature 0 is plain greedy decoding). `oracle` is given the
target's greedy output, computed untimed first. `--param METHOD.NAME=VALUE` sets a policy's
parameter (`methods.policy_parameters`). Forward passes are counted with forward hooks on the
models, so every method is measured the same way (with --cuda-graphs, each `ModelRunner`'s own count:
a graph replay runs no hooks); each record also holds the sums of the engine's per-round statistics.
Bad arguments exit with status 2 and one line on stderr.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from specdec_utils.core import methods as engine_methods
from specdec_utils.core.block import load_block
from specdec_utils.core.eagle import EAGLE_NAME, head_facts, load_eagle
from specdec_utils.core.medusa import load_heads
from specdec_utils.core.runner import ModelRunner
from specdec_utils.core.static_cache import supports_static_cache
from specdec_utils.measure import (
    EAGLE_METHODS,
    HF_METHODS,
    NO_DRAFT,
    Variant,
    method_gamma,
    run_benchmark,
    summary_table,
)
from specdec_utils.models import UnknownModelError, load_model, weights_facts
from specdec_utils.prompts import eval_subset, load_prompts
from specdec_utils.utils import command_line, get_device

# the engine's methods, their earlier names (`greedy`: `draft` at temperature 0 whatever --temperature says;
# `sampling`: `draft` at the run's temperature), and transformers' baselines
METHODS = (*engine_methods.METHODS, *engine_methods.ALIASES, *HF_METHODS)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def _seed(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2 ** 63:  # what torch.Generator.manual_seed takes
        raise ValueError
    return value


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


def _param(text: str) -> tuple[str, str, object]:
    """METHOD.NAME=VALUE -> (method, name, value); the value is read as a Python literal if it is one
    (a number, True/False, None), else kept as a string."""
    import ast
    key, sep, value = text.partition("=")
    method, dot, name = key.rpartition(".")
    if not (sep and dot and method and name):
        raise argparse.ArgumentTypeError(f"must look like METHOD.NAME=VALUE (e.g. entropy-stop.theta=2.5), "
                                         f"got {text!r}")
    if method not in engine_methods.METHODS and method not in engine_methods.ALIASES:
        raise argparse.ArgumentTypeError(f"unknown method {method!r} in {text!r}; "
                                         f"allowed: {', '.join(engine_methods.METHODS)}")
    allowed = [p for p in engine_methods.policy_parameters(method) if p not in ("reference", "head", "draft")]
    allowed += ["gamma"] if method != "ar" else []  # the most draft tokens per round
    if name not in allowed:
        raise argparse.ArgumentTypeError(f"unknown parameter {name!r} for method {method!r}; allowed: "
                                         f"{', '.join(allowed) if allowed else 'none'}")
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        parsed = value
    return method, name, parsed


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
    parser = _OneLineParser(prog="python -m specdec_lab.bench",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m", help="target model name (default: %(default)s)")
    parser.add_argument("--draft", default="draft-m", help="draft model name (default: %(default)s)")
    parser.add_argument("--draft-small", default="draft-s",
                        help="M1 of the hierarchical methods, under --draft (M2): a draft model or 'ngram' "
                             "(default: %(default)s)")
    parser.add_argument("--heads", default="medusa-heads",
                        help="Medusa heads for method medusa: a name under data/models or a folder "
                             "(default: %(default)s)")
    parser.add_argument("--eagle", default=EAGLE_NAME,
                        help="the EAGLE head of methods eagle and eagle-chain: a name under data/models or a folder "
                             "(default: %(default)s)")
    parser.add_argument("--block", default="block-drafter",
                        help="the block drafter of method block: a name under data/models or a folder "
                             "(default: %(default)s)")
    parser.add_argument("--tree-nodes", type=_type(_at_least(1), "an integer >= 1"), default=None,
                        help="tree size cap for medusa and draft-tree (default: the method's, 32)")
    parser.add_argument("--prune", choices=["none", "confidence", "path", "entropy"], default=None,
                        help="per-round tree pruning for medusa and draft-tree (default: none)")
    parser.add_argument("--methods", type=_methods, default="ar,greedy",
                        help=f"comma-separated, from {', '.join(METHODS)} (default: %(default)s)")
    parser.add_argument("--prompts", type=Path, default=None,
                        help="JSONL file, one {\"id\", \"prompt\"[, \"chat\"]} per line "
                             "(default: a small category-balanced eval subset)")
    parser.add_argument("--per-category", type=_type(_at_least(1), "an integer >= 1"), default=None,
                        help="instead of --prompts: K held-out prompts of each category (prompts.eval_subset; "
                             "a category with fewer gives all it has; the default subset is K = 2)")
    parser.add_argument("--max-new-tokens", type=_type(_at_least(1), "an integer >= 1"), default=64)
    parser.add_argument("--gamma", type=_type(_at_least(1), "an integer >= 1"), default=4,
                        help="the draft length of the fixed-length methods (greedy, sampling, the trees' depth, "
                             "hf-*; default: %(default)s); the other methods run with their own cap unless "
                             "--param METHOD.gamma=N sets it")
    parser.add_argument("--param", type=_param, action="append", default=[], metavar="METHOD.NAME=VALUE",
                        help="a policy parameter, e.g. entropy-stop.theta=2.5 (repeatable)")
    parser.add_argument("--temperature", type=_type(_temperature, "a number >= 0 (0 means greedy)"),
                        default=0.0, help="for every method but greedy and oracle (default: %(default)s)")
    parser.add_argument("--top-p", type=_type(_top_p, "a number in (0, 1]"), default=1.0)
    parser.add_argument("--seed", type=_type(_seed, "an integer in [0, 2**63)"), default=0)
    parser.add_argument("--device", type=_device, default="auto", help="auto, cpu, cuda or mps")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--out", type=Path, default=None, help="write the records to this JSON file")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="replay the target's and drafts' decode steps from CUDA graphs (GPU only; notebook 09)")
    return parser


def read_prompts(path: Path | None, per_category: int | None = None) -> list[dict]:
    if path is not None and per_category is not None:
        raise UsageError("arguments --prompts and --per-category: give one of them, not both")
    if path is None:
        return eval_subset(per_category or 2)
    try:
        return load_prompts(path)
    except (OSError, ValueError) as err:
        raise UsageError(f"argument --prompts: {err}") from None


def load(name: str, argument: str, device, dtype):
    try:
        return load_model(name, device=device, dtype=dtype)
    except UnknownModelError as err:
        raise UsageError(f"argument {argument}: {err}") from None


def check_same_vocabulary(target, tokenizer, draft, draft_tokenizer, target_name, draft_name,
                          argument: str = "--draft") -> None:
    """Speculative decoding compares token ids, so the draft must output the target's vocabulary
    (a reduced-vocabulary draft reports it as `config.full_vocab_size`) with the same tokenizer."""
    target_vocab = target.config.vocab_size
    draft_vocab = getattr(draft.config, "full_vocab_size", None) or draft.config.vocab_size
    if (target_vocab, len(tokenizer)) != (draft_vocab, len(draft_tokenizer)):
        raise UsageError(f"argument {argument}: {draft_name!r} outputs {draft_vocab} token ids with a "
                         f"{len(draft_tokenizer)}-token tokenizer, but target {target_name!r} outputs "
                         f"{target_vocab} with {len(tokenizer)}; the draft must share the target's tokenizer")


def check_policy(method: str, gamma: int, params: dict, draft) -> None:
    """Build the method's policy once before running, so that a bad parameter value or a missing
    stop head is one line on stderr, not a traceback after minutes of benchmarking."""
    gamma, params = method_gamma(method, gamma, params)
    if method == "oracle":
        params = {**params, "reference": []}
    try:
        engine_methods.make_policy(method, gamma, params, draft)
    except (ValueError, TypeError) as err:
        raise UsageError(f"argument --param: {err}") from None


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.out is not None and args.out.is_dir():
            raise UsageError(f"argument --out: {args.out} is a folder; give a file name such as bench.json")
        rows = read_prompts(args.prompts, args.per_category)
        dtype = DTYPES[args.dtype]
        target, tokenizer = load(args.target, "--target", args.device, dtype)
        params = {}
        for method, name, value in args.param:
            if method not in args.methods:
                raise UsageError(f"argument --param: method {method!r} is not in --methods")
            params.setdefault(method, {})[name] = value
        draft = draft_small = None
        drafts, methods = {}, list(args.methods)
        if "block" in methods:  # its own drafter, which reads the target's features: a variant with its own draft
            try:
                drafts[args.block] = load_block(args.block, target)
            except ValueError as err:
                raise UsageError(f"argument --block: {err}") from None
            methods = [Variant("block", "block", draft=args.block) if m == "block" else m for m in methods]
        if any(method not in NO_DRAFT + ("block",) for method in args.methods):
            draft, draft_tokenizer = load(args.draft, "--draft", args.device, dtype)
            check_same_vocabulary(target, tokenizer, draft, draft_tokenizer, args.target, args.draft)
        for method in engine_methods.TREES:
            if method in args.methods:
                if args.tree_nodes is not None:
                    params.setdefault(method, {}).setdefault("tree_nodes", args.tree_nodes)
                if args.prune is not None:
                    params.setdefault(method, {}).setdefault("prune", args.prune)
        heads = None
        if "medusa" in args.methods:
            try:
                heads = load_heads(args.heads, target)
            except ValueError as err:
                raise UsageError(f"argument --heads: {err}") from None
        eagle = None
        if any(method in EAGLE_METHODS for method in args.methods):
            try:
                eagle = load_eagle(args.eagle, target)
            except ValueError as err:
                raise UsageError(f"argument --eagle: {err}") from None
        if any(method in engine_methods.HIERARCHICAL for method in args.methods):
            draft_small, small_tokenizer = load(args.draft_small, "--draft-small", args.device, dtype)
            check_same_vocabulary(target, tokenizer, draft_small, small_tokenizer, args.target, args.draft_small,
                                  "--draft-small")
        for method in args.methods:
            if method in engine_methods.METHODS and method != "ar":
                check_policy(method, args.gamma, params.get(method, {}), drafts.get(args.block) if method == "block"
                             else draft)
        if args.cuda_graphs:
            if torch.device(args.device).type != "cuda":
                raise UsageError(f"argument --cuda-graphs: needs a CUDA GPU; this run is on {args.device}")
            # one runner per model, made once: its cache and graphs serve every engine call of the run
            target, draft, draft_small = (ModelRunner(model, graphs=True)
                                          if model is not None and supports_static_cache(model) else model
                                          for model in (target, draft, draft_small))
    except UsageError as err:
        print(f"bench: error: {err}", file=sys.stderr)
        return 2

    small = f" under draft-small {args.draft_small}" if draft_small is not None else ""
    print(f"target {args.target}, draft {args.draft if draft is not None else '-'}{small} | "
          f"{args.device} {args.dtype} | "
          f"gamma {args.gamma}, temperature {args.temperature}, top-p {args.top_p} | "
          f"{len(rows)} prompts x {args.max_new_tokens} new tokens", flush=True)
    records = run_benchmark(target, draft, tokenizer, rows, methods, args.max_new_tokens, args.gamma,
                            args.temperature, args.top_p, args.seed, args.dtype, args.device, params, draft_small,
                            drafts=drafts, heads=heads, eagle=eagle)
    if eagle is not None:  # which head the EAGLE rows measured (lessons compare it with the shipped one)
        facts = head_facts(eagle, args.eagle)
        for record in records:
            if record["engine_method"] in EAGLE_METHODS:
                record["eagle_head"] = facts
    for model, name, key, uses in ((draft, args.draft, "draft_weights", lambda m: m not in NO_DRAFT + ("block",)),
                                   (draft_small, args.draft_small, "draft_small_weights",
                                    lambda m: m in engine_methods.HIERARCHICAL)):
        if model is not None:  # which draft's weights the rows measured (a retrained draft keeps its name)
            facts = weights_facts(name)
            for record in records:
                if uses(record["engine_method"]) and key not in record:  # (not a variant's own draft)
                    record[key] = facts
    command = command_line("specdec_lab.bench", argv)  # how to measure these rows again
    for record in records:
        record["command"] = command
    print(summary_table(records))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(records, indent=1))
        print(f"wrote {len(records)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
