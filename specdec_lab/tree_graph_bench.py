"""Token trees replayed from CUDA graphs on the GPU: are they lossless, and how fast is every method then? (GPU only)

    python -m specdec_lab.tree_graph_bench --part identity --out data/bench/tree_graph_identity_h100.json
    python -m specdec_lab.tree_graph_bench --part board --repeats 2 --out data/bench/tree_graph_h100.json

`--part identity` (float32): every tree method (and the chains) with the target on `PlainRunner` (graphed, and
compiled with `--compile`) against the same method on transformers' eager forward, prompt by prompt: the
new tokens must be the same (and equal to the target alone's).

`--part board` (bfloat16, greedy): the held-out prompts, every method through the graphed (compiled) plain
runner, beside the course's graphed engine step (`ModelRunner(graphs=True)`, notebook 09) for `ar` and the
greedy chain; each configuration repeated `--repeats` times, every repeat its own paired speedups over the
same run's `ar` (bootstrap over prompts). Every graph (each budget of tokens) is recorded, and compiled,
before the first timed prompt: the seconds it took are in the JSON.

The whole round on the device (`core/device_loop.py`, greedy, one CUDA graph per round):

    python -m specdec_lab.tree_graph_bench --part device-identity --prompts 24 --out ...
    python -m specdec_lab.tree_graph_bench --part device-tune --prompts 24 --out ...
    python -m specdec_lab.tree_graph_bench --part device-board --gamma-greedy G --gamma-eagle G --out ...

`device-identity` (float32): `ar`, the draft's chain and the EAGLE head's chain through the compiled device loop
against transformers' eager `ar`, prompt by prompt. `device-tune` (bfloat16): gamma for each chain, chosen by
tokens/s on *training* prompts (`--prompts N`: taken in turn from each category), with each round's GPU anatomy.
`device-board` (bfloat16): the held-out prompts, the device loops at the tuned gammas beside, on a GPU, `ar` on the
compiled plain runner's host loop and on the engine's graphed step (on the CPU: the course's engine running `ar`
and the same chains), `--repeats` times.

`--extra-trees 7x10x60,...` (device-identity and device-board): more EAGLE trees beside `--tree`, each its own
loop labelled `eagle DxTxN (device)` (notebook 07 compares EAGLE-2's default budget with the tuned tree this way).

`--temperature T` (device-tune and device-board): the chains sampled (the device loop's sampled round; the draft's
chain is then `sampling`), and the tree sampled by SpecInfer's walk, each prompt's draws from a generator seeded with
its index, beside the engine's sampled methods.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
import time

import torch
import transformers

from specdec_utils import report
from specdec_utils.core.device_loop import DeviceLoop, DeviceTreeLoop
from specdec_utils.core.eagle import EAGLE_NAME, head_facts, load_eagle
from specdec_utils.core.medusa import load_heads
from specdec_utils.core.methods import generate
from specdec_utils.core.plain_llama import PlainRunner
from specdec_utils.core.runner import ModelRunner
from specdec_utils.models import load_model, weights_facts
from specdec_utils.prompts import build_prompts, eval_subset, format_prompt
from specdec_utils.utils import command_line

from .bench import run_benchmark

TREE_METHODS = ("medusa", "draft-tree", "eagle")
CHAIN_METHODS = ("greedy", "eagle-chain")


# the target's passes: 1 token (ar), a chain of up to 7 (8), a tree of up to 25 or 33 nodes with its root (32, 64);
# the draft's: 1-2 tokens (a chain), a level of a tree (4), a catch-up after a round (8)
TARGET_BUDGETS, DRAFT_BUDGETS = (1, 8, 32, 64), (1, 2, 4, 8)


def _runners(target, draft, eagle, capacity: int, compiled: bool):
    t0 = time.perf_counter()
    record = target.device.type == "cuda"  # a CPU smoke run: the padded step, unrecorded
    target_runner = PlainRunner(target, graphs=True, compile=compiled, capacity=capacity, taps=eagle.target_hidden,
                                budgets=TARGET_BUDGETS, record=record)
    target_runner.prepare()
    t1 = time.perf_counter()
    draft_runner = PlainRunner(draft, graphs=True, compile=compiled, capacity=capacity, budgets=DRAFT_BUDGETS,
                               record=record)
    draft_runner.prepare()
    t2 = time.perf_counter()
    return target_runner, draft_runner, {"target_prepare_s": t1 - t0, "draft_prepare_s": t2 - t1,
                                         "budgets": list(target_runner.budgets)}


def identity(args, tokenizer, rows) -> dict:
    """float32: each method graphed vs eager, prompt by prompt."""
    target, _ = load_model(args.target, device=args.device, dtype=torch.float32)
    draft, _ = load_model(args.draft, device=args.device, dtype=torch.float32)
    heads, eagle = load_heads(args.heads, target), load_eagle(args.eagle, target)
    encoded = [tokenizer(format_prompt(tokenizer, row), return_tensors="pt").input_ids.to(args.device) for row in rows]
    capacity = max(ids.shape[1] for ids in encoded) + args.max_new_tokens + 80
    target_runner, draft_runner, prep = _runners(target, draft, eagle, capacity, args.compile)
    methods = ("ar", *CHAIN_METHODS, *TREE_METHODS)
    out = {"prompts": len(rows), "methods": {m: {"same_as_eager": 0, "same_as_ar": 0} for m in methods}, **prep}
    kwargs = dict(eos_token_id=tokenizer.eos_token_id, heads=heads, eagle=eagle)
    for ids in encoded:
        eager_ar = generate(target, ids, args.max_new_tokens, method="ar", **kwargs).new_token_ids
        for method in methods:
            eager = eager_ar if method == "ar" else generate(target, ids, args.max_new_tokens, method=method,
                                                              draft=draft, **kwargs).new_token_ids
            graphed = generate(target_runner, ids, args.max_new_tokens, method=method, draft=draft_runner,
                               **kwargs).new_token_ids
            out["methods"][method]["same_as_eager"] += graphed == eager
            out["methods"][method]["same_as_ar"] += graphed == eager_ar
        print(json.dumps(out["methods"]), flush=True)
    out["replays"], out["forwards"] = target_runner.replays, target_runner.forwards
    return out


def board(args, tokenizer, rows) -> dict:
    """bfloat16, greedy: every method graphed and compiled, beside the engine's graphed step."""
    target, _ = load_model(args.target, device=args.device, dtype=torch.bfloat16)
    draft, _ = load_model(args.draft, device=args.device, dtype=torch.bfloat16)
    heads, eagle = load_heads(args.heads, target), load_eagle(args.eagle, target)
    lengths = [len(tokenizer(format_prompt(tokenizer, row)).input_ids) for row in rows]
    capacity = max(lengths) + args.max_new_tokens + 80
    target_runner, draft_runner, prep = _runners(target, draft, eagle, capacity, args.compile)
    record = args.device == "cuda"
    engine_target = ModelRunner(target, graphs=True, capacity=capacity, record=record)
    engine_draft = ModelRunner(draft, graphs=True, capacity=capacity, record=record)
    methods = [m for m in args.methods.split(",")]
    out = {**prep, "repeats": [], "records": []}
    common = dict(max_new_tokens=args.max_new_tokens, gamma=args.gamma, temperature=0.0, top_p=1.0, seed=0,
                  dtype_name="bfloat16", device=args.device, heads=heads, eagle=eagle)
    for repeat in range(args.repeats):
        records = []
        for label, t, d, chosen in (("plain, compiled" if args.compile else "plain", target_runner, draft_runner,
                                     methods),
                                    ("engine", engine_target, engine_draft, ["ar", "greedy"])):
            got = run_benchmark(t, d, tokenizer, rows, chosen, **common)
            for r in got:
                r["runner"], r["repeat"] = label, repeat
                if label == "engine":
                    r["method"] = f"{r['method']} (engine)"
                r.pop("text", None)
            records += got
        summary = report.summarize(records, "ar")
        out["repeats"].append([{k: dataclasses.asdict(v) if isinstance(v, report.Estimate) else v
                                for k, v in row.items()} for row in summary])
        for row in summary:
            print(f"repeat {repeat} {row['method']:>18}: {row['tok_per_s']:7.1f} tok/s, {row['speedup']:.2f}x, "
                  f"tau {row['tau'] or 0:.2f}", flush=True)
        out["records"] += records
        if args.out:  # after every repeat: a run cut short keeps what it measured
            with open(args.out, "w") as f:
                json.dump({**out, "partial": repeat + 1 < args.repeats}, f)
    return out


