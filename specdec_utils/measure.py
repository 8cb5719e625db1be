"""Measure methods side by side on the same prompts: `run_benchmark` times every method (the course's engine
and Hugging Face's assisted generation) prompt by prompt, so that every method sees the machine in the same state,
and counts each model's forward passes; one record per (prompt, method). The lessons call it for their live
samples; the lab's command line (`python -m specdec_lab.bench`) and boards call it for the committed ones. Turning
records into rates, ratios and intervals is `report`'s job."""
from __future__ import annotations

import contextlib
import datetime
import functools
from dataclasses import dataclass, field, replace

import torch
from transformers.utils import logging as hf_logging

from . import report
from .compat import full_vocab_config
from .core import methods as engine_methods
from .core.engine import GenerationResult, attention_backends
from .core.runner import ModelRunner
from .models import weights_facts
from .prompts import format_prompt
from .utils import device_summary, quick_mode, timer

HF_METHODS = ("hf-assisted", "hf-assisted-heuristic", "hf-prompt-lookup")
GREEDY_METHODS = ("greedy", "oracle")  # decode greedily whatever the temperature says
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
    `hf-assisted` (`assistant_model`, constant `num_assistant_tokens` = gamma, no confidence stop: our `draft`),
    `hf-assisted-heuristic` (HF's defaults: the "heuristic" schedule that grows or shrinks the draft length by
    2 / 1 after each round, and `assistant_confidence_threshold` 0.4, which transformers re-fits after every round
    when scikit-learn is installed: our `adaptive-hf` plus `confidence-stop`) and `hf-prompt-lookup`
    (`prompt_lookup_num_tokens` = gamma, no draft model: candidates copied from the prompt and output after the
    longest matching n-gram, up to 2 tokens). `drafted` and `accepted` are -1 where the method does not say.
    `target`, `draft` and `draft_small` may be `ModelRunner`s: the engine's methods run on them, Hugging Face's on
    their models. The draft's generation config and the global random stream are as they were afterwards."""
    if method not in HF_METHODS:
        return engine_methods.generate(target, input_ids, max_new_tokens, method=method, draft=draft, gamma=gamma,
                                       temperature=0.0 if method in GREEDY_METHODS else temperature, top_p=top_p,
                                       eos_token_id=eos_token_id, generator=torch.Generator().manual_seed(seed),
                                       params=params, draft_small=draft_small, heads=heads, eagle=eagle)
    target, draft = plain_model(target), plain_model(draft)
    assistant = {}  # the draft's generation-config switches for this call; restored afterwards
    if method == "hf-prompt-lookup":
        switches = {"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": 2}
    else:
        heuristic = method == "hf-assisted-heuristic"
        assistant = {"num_assistant_tokens": gamma,
                     "num_assistant_tokens_schedule": "heuristic" if heuristic else "constant",
                     "assistant_confidence_threshold": 0.4 if heuristic else 0}  # 0: always gamma tokens
        switches = {"assistant_model": draft}
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0} if temperature > 0 \
        else {"do_sample": False}
    saved = {key: getattr(draft.generation_config, key) for key in assistant}
    # transformers' own assisted-generation code passes the draft a generation config plus keyword
    # arguments and then warns about it (a deprecation inside the library, nothing we pass): silence it.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        for key, value in assistant.items():
            setattr(draft.generation_config, key, value)
        # Hugging Face samples from the global generator: seed it inside a fork, so the caller's stream is untouched
        with torch.random.fork_rng(devices=[input_ids.device] if input_ids.is_cuda else []), \
                full_vocab_config(draft) if "assistant_model" in switches else contextlib.nullcontext():
            torch.manual_seed(seed)
            output = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), **switches,
                                     max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                                     pad_token_id=pad_token_id, **sampling)
    finally:
        hf_logging.set_verbosity(verbosity)
        for key, value in saved.items():
            setattr(draft.generation_config, key, value)
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


def decoded_records(result: dict, *, per_round: bool = False) -> list[dict]:
    """The runs as bench-style records (one per prompt and run, `method` = "head/shape"), for `report`. With
    `per_round`, the prefill's pass and the one token it yields are left out: what remains counts tokens per
    drafting round (the papers' acceptance length)."""
    drop = 1 if per_round else 0
    return [{"method": key, "id": pid, "new_tokens": n - drop, "target_calls": p - drop}
            for key, run in result["runs"].items() for pid, n, p in zip(result["prompts"], run["new"], run["passes"])]


def decoded_taus(result: dict) -> list[dict]:
    """Per run of a decoded-tau result (the lab's `eagle_tau`: per head and drafting shape, each prompt's new
    tokens and target passes): head, shape, tau per target pass (the prefill's included, as `report.tau` counts it)
    and per drafting round, each with its bootstrap interval over prompts, and how many outputs equal `ar`'s."""
    passes, rounds = decoded_records(result), decoded_records(result, per_round=True)
    return [{"head": run["head"], "shape": run["shape"], "tau": report.tau(passes, key),
             "tau_round": report.tau(rounds, key), "same_as_ar": sum(run["same_as_ar"]),
             "prompts": len(run["same_as_ar"])}
            for key, run in result["runs"].items()]


def describe_shape(shape: dict) -> str:
    """How a parsed shape reads in a table: "`eagle-chain`, gamma 6" or "`eagle`, tree 7x10x60"."""
    if shape["method"] == "eagle-chain":
        return f"`eagle-chain`, gamma {shape['gamma']}"
    return f"`eagle`, tree {shape['gamma']}x{shape['params']['width']}x{shape['params']['tree_nodes']}"
