"""How many tokens per target pass (tau) EAGLE heads reach on the held-out prompts, for chains and trees of
several sizes: exact greedy decoding through the engine, every output checked token for token against the
target alone (notebook 07).

Tau does not depend on the device's speed, only on what the head proposes and the target accepts, so it is
measured here in float32 on any machine, with the engine's own `eagle-chain` and `eagle` (EAGLE-2's dynamic
tree). Each prompt goes through every (head, shape) before the next prompt, so a run cut short still has
every configuration on the same prompts. Two counts of tau: new tokens per target pass, the prefill's pass
included (`report.tau`, the course's benchmarks), and tokens per drafting round, without the prefill's pass and
its one token (the acceptance length of the EAGLE papers, and of the device loops of notebook 09).

    python -m specdec_lab.eagle_tau --heads shipped=eagle-head,more=/path/to/head \\
        --shapes chain6,tree5x3x10,tree7x10x60 --out data/bench/eagle_tau_cpu_float32.json
    python -m specdec_lab.eagle_tau --heads shipped=eagle-head --shapes chain2,tree2x2x3 \\
        --prompts 2 --max-new-tokens 8 --out /tmp/tau.json                     # a smoke run

Shapes: `chainG` (a chain of G drafted tokens), `treeDxWxN` (depth D, each level expanding the W best nodes
into their W best children, the N best drafted nodes kept). SafeAILab/EAGLE's `EaModel.from_pretrained` defaults to
total_token 60, depth 7, top_k 10; that code counts the root among its 60 tokens and grows one level more than
`depth`, so 7x10x60 is the nearest shape in these terms, not the identical tree.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from specdec_utils import report
from specdec_utils.core.eagle import head_facts, load_eagle
from specdec_utils.core.methods import generate
from specdec_utils.measure import decoded_taus
from specdec_utils.models import load_model
from specdec_utils.prompts import build_prompts, format_prompt
from specdec_utils.utils import command_line

METHODS = ("eagle-chain", "eagle")
CHAIN_MAX = 6  # the best chain is taken among chains of at most this many drafts
SHAPE = re.compile(r"^(?:chain(\d+)|tree(\d+)x(\d+)x(\d+))$")


def parse_shape(text: str) -> dict:
    """'chain6' -> {"method": "eagle-chain", "gamma": 6}; 'tree7x10x60' -> EAGLE-2's tree, depth 7, width 10,
    60 nodes. One clear error otherwise."""
    m = SHAPE.match(text.strip())
    if not m or any(int(v) < 1 for v in m.groups() if v is not None):
        raise ValueError(f"shape {text!r}: allowed chainG or treeDxWxN with positive integers, "
                         f"e.g. chain6, tree7x10x60")
    if m.group(1):
        return {"name": text.strip(), "method": "eagle-chain", "gamma": int(m.group(1)), "params": {}}
    depth, width, nodes = (int(v) for v in m.groups()[1:])
    return {"name": text.strip(), "method": "eagle", "gamma": depth, "params": {"width": width, "tree_nodes": nodes}}


def parse_heads(text: str) -> dict[str, str]:
    """'label=name_or_path,...' -> {label: name_or_path}."""
    heads = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        label, sep, where = part.partition("=")
        if not sep or not label or not where:
            raise ValueError(f"heads: each entry is LABEL=NAME_OR_PATH (e.g. shipped=eagle-head), got {part!r}")
        heads[label] = where
    if not heads:
        raise ValueError("heads: at least one LABEL=NAME_OR_PATH")
    return heads


def measure(target, tokenizer, heads: dict, shapes: list[dict], rows: list[dict], max_new_tokens: int,
            log=print) -> dict:
    """Per prompt: the target alone, then every (head, shape). Returns {"prompts": [...], "runs": {label/shape:
    {"new": [...], "passes": [...], "same_as_ar": [...]}}}."""
    runs = {f"{label}/{s['name']}": {"head": label, "shape": s["name"], "new": [], "passes": [], "same_as_ar": []}
            for label in heads for s in shapes}
    started = time.perf_counter()
    for i, row in enumerate(rows):
        ids = tokenizer(format_prompt(tokenizer, row), return_tensors="pt").input_ids.to(target.device)
        ar = generate(target, ids, max_new_tokens, "ar", eos_token_id=tokenizer.eos_token_id)
        for label, head in heads.items():
            for s in shapes:
                out = generate(target, ids, max_new_tokens, s["method"], eagle=head, gamma=s["gamma"],
                               params=s["params"] or None, eos_token_id=tokenizer.eos_token_id)
                run = runs[f"{label}/{s['name']}"]
                run["new"].append(len(out.new_token_ids))
                run["passes"].append(out.target_calls)
                run["same_as_ar"].append(out.new_token_ids == ar.new_token_ids)
        if (i + 1) % 8 == 0 or i + 1 == len(rows):
            taus = ", ".join(f"{k} {sum(r['new']) / sum(r['passes']):.2f}" for k, r in runs.items())
            log(f"{i + 1}/{len(rows)} prompts, {time.perf_counter() - started:.0f}s: {taus}", flush=True)
    return {"prompts": [r["id"] for r in rows], "categories": [r.get("category") for r in rows], "runs": runs}


def difference(result: dict, a: str, b: str, *, per_round: bool = True, resamples: int = 2000):
    """Run `a`'s tau minus run `b`'s ("head/shape" keys), paired over prompts: each bootstrap resample draws the
    same prompts for both, so the prompts' own difficulty cancels (a `report.Estimate`)."""
    drop = 1 if per_round else 0
    new, passes = ({k: np.array([v - drop for v in result["runs"][k][field]], dtype=np.float64) for k in (a, b)}
                   for field in ("new", "passes"))

    def one(idx):
        idx = np.asarray(idx)
        return (new[a][idx].sum() / passes[a][idx].sum()) - (new[b][idx].sum() / passes[b][idx].sum())

    def many(picks):
        return (new[a][picks].sum(1) / passes[a][picks].sum(1)) - (new[b][picks].sum(1) / passes[b][picks].sum(1))
    return report.bootstrap(list(range(len(result["prompts"]))), one, resamples=resamples, vectorized=many)