def _chain(temperature: float) -> str:
    """The draft model's chain: `greedy`, or `sampling` at a temperature above 0 (the engine's method names)."""
    return "sampling" if temperature else "greedy"


def _attentions(args) -> tuple:
    """`--attention`: the target pass's attention in every device loop: 'sdpa', 'triton' or both (each loop twice)."""
    return ("sdpa", "triton") if args.attention == "both" else (args.attention,)


def _label(name: str, attention: str) -> str:
    """'eagle (device)', or 'eagle (device, triton)' for a loop whose target pass runs notebook 08's kernel."""
    return f"{name} (device)" if attention == "sdpa" else f"{name} (device, {attention})"


def _device_loops(target, draft, eagle, capacity: int, compiled: bool, gammas: dict, temperature: float = 0.0,
                  attentions: tuple = ("sdpa",), drafter=None) -> dict:
    """The device loops: `ar`, the draft's chain, the head's chain, EAGLE's tree and, with a block `drafter` (and
    `gammas["block"]`), its block (each at `temperature`), once per attention in `attentions`."""
    loops = {}
    for attention in attentions:
        warp = {"capacity": capacity, "compile": compiled, "temperature": temperature, "attention": attention}
        loops[_label("ar", attention)] = DeviceLoop(target, gamma=0, **warp)
        if gammas.get("greedy"):  # (--gamma-greedy 0: no draft model's chain)
            loops[_label(_chain(temperature), attention)] = DeviceLoop(target, draft=draft, gamma=gammas["greedy"],
                                                                       **warp)
        if gammas.get("eagle-chain"):  # (--gamma-eagle 0: no head's chain)
            loops[_label("eagle-chain", attention)] = DeviceLoop(target, head=eagle, gamma=gammas["eagle-chain"],
                                                                 **warp)
        if drafter is not None and gammas.get("block"):
            loops[_label("block", attention)] = DeviceLoop(target, drafter=drafter, gamma=gammas["block"], **warp)
        if gammas.get("eagle"):
            depth, topk, nodes = gammas["eagle"]
            loops[_label("eagle", attention)] = DeviceTreeLoop(target, eagle, depth=depth, topk=topk, nodes=nodes,
                                                               **warp)
    return loops


