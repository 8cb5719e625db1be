"""Benchmark command line: time plain decoding, our speculative decoding methods and Hugging Face's
assisted generation on the same prompts, and count every forward pass.

    python -m specdec_utils.bench --target smollm2-135m --draft draft-m \\
        --methods ar,greedy,sampling,hf-assisted --max-new-tokens 64 --gamma 4 --out bench.json
    python -m specdec_utils.bench --methods ar,greedy,entropy-stop,adaptive-hf,oracle \\
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
import contextlib
import datetime
import functools
import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from .. import report
from ..compat import full_vocab_config
from ..core import methods as engine_methods
from ..core.eagle import EAGLE_NAME, head_facts, load_eagle
from ..core.engine import GenerationResult, attention_backends
from ..core.medusa import load_heads
from ..core.runner import ModelRunner
from ..core.static_cache import supports_static_cache
from ..models import UnknownModelError, load_model, weights_facts
from ..prompts import eval_subset, format_prompt, load_prompts
from ..utils import command_line, device_summary, get_device, quick_mode, timer

HF_METHODS = ("hf-assisted", "hf-assisted-heuristic", "hf-prompt-lookup")
# the engine's methods, their earlier names (`greedy`: `draft` at temperature 0 whatever --temperature says;
# `sampling`: `draft` at the run's temperature), and transformers' baselines
METHODS = (*engine_methods.METHODS, *engine_methods.ALIASES, *HF_METHODS)
GREEDY_METHODS = ("greedy", "oracle")  # decode greedily whatever --temperature says
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
    parser = _OneLineParser(prog="python -m specdec_utils.bench",
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


EAGLE_METHODS = ("eagle", "eagle-chain")
NO_DRAFT = ("ar", "medusa", "hf-prompt-lookup", *EAGLE_METHODS)  # the methods that run without --draft
FIXED_LENGTH = ("ar", "draft", "greedy", "sampling", "medusa", "draft-tree")  # and hf-*: the run's gamma is their
# draft length (`ar` ignores it; its records carry the run's)


def method_gamma(method: str, gamma: int | None, params: dict) -> tuple[int | None, dict]:
    """The gamma a method runs with in a benchmark, and its other parameters: `params["gamma"]` if set
    (`--param METHOD.gamma=N`), else the run's `gamma` for the fixed-length methods, else None (the
    method's own cap: 10 for the stopping policies, none for adaptive-hf, ...; `methods.default_gamma`)."""
    params = dict(params)
    own = params.pop("gamma", None)
    if own is not None:
        return own, params
    return (gamma if method in FIXED_LENGTH or method in HF_METHODS else None), params


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


class ForwardCounter:
    """Counts the forward passes of a model (its top-level module) with a forward hook; of a
    `ModelRunner`, from the runner's own count (a CUDA graph replay runs no Python hooks, so a hook
    would miss every graphed step), from now until `remove()`."""

    def __init__(self, model):
        self._hooked = 0
        self._runner = model if isinstance(model, ModelRunner) else None
        self._start = self._runner.forwards if self._runner is not None else 0
        self._end = None  # the runner's count when removed
        self._handle = (model.register_forward_hook(self._count)
                        if model is not None and self._runner is None else None)

    @property
    def calls(self) -> int:
        if self._runner is None:
            return self._hooked
        return (self._runner.forwards if self._end is None else self._end) - self._start

    def _count(self, module, args, output):
        self._hooked += 1

    def remove(self):
        if self._runner is not None:
            self._end = self._runner.forwards if self._end is None else self._end
        elif self._handle is not None:
            self._handle.remove()


def plain_model(model_or_runner):
    """The model of a `ModelRunner`; anything else as it is."""
    return model_or_runner.model if isinstance(model_or_runner, ModelRunner) else model_or_runner