def best_per_head(result: dict, measured: list[dict] | None = None) -> list[dict]:
    """Per head and method: the shape with the highest tau per drafting round (chains of at most CHAIN_MAX drafts),
    with its interval."""
    measured = decoded_taus(result) if measured is None else measured
    shapes = {s["name"]: s for s in result["shapes"]}
    out = []
    for head in result["heads"]:
        for method in METHODS:
            mine = [r for r in measured if r["head"] == head and shapes[r["shape"]]["method"] == method
                    and (method != "eagle-chain" or shapes[r["shape"]]["gamma"] <= CHAIN_MAX)]
            if mine:
                best = max(mine, key=lambda r: r["tau_round"].value)
                out.append({"head": head, "method": method, "shape": best["shape"], "tau_round": best["tau_round"]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_lab.eagle_tau", description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", default="shipped=eagle-head", help="LABEL=NAME_OR_PATH, comma-separated")
    ap.add_argument("--shapes", default="chain6,tree5x3x10,tree7x10x60", help="chainG / treeDxWxN, comma-separated")
    ap.add_argument("--prompts", type=int, default=0, help="the first N held-out prompts (0: all 176)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        shapes = [parse_shape(s) for s in args.shapes.split(",") if s.strip()]
        where = parse_heads(args.heads)
        if not shapes:
            raise ValueError("shapes: at least one, e.g. chain6")
        if args.prompts < 0 or args.max_new_tokens < 1:
            raise ValueError("--prompts must be >= 0 and --max-new-tokens >= 1")
    except ValueError as err:
        print(f"eagle_tau: {err}", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    target, tokenizer = load_model(args.target, device=args.device, dtype=dtype)
    try:
        heads = {label: load_eagle(w, target) for label, w in where.items()}
    except (OSError, ValueError) as err:
        print(f"eagle_tau: a head could not be loaded: {err}", file=sys.stderr)
        return 2
    rows = build_prompts("eval")
    rows = rows[:args.prompts] if args.prompts else rows
    started = time.perf_counter()
    result = measure(target, tokenizer, heads, shapes, rows, args.max_new_tokens)
    cpu = report.cpu_info()
    device = (torch.cuda.get_device_name() if args.device.startswith("cuda")
              else f"{cpu['model']}, {cpu['cores']} cores, CPU kind {cpu['kind']}")
    result.update({"command": command_line("specdec_lab.eagle_tau", argv),
                   "device": device, "dtype": args.dtype, "split": "eval", "max_new_tokens": args.max_new_tokens,
                   "heads": {label: head_facts(h, where[label]) for label, h in heads.items()},
                   "shapes": shapes, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
                   "transformers": transformers.__version__, "wall_s": round(time.perf_counter() - started, 1)})
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    same = all(all(r["same_as_ar"]) for r in result["runs"].values())
    print(f"wrote {args.out}; every output equal to the target alone's: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