def _tree_shape(text: str) -> tuple:
    """'6x4x24' -> (depth 6, topk 4, nodes 24); '' -> None (no tree)."""
    if not text:
        return None
    try:
        depth, topk, nodes = (int(v) for v in text.split("x"))
    except ValueError:
        raise SystemExit(f"tree_graph_bench: a tree shape is DEPTHxTOPKxNODES (e.g. 6x4x24), got {text!r}") from None
    return depth, topk, nodes


def _compile(args):
    """The device loops' `compile`: False, True (each pass compiled) or "round" (`--whole-round`)."""
    return ("round" if args.whole_round else True) if args.compile else False


def _parts(args) -> bool:
    """Time each round's parts too (not with --whole-round: each part would be compiled again, minutes on a GPU)."""
    return not args.whole_round


def _capacity(args, needed: int) -> int:
    """`--capacity` if given (the same buffers, and so the same compiled shapes, in every part), else `needed`."""
    if args.capacity and args.capacity < needed:
        raise SystemExit(f"tree_graph_bench: --capacity {args.capacity} is too small, these prompts need {needed}")
    return args.capacity or needed


def _device_setup(args, tokenizer, rows, dtype):
    """The models in `dtype`, the prompts encoded, and the device loops (ar, the two chains at the asked gammas, the
    tree at `--tree`) built with room for the longest prompt plus `headroom`, each prepared (recorded and compiled
    on a GPU). Returns (target, draft, eagle head, encoded prompts, capacity, loops, seconds spent preparing)."""
    target, _ = load_model(args.target, device=args.device, dtype=dtype)
    draft, _ = load_model(args.draft, device=args.device, dtype=dtype)
    eagle = load_eagle(args.eagle, target)
    drafter = _drafter(args, target)
    encoded = [tokenizer(format_prompt(tokenizer, row), return_tensors="pt").input_ids.to(args.device) for row in rows]
    tree = _tree_shape(args.tree)
    # room for the longest prompt, its new tokens and the widest round (a chain's gamma, a tree's nodes), no more:
    # no loop grows (and so records again) inside a timed generation, and attention reads the whole buffer
    extra = [_tree_shape(shape) for shape in filter(None, args.extra_trees.split(","))]
    span = max(args.gamma_greedy, args.gamma_eagle, args.gamma_block if drafter is not None else 0,
               tree[2] if tree else 0, *(shape[2] for shape in extra)) + 1
    capacity = _capacity(args, max(ids.shape[1] for ids in encoded) + args.max_new_tokens + span + 1)
    t0 = time.perf_counter()
    loops = _device_loops(target, draft, eagle, capacity, _compile(args),
                          {"greedy": args.gamma_greedy, "eagle-chain": args.gamma_eagle,
                           "eagle": tree, "block": args.gamma_block}, args.temperature, _attentions(args), drafter)
    for depth, topk, nodes in extra:  # more trees beside --tree, one loop each
        for attention in _attentions(args):
            loops[_label(f"eagle {depth}x{topk}x{nodes}", attention)] = DeviceTreeLoop(
                target, eagle, depth=depth, topk=topk, nodes=nodes, capacity=capacity, compile=_compile(args),
                temperature=args.temperature, attention=attention)
    for loop in loops.values():
        loop.prepare()
    return target, draft, eagle, encoded, capacity, loops, time.perf_counter() - t0