def run_method(method: str, target, draft, input_ids, max_new_tokens: int, gamma: int,
               temperature: float, top_p: float, seed: int, eos_token_id, pad_token_id,
               params: dict | None = None, draft_small=None, heads=None, eagle=None) -> GenerationResult:
    """Run one method on one prompt: every method of the engine through `specdec_utils.generate`
    (`greedy` and `oracle` at temperature 0), the `hf-*` ones through Hugging Face's `generate`:
    `hf-assisted` (`assistant_model`, constant `num_assistant_tokens` = gamma, no confidence stop: our
    `greedy` / `sampling`), `hf-assisted-heuristic` (HF's defaults: the "heuristic" schedule that grows
    or shrinks the draft length by 2 / 1 after each round, and `assistant_confidence_threshold` 0.4,
    which transformers re-fits after every round (minimum FPR + 3 FNR on the ROC curve) only when
    scikit-learn is installed: our `adaptive-hf` plus `confidence-stop`, re-fit included. scikit-learn is in
    requirements.txt now; records made in an environment without it, as the course's was before, ran HF's
    threshold fixed at 0.4) and `hf-prompt-lookup` (`prompt_lookup_num_tokens` =
    gamma, no draft model: candidates copied from the prompt and output after the longest matching
    n-gram, up to 2 tokens; notebook 05's zero-cost level). `drafted` and `accepted` are -1 where the
    method does not say. `target`, `draft` and `draft_small` may be `ModelRunner`s: the engine's methods
    run on them, Hugging Face's on their models."""
    if method not in HF_METHODS:
        return engine_methods.generate(target, input_ids, max_new_tokens, method=method, draft=draft, gamma=gamma,
                                       temperature=0.0 if method in GREEDY_METHODS else temperature, top_p=top_p,
                                       eos_token_id=eos_token_id, generator=torch.Generator().manual_seed(seed),
                                       params=params, draft_small=draft_small, heads=heads, eagle=eagle)
    target, draft = plain_model(target), plain_model(draft)
    if method == "hf-prompt-lookup":
        switches = {"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": 2}
    else:
        heuristic = method == "hf-assisted-heuristic"
        draft.generation_config.num_assistant_tokens = gamma
        draft.generation_config.num_assistant_tokens_schedule = "heuristic" if heuristic else "constant"
        draft.generation_config.assistant_confidence_threshold = 0.4 if heuristic else 0  # 0: always gamma tokens
        switches = {"assistant_model": draft}
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0} if temperature > 0 \
        else {"do_sample": False}
    torch.manual_seed(seed)  # Hugging Face samples from the global generator
    # transformers' own assisted-generation code passes the draft a generation config plus keyword
    # arguments and then warns about it (a deprecation inside the library, nothing we pass): silence it.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with full_vocab_config(draft) if "assistant_model" in switches else contextlib.nullcontext():
            output = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), **switches,
                                     max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                                     pad_token_id=pad_token_id, **sampling)
    finally:
        hf_logging.set_verbosity(verbosity)
    return GenerationResult(new_token_ids=output[0, input_ids.shape[1]:].tolist(), drafted=-1, accepted=-1)


@dataclass(frozen=True)
class Variant:
    """One benchmarked configuration: `method` run with its own `gamma` and policy `params`, reported
    under `label` (e.g. Variant("fixed-6", "greedy", gamma=6)), optionally with its own draft models
    (`draft`, `draft_small`: names looked up in run_benchmark's `drafts`)."""
    label: str
    method: str
    gamma: int | None = None
    params: dict = field(default_factory=dict)
    draft: str | None = None        # a key of run_benchmark's `drafts`; None: its `draft`
    draft_small: str | None = None  # the same for M1 of the hierarchical methods
    heads: str | None = None        # the same for the Medusa heads of `medusa`