def _run_one(loop, label: str, i: int, row: dict, ids, max_new_tokens: int, eos, device: str) -> dict:
    """One prompt through one device loop, in the fields `report.summarize` reads (target_calls: the rounds; the
    prefill, which produces no token here, is not counted). A sampled loop draws prompt i's uniforms from a
    generator seeded i."""
    generator = torch.Generator().manual_seed(i) if loop.sampled else None
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = loop.generate(ids, max_new_tokens, eos_token_id=eos, generator=generator)
    if device == "cuda":
        torch.cuda.synchronize()
    return {"id": row["id"], "category": row.get("category"), "method": label, "gamma": loop.gamma,
            "new_token_ids": out.new_token_ids, "wall_s": time.perf_counter() - t0,
            "new_tokens": len(out.new_token_ids), "target_calls": len(out.rounds),
            "drafted": len(out.rounds) * loop.gamma, "accepted": out.accepted}


def _run_loop(loop, label: str, encoded, rows, max_new_tokens: int, eos, device: str) -> list[dict]:
    """One record per prompt (`_run_one`), the prompts one after another."""
    loop.prepare()
    return [_run_one(loop, label, i, row, ids, max_new_tokens, eos, device)
            for i, (row, ids) in enumerate(zip(rows, encoded))]


def interleaved_order(labels: list, prompt: int) -> list:
    """The order in which prompt `prompt` visits the loops: all of them, rotated by one place per prompt. Each loop
    runs every prompt right beside the others, so a drift of the machine (clocks, another tenant) lands on every
    loop alike instead of on whichever loops ran during it; the rotation spreads the first and last places evenly."""
    shift = prompt % len(labels) if labels else 0
    return labels[shift:] + labels[:shift]


def _summary(records, baseline: str) -> list[dict]:
    return [{k: dataclasses.asdict(v) if isinstance(v, report.Estimate) else v for k, v in row.items()}
            for row in report.summarize(records, baseline)]


def device_identity(args, tokenizer, rows) -> dict:
    """float32: every device loop against transformers' eager `ar`, prompt by prompt."""
    target, _, _, encoded, capacity, loops, prepare_s = _device_setup(args, tokenizer, rows, torch.float32)
    out = {"prompts": len(rows), "capacity": next(iter(loops.values())).capacity, "ids": [row["id"] for row in rows],
           "categories": sorted({row["category"] for row in rows}), "tree": args.tree, "prepare_s": prepare_s,
           "gammas": {k: v.gamma for k, v in loops.items()}, "methods": {k: 0 for k in loops}, "tau": {}}
    taus = {k: [] for k in loops}
    for ids in encoded:
        eager = generate(target, ids, args.max_new_tokens, method="ar",
                         eos_token_id=tokenizer.eos_token_id).new_token_ids
        for label, loop in loops.items():
            got = loop.generate(ids, args.max_new_tokens, eos_token_id=tokenizer.eos_token_id)
            out["methods"][label] += got.new_token_ids == eager
            taus[label].append(got.tokens_per_round)
        print(json.dumps(out["methods"]), flush=True)
    out["tau"] = {k: sum(v) / len(v) for k, v in taus.items()}
    return out


def _drafter(args, target):
    """`--block`: the block drafter (a folder, or a name under data/models) on `target`, or None."""
    if not args.block:
        return None
    from specdec_utils.core.block import load_block
    return load_block(args.block, target)


def device_tune(args, tokenizer, _rows) -> dict:
    """bfloat16, training prompts: tokens/s of each chain at each gamma, and each round's anatomy."""
    rows = build_prompts("train")
    if args.prompts:  # taken in turn from each category (the split is sorted by category)
        by_category = {}
        for row in rows:
            by_category.setdefault(row["category"], []).append(row)
        rows = [row for group in zip(*by_category.values()) for row in group][:args.prompts]
    target, _ = load_model(args.target, device=args.device, dtype=torch.bfloat16)
    draft, _ = load_model(args.draft, device=args.device, dtype=torch.bfloat16)
    eagle = load_eagle(args.eagle, target)
    drafter = _drafter(args, target)
    encoded = [tokenizer(format_prompt(tokenizer, row), return_tensors="pt").input_ids.to(args.device) for row in rows]
    gammas = [int(g) for g in args.gammas.split(",") if g]  # none: the trees alone
    shapes = [_tree_shape(shape) for shape in filter(None, args.trees.split(","))]
    span = max(gammas + [nodes for _, _, nodes in shapes], default=0) + 1  # the widest round: no loop grows while timed
    capacity = _capacity(args, max(ids.shape[1] for ids in encoded) + args.max_new_tokens + span + 1)
    loops = _device_loops(target, draft, eagle, capacity, _compile(args),
                          {"greedy": gammas[0] if args.gamma_greedy else 0,
                           "eagle-chain": gammas[0] if args.gamma_eagle else 0,
                           "block": gammas[0]} if gammas else {}, args.temperature, _attentions(args), drafter)
    eos = tokenizer.eos_token_id
    out = {"split": "train", "prompts": len(rows), "capacity": next(iter(loops.values())).capacity,
           "temperature": args.temperature,
           "categories": sorted({row["category"] for row in rows}),
           "ids": [row["id"] for row in rows], "gammas": gammas, "results": [], "best": {},
           "eagle_head": head_facts(eagle, args.eagle), "draft_weights": weights_facts(args.draft)}
    ar_label = _label("ar", args.attention)
    ar = loops.pop(ar_label)
    base = report.tokens_per_second(_run_loop(ar, ar_label, encoded, rows, args.max_new_tokens, eos,
                                              args.device))
    out["ar"] = {"tok_per_s": base, **(ar.anatomy(parts=_parts(args)) if args.device == "cuda" else {})}
    for label, loop in loops.items():
        for gamma in gammas:
            if drafter is not None and loop.drafter is drafter and gamma > drafter.block_size - 1:
                continue  # past the block
            t0 = time.perf_counter()
            loop.set_gamma(gamma)
            loop.prepare()
            prepare_s = time.perf_counter() - t0
            records = _run_loop(loop, label, encoded, rows, args.max_new_tokens, eos, args.device)
            rate = report.tokens_per_second(records)
            result = {"method": label, "gamma": gamma, "tok_per_s": rate, "over_ar": rate / base,
                      "tau": report.tokens_per_target_call(records), "prepare_s": prepare_s,
                      **(loop.anatomy(parts=_parts(args)) if args.device == "cuda" else {})}
            out["results"].append(result)
            print(json.dumps(result), flush=True)
            if args.out:  # after every gamma: a run cut short keeps what it measured
                with open(args.out, "w") as f:
                    json.dump({**out, "partial": True}, f, indent=1)
        mine = [r for r in out["results"] if r["method"] == label]
        out["best"][label] = max(mine, key=lambda r: r["tok_per_s"])["gamma"]
    for depth, topk, nodes in shapes:
        shape = f"{depth}x{topk}x{nodes}"
        t0 = time.perf_counter()
        loop = DeviceTreeLoop(target, eagle, depth=depth, topk=topk, nodes=nodes, capacity=capacity,
                              compile=_compile(args), temperature=args.temperature, attention=args.attention)
        loop.prepare()
        prepare_s = time.perf_counter() - t0
        records = _run_loop(loop, _label("eagle", args.attention), encoded, rows, args.max_new_tokens, eos,
                            args.device)
        rate = report.tokens_per_second(records)
        result = {"method": _label("eagle", args.attention), "tree": shape, "gamma": depth, "tok_per_s": rate,
                  "over_ar": rate / base,
                  "tau": report.tokens_per_target_call(records), "prepare_s": prepare_s,
                  **(loop.anatomy(parts=_parts(args)) if args.device == "cuda" else {})}
        out["results"].append(result)
        print(json.dumps(result), flush=True)
    trees = [r for r in out["results"] if r["method"] == _label("eagle", args.attention)]
    if trees:
        out["best"][_label("eagle", args.attention)] = max(trees, key=lambda r: r["tok_per_s"])["tree"]
    return out