def run_benchmark(target, draft, tokenizer, rows: list[dict], methods: list, max_new_tokens: int,
                  gamma: int, temperature: float, top_p: float, seed: int, dtype_name: str, device,
                  params: dict[str, dict] | None = None, draft_small=None,
                  drafts: dict | None = None, heads=None, warmup: bool | None = None, eagle=None) -> list[dict]:
    """One record per (prompt, method). `methods` holds method names (run with `gamma` and
    `params[name]`) or `Variant`s; prompts are the outer loop, so every method sees the machine in
    the same state. Each method first runs once, untimed, on the first prompt with the full token
    budget: on a GPU, short warm-ups leave kernel and allocator set-up for longer sequences inside
    the first timed prompt (`warmup=False` skips it, for models already run at these shapes, e.g. a
    small CPU sample after a timing of the same models; the default, None, skips it only in quick mode
    on a CPU, whose timings nobody reads and whose warm-up would be a sixth of a five-prompt run).
    `oracle` gets the target's greedy output of each prompt, computed untimed.
    A `Variant` naming its own `draft` / `draft_small` / `heads` runs with `drafts[name]`, so methods
    with different drafts share one run, prompt by prompt. `heads`: the Medusa heads of `medusa`.
    `target`, `draft`, `draft_small` and the values of `drafts` may be `ModelRunner`s, made once (the
    bench's --cuda-graphs: `ModelRunner(model, graphs=True)`): every engine call reuses their caches and
    graphs, and their forwards are counted by the runners; Hugging Face's methods get their models."""
    params = params or {}
    variants = [m if isinstance(m, Variant) else Variant(m, m, *method_gamma(m, gamma, params.get(m, {})))
                for m in methods]
    variants = [v if v.gamma is not None or v.method not in FIXED_LENGTH + HF_METHODS
                else replace(v, gamma=gamma) for v in variants]
    encoded = [tokenizer(format_prompt(tokenizer, row), return_tensors="pt").input_ids.to(device) for row in rows]
    settings = {"temperature": temperature, "top_p": top_p, "seed": seed,
                "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    references = [engine_methods.generate(target, ids, max_new_tokens, method="ar",
                                          eos_token_id=tokenizer.eos_token_id).new_token_ids
                  for ids in encoded] if any(v.method == "oracle" for v in variants) else [None] * len(rows)

    drafts = drafts or {}

    def models_of(variant):
        try:
            return (drafts[variant.draft] if variant.draft else draft,
                    drafts[variant.draft_small] if variant.draft_small else draft_small,
                    drafts[variant.heads] if variant.heads else heads)
        except KeyError as err:
            raise ValueError(f"variant {variant.label!r} names draft {err.args[0]!r}, which `drafts` lacks; "
                             f"allowed: {', '.join(drafts) or 'none'}") from None

    def run(variant, input_ids, reference):
        chosen = {**variant.params, "reference": reference} if variant.method == "oracle" else dict(variant.params)
        variant_draft, variant_small, variant_heads = models_of(variant)
        return run_method(variant.method, target, variant_draft, input_ids, max_new_tokens,
                          gamma=variant.gamma, params=chosen, draft_small=variant_small,
                          heads=variant_heads, eagle=eagle, **settings)

    if warmup is None:
        warmup = not (quick_mode() and torch.device(device).type == "cpu")
    for variant in variants if warmup else []:
        with attention_backends(torch.device(device)):  # HF's generate too: the same SDPA choice as the engine
            run(variant, encoded[0], references[0])
    device_name = device_summary(device)
    if torch.device(device).type == "cpu":  # the model and kind too: CPUs of one kind still differ (bf16 on AMX)
        cpu = report.cpu_info()
        device_name = (f"{cpu['model']}, {cpu['cores']} cores, CPU kind {cpu['kind']} | "
                       f"{device_name.split(' | ', 1)[1]} | {torch.backends.cpu.get_cpu_capability()}")

    import transformers
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    today = datetime.date.today().isoformat()
    named_weights = functools.cache(weights_facts)  # a variant's own draft, by its name: which weights it measured
    records = []
    for row, input_ids, reference in zip(rows, encoded, references):
        for variant in variants:
            variant_draft, variant_small, variant_heads = models_of(variant)
            counted = plain_model if variant.method in HF_METHODS else (lambda model: model)  # HF's run the models
            target_calls = ForwardCounter(counted(target))
            own_head = variant.method in EAGLE_METHODS  # the head is no module call: the engine counts its steps
            draft_calls = ForwardCounter(None if own_head else variant_heads if variant.method == "medusa"
                                         else counted(variant_draft))
            small_calls = ForwardCounter(variant_small if variant.method in engine_methods.HIERARCHICAL else None)
            try:
                with timer(device) as elapsed, attention_backends(torch.device(device)):
                    result = run(variant, input_ids, reference)
            finally:
                target_calls.remove()
                draft_calls.remove()
                small_calls.remove()
            new_tokens = len(result.new_token_ids)
            if variant.method in ("hf-assisted", "hf-assisted-heuristic"):  # a target pass verifies a round
                result.drafted, result.accepted = draft_calls.calls, new_tokens - target_calls.calls
            records.append({
                "id": row["id"], "category": row.get("category"), "method": variant.label,
                "engine_method": variant.method, "draft": variant.draft, "draft_small": variant.draft_small,
                **{f"{key}_weights": named_weights(name) for key, name in
                   (("draft", variant.draft), ("draft_small", variant.draft_small)) if name},
                **({"heads": f"{variant_heads.name} ({variant_heads.trained_steps} steps)"}
                   if variant.method == "medusa" else {}),
                "new_token_ids": result.new_token_ids,
                "text": tokenizer.decode(result.new_token_ids, skip_special_tokens=True),
                "wall_s": elapsed.seconds, "new_tokens": new_tokens, "target_calls": target_calls.calls,
                "draft_calls": result.draft_calls if own_head else draft_calls.calls, "small_calls": small_calls.calls,
                "drafted": result.drafted, "accepted": result.accepted,
                "gamma": variant.gamma if variant.gamma is not None else engine_methods.default_gamma(variant.method),
                "temperature": 0.0 if variant.method in GREEDY_METHODS else temperature, "top_p": top_p,
                "params": variant.params, "dtype": dtype_name, "device": str(device), "device_name": device_name,
                "cuda_graphs": isinstance(target, ModelRunner) and target.graphed and target.record,
                "versions": versions, "date": today,
                **result.round_sums()})
    return records


def tokens_per_second(records: list[dict], category: str | None = None) -> dict[str, float]:
    """Per method (label): total new tokens / total wall time, over all records or one category's
    (`report.tokens_per_second`)."""
    return {method: report.tokens_per_second(group) for method, group in report.by_method(records, category).items()}


def summary_table(records: list[dict]) -> str:
    """Per method (`report.summarize`, no bootstrap): tokens/s (total new tokens / total wall time), new tokens
    per target forward pass (the mean accepted length, plus one), acceptance rate (accepted / drafted),
    rejected draft tokens per output token, draft forwards per output token, and speedup over `ar`;
    '-' where the records do not say."""
    rows = report.summarize(records, "ar", intervals=False)
    width = max([16, *(len(row["method"]) for row in rows)])

    def cell(value, spec: str, size: int, suffix: str = "") -> str:
        return f"{'-' if value is None else format(value, spec) + suffix:>{size}}"
    lines = [f"{'method':<{width}} {'tokens/s':>9} {'tokens/target call':>19} {'acceptance':>11} {'wasted/token':>13} "
             f"{'draft calls/token':>18} {'speedup vs ar':>14}"]
    for row in rows:
        lines.append(f"{row['method']:<{width}} {row['tok_per_s']:>9.1f} {cell(row['tau'], '.2f', 19)} "
                     f"{cell(row['acceptance'], '.2f', 11)} {cell(row['waste'], '.2f', 13)} "
                     f"{cell(row['draft_calls_per_token'], '.2f', 18)} {cell(row['speedup'], '.2f', 14, 'x')}")
    return "\n".join(lines)


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
        if any(method not in NO_DRAFT for method in args.methods):
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
                check_policy(method, args.gamma, params.get(method, {}), draft)
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
    records = run_benchmark(target, draft, tokenizer, rows, args.methods, args.max_new_tokens, args.gamma,
                            args.temperature, args.top_p, args.seed, args.dtype, args.device, params, draft_small,
                            heads=heads, eagle=eagle)
    if eagle is not None:  # which head the EAGLE rows measured (lessons compare it with the shipped one)
        facts = head_facts(eagle, args.eagle)
        for record in records:
            if record["engine_method"] in EAGLE_METHODS:
                record["eagle_head"] = facts
    for model, name, key, uses in ((draft, args.draft, "draft_weights", lambda m: m not in NO_DRAFT),
                                   (draft_small, args.draft_small, "draft_small_weights",
                                    lambda m: m in engine_methods.HIERARCHICAL)):
        if model is not None:  # which draft's weights the rows measured (a retrained draft keeps its name)
            facts = weights_facts(name)
            for record in records:
                if uses(record["engine_method"]) and key not in record:  # (not a variant's own draft)
                    record[key] = facts
    command = command_line("specdec_utils.bench", argv)  # how to measure these rows again
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