def device_board(args, tokenizer, rows) -> dict:
    """bfloat16, held-out prompts: the device loops beside, on a GPU, `ar` on the host-driven compiled runner and on
    the engine's graphed step; on the CPU (where the round runs op by op), the course's engine running `ar` and the
    same two chains. `--repeats` times."""
    target, draft, eagle, encoded, capacity, loops, prepare_s = _device_setup(args, tokenizer, rows, torch.bfloat16)
    head = head_facts(eagle, args.eagle)
    stale = [path for path, sha in args.tuned_heads.items() if sha != head["weights_sha256"]]
    if stale:  # gammas tuned with another head than the one on the board
        raise SystemExit(f"tree_graph_bench: {', '.join(stale)} tuned another EAGLE head than --eagle {args.eagle} "
                         f"(weights {head['weights_sha256']}); tune again with this head, or pass the head it tuned")
    record = args.device == "cuda"
    t0 = time.perf_counter() - prepare_s
    target32 = None
    if args.float32_ar:  # the target alone in float32 too: on a CPU whose bf16 step is slow, the `ar` to beat
        target32, _ = load_model(args.target, device=args.device, dtype=torch.float32)
        loops["ar (device, float32)"] = DeviceLoop(target32, gamma=0, capacity=capacity, compile=_compile(args))
        loops["ar (device, float32)"].prepare()
    if record:  # the GPU's baselines: the same compiled step driven from the host, and the engine's graphed step
        plain = PlainRunner(target, graphs=True, compile=args.compile, capacity=capacity, budgets=(1,), record=record)
        plain.prepare()
        baselines = [("ar (plain runner, host loop)", plain, None, "ar", 1),
                     ("ar (engine)", ModelRunner(target, graphs=True, capacity=capacity, record=record), None, "ar", 1)]
    else:  # the CPU's: the course's engine (eager transformers forward), alone and with the same drafts and gammas
        chain = _chain(args.temperature)
        baselines = [("ar (engine)", target, None, "ar", 1),
                     (f"{chain} (engine)", target, draft, chain, args.gamma_greedy),
                     ("eagle-chain (engine)", target, None, "eagle-chain", args.gamma_eagle)]
    if target32 is not None:
        baselines.append(("ar (engine, float32)", ModelRunner(target32, graphs=True, capacity=capacity, record=record)
                          if record else target32, None, "ar", 1))
    out = {"prepare_s": time.perf_counter() - t0, "capacity": next(iter(loops.values())).capacity,
           "attention": args.attention, "float32_ar": bool(args.float32_ar),
           "order": "interleaved: prompt by prompt, each prompt through every loop, the order rotated per prompt",
           "temperature": args.temperature,
           "gammas": {k: v.gamma for k, v in loops.items()}, "tree": args.tree,
           "eagle_head": head, "draft_weights": weights_facts(args.draft),
           "anatomy": {k: v.anatomy(parts=_parts(args)) for k, v in loops.items()} if record else {},
           "repeats": [], "records": []}
    common = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=1.0, seed=0,
                  dtype_name="bfloat16",
                  device=args.device, eagle=eagle)
    eos = tokenizer.eos_token_id
    entries = {label: ("loop", loop) for label, loop in loops.items()}
    entries.update({b[0]: ("baseline", b) for b in baselines})
    warmed = set()
    for repeat in range(args.repeats):
        records = []
        for i, (row, ids) in enumerate(zip(rows, encoded)):  # prompt by prompt, every loop beside the others
            for label in interleaved_order(list(entries), i):
                kind, entry = entries[label]
                if kind == "loop":
                    records.append(_run_one(entry, label, i, row, ids, args.max_new_tokens, eos, args.device))
                    continue
                _, runner, engine_draft, method, gamma = entry
                for r in run_benchmark(runner, engine_draft, tokenizer, [row], [method], gamma=gamma,
                                       warmup=None if label not in warmed else False, **common):
                    records.append({k: r[k] for k in ("id", "category", "new_token_ids", "wall_s", "new_tokens",
                                                      "target_calls", "drafted", "accepted")}
                                   | {"method": label, "gamma": 0 if method == "ar" else gamma})
                warmed.add(label)
        for r in records:
            r["repeat"] = repeat
        out["repeats"].append({"over device ar": _summary(records, _label("ar", _attentions(args)[0])),
                               "over engine ar": _summary(records, "ar (engine)")})
        for row in out["repeats"][-1]["over device ar"]:
            print(f"repeat {repeat} {row['method']:>30}: {row['tok_per_s']:7.1f} tok/s, {row['speedup']:.2f}x, "
                  f"tau {row['tau'] or 0:.2f}", flush=True)
        out["records"] += records
        board_fields(out, len(rows), args)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({**out, **_versions(args), "partial": repeat + 1 < args.repeats}, f)
    return out


def board_fields(out: dict, prompts: int, args) -> dict:
    """What the notebook and the README read beside the records: each record's `same_as_device_ar` (its tokens equal
    `ar (device)`'s for that prompt: bf16 rounds a 1-row and a several-row pass differently), the prompt count and
    the repeats completed; `--slim` then drops the tokens (a smaller file to commit)."""
    baseline = _label("ar", _attentions(args)[0])
    reference = {(r.get("repeat"), r["id"]): r["new_token_ids"] for r in out["records"]
                 if r["method"] == baseline and "new_token_ids" in r}  # (an earlier repeat's: slimmed already)
    for r in out["records"]:
        if "new_token_ids" in r:
            if not out.get("temperature"):  # (sampled, every loop draws other numbers: no reason to be the same)
                r["same_as_device_ar"] = r["new_token_ids"] == reference.get((r.get("repeat"), r["id"]))
            if args.slim:
                del r["new_token_ids"]
    out.update(split="eval", prompts=prompts, max_new_tokens=args.max_new_tokens,
               repeats_completed=len(out["repeats"]))
    return out


def _versions(args) -> dict:
    if args.device == "cuda":
        device = torch.cuda.get_device_name()
    else:
        cpu = report.cpu_info()
        device = f"{cpu['model']}, {cpu['cores']} cores, CPU kind {cpu['kind']}"
    return {"device": device, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def merge_boards(paths: list[str], note: str = "") -> dict:
    """Several `device-board` runs of one configuration (the same loops, gammas, tree, prompts and tokens) as one
    board: their repeats in order, renumbered; each run's own fields under `runs`; the anatomy, the median over the
    runs of each loop's GPU times."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    for key in ("gammas", "tree", "prompts", "max_new_tokens", "device", "torch", "transformers", "eagle_head",
                "draft_weights"):
        if len({json.dumps(run.get(key)) for run in runs}) > 1:
            raise SystemExit(f"tree_graph_bench: the boards to merge differ in {key!r}: "
                             + ", ".join(str(run.get(key)) for run in runs))
    first, records, repeats = runs[0], [], []
    for run in runs:
        records += [{**r, "repeat": r["repeat"] + len(repeats)} for r in run["records"]]
        repeats += run["repeats"]
    anatomy = {m: {k: statistics.median(run["anatomy"][m][k] for run in runs) for k in times}
               for m, times in first["anatomy"].items()}
    out = {k: first[k] for k in ("split", "prompts", "max_new_tokens", "gammas", "tree", "device", "torch",
                                 "transformers")}
    for key in ("eagle_head", "draft_weights"):  # the head and draft weights the runs measured (older boards lack them)
        if first.get(key):
            out[key] = first[key]
    out.update(part="device-board", date=max(run["date"] for run in runs), anatomy=anatomy, repeats=repeats,
               records=records, repeats_completed=len(repeats), prepare_s=[run["prepare_s"] for run in runs],
               runs=[{"file": path.rsplit("/", 1)[-1], **{k: run.get(k) for k in (
                   "date", "command", "prepare_s", "repeats_completed", "partial", "wall_s", "anatomy")}}
                     for path, run in zip(paths, runs)], note=note)
    return out


PARTS = {"identity": identity, "board": board, "device-identity": device_identity, "device-tune": device_tune,
         "device-board": device_board}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=list(PARTS) + ["merge"], required=True,
                    help="merge: --inputs (device-board JSONs) into one board at --out")
    ap.add_argument("--inputs", default="", help="merge: the device-board JSONs, comma-separated, in run order")
    ap.add_argument("--note", default="", help="merge: a note kept in the merged JSON (what the runs were)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="draft-m")
    ap.add_argument("--heads", default="medusa-heads")
    ap.add_argument("--eagle", default=EAGLE_NAME)
    ap.add_argument("--prompts", type=int, default=0, help="the first N held-out prompts (0: all)")
    ap.add_argument("--per-category", type=int, default=0,
                    help="instead: K held-out prompts of each category (prompts.eval_subset; 0: not used)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--gamma-greedy", type=int, default=4, help="device parts: the draft's gamma")
    ap.add_argument("--gamma-eagle", type=int, default=4, help="device parts: the EAGLE head's gamma")
    ap.add_argument("--block", default="", help="device parts: a block drafter (a folder saved by train_block, or a "
                    "name under data/models) run as one more loop, `block (device)`")
    ap.add_argument("--gamma-block", type=int, default=7, help="device parts: the block drafter's gamma")
    ap.add_argument("--gammas", default="2,3,4,5,6,8",
                    help="device-tune: the chains' gammas tried ('': the trees alone)")
    ap.add_argument("--slim", action="store_true", help="device-board: drop each record's tokens from the JSON")
    ap.add_argument("--tuned", help="device parts: take the gammas and the tree from these device-tune JSONs (their "
                    "best; comma-separated, a later file's choice wins)")
    ap.add_argument("--tree", default="6x4x24", help="device parts: EAGLE's device tree, DEPTHxTOPKxNODES ('': none)")
    ap.add_argument("--extra-trees", default="",
                    help="device-board/identity: more EAGLE trees beside --tree, comma-separated, each its own loop "
                         "labelled 'eagle DxTxN (device)'")
    ap.add_argument("--trees", default="", help="device-tune: the tree shapes tried, comma-separated")
    ap.add_argument("--methods", default="ar,greedy,eagle-chain,draft-tree,medusa,eagle")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--float32-ar", action="store_true",
                    help="device-board: also the target alone in float32, on the device loop and on the engine "
                         "(the other loops stay bfloat16)")
    ap.add_argument("--attention", choices=["sdpa", "triton", "both"], default="sdpa",
                    help="device parts: the target pass's attention, PyTorch's SDPA with a mask or notebook 08's "
                         "Triton kernel ('both': every loop twice, side by side; not for device-tune)")
    ap.add_argument("--capacity", type=int, default=0,
                    help="device parts: the loops' buffer length (0: what the prompts need, rounded up to 128)")
    ap.add_argument("--whole-round", action="store_true",
                    help="device parts: compile each loop's whole round as one graph (DeviceLoop(compile='round'))")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="device-tune and device-board: sample the chains and the tree at this temperature (0: greedy)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: the same code op by op (nothing recorded; compiled only with --whole-round)")
    args = ap.parse_args(argv)
    if args.part == "merge":
        merged = merge_boards([p for p in args.inputs.split(",") if p], args.note)
        merged["merged_by"] = command_line("specdec_lab.tree_graph_bench", argv)
        with open(args.out, "w") as f:
            json.dump(merged, f, separators=(",", ":"))
        print(f"wrote {args.out}: {merged['repeats_completed']} repeats from {len(merged['runs'])} runs")
        return 0
    tuned_heads = args.tuned_heads = {}  # device-board refuses gammas tuned with another head
    if args.tuned:
        best = {}
        for path in args.tuned.split(","):  # a later file's choice wins
            with open(path) as f:
                tune = json.load(f)
            best.update(tune["best"])
            if tune.get("eagle_head"):
                tuned_heads[path] = tune["eagle_head"]["weights_sha256"]
        args.gamma_greedy = best.get(f"{_chain(args.temperature)} (device)", args.gamma_greedy)
        for attention in ("sdpa", "triton"):  # a tune of either attention (the last file's choice wins)
            args.gamma_greedy = best.get(_label(_chain(args.temperature), attention), args.gamma_greedy)
            args.gamma_eagle = best.get(_label("eagle-chain", attention), args.gamma_eagle)
            args.gamma_block = best.get(_label("block", attention), args.gamma_block)
            args.tree = best.get(_label("eagle", attention), args.tree)
    if args.temperature < 0 or (args.temperature and args.part not in ("device-tune", "device-board")):
        ap.exit(2, f"tree_graph_bench: --temperature takes a number >= 0, for the parts device-tune and device-board "
                   f"(the others are greedy); got {args.temperature} with --part {args.part}\n")
    if args.attention != "sdpa":
        from specdec_utils.core import tree_attention
        if not tree_attention.AVAILABLE:
            ap.exit(2, f"tree_graph_bench: --attention {args.attention} needs Triton: {tree_attention.WHY}\n")
    if args.attention == "both" and args.part == "device-tune":
        ap.exit(2, "tree_graph_bench: device-tune tunes one attention at a time: --attention sdpa or triton\n")
    if args.device == "cpu":  # compiled only when asked for the whole round (Inductor's CPU code, no graph)
        args.compile = args.compile and args.whole_round
    elif not torch.cuda.is_available():
        ap.exit(2, "tree_graph_bench: needs a CUDA GPU (the committed JSON is the H100 run)\n")
    rows = eval_subset(args.per_category) if args.per_category else build_prompts("eval")
    rows = rows[:args.prompts] if args.prompts else rows
    _, tokenizer = load_model(args.target, device="cpu", dtype=torch.float32)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.inference_mode():
        result = PARTS[args.part](args, tokenizer, rows)
    result.update({"part": args.part, **_versions(args), "compiled": args.compile,
                   "compile_mode": {False: None, True: "steps"}.get(_compile(args), _compile(args)),
                   "max_new_tokens": args.max_new_tokens, "gamma": args.gamma, "wall_s": time.perf_counter() - t0,
                   "command": command_line("specdec_lab.tree_graph_bench", argv)})
    with open(args.out, "w") as f:
        json.dump(result, f, indent=None if "board" in args.part else 1)
    print(f"wrote {args.out} in {result['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
