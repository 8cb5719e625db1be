"""The GPU engine benchmark of notebook 09: `python -m specdec_lab.engine_bench [--out FILE]` (GPU only).

On the held-out prompts (one per category), greedy, `--max-new-tokens` tokens each:
1. float32 identity: the target alone and greedy speculative decoding with each draft, on
   transformers' DynamicCache, on the StaticKVCache (eager) and CUDA-graphed: tokens compared;
2. one target step (1 token, and 5: a gamma-4 verification) and one draft step, eager vs graphed;
3. the decode loop, bf16: `ar` and `greedy` (draft-s, draft-m; gamma 2..6) eager with PyTorch's
   default attention choice (cuDNN), eager without cuDNN attention (the engine's default), graphed;
4. a round's anatomy: model-forward time (synchronised around every forward) against the whole
   generation, per mode, and the torch profiler's top host and device ops.
Every mode is a set of `ModelRunner`s, one per model, made once and reused by every generation of that
mode: `ModelRunner(model, cache="dynamic")` (transformers' DynamicCache), `ModelRunner(model)` (the
static cache, eager), `ModelRunner(model, avoid_cudnn=False)` (PyTorch's default attention choice) and
`ModelRunner(model, graphs=True)` (CUDA graphs).
Writes data/bench/engine_gpu_h100.json by default. Needs the offline target prepared
(`python -m specdec_utils --prepare`)."""
import argparse
import datetime
import json
import statistics
import time

import torch
import transformers

from specdec_utils import generate, get_preset, load_model
from specdec_utils.core import static_cache
from specdec_utils.core.runner import ModelRunner
from specdec_utils.models import weights_facts
from specdec_utils.prompts import eval_subset, format_prompt
from specdec_utils.utils import REPO_ROOT


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO_ROOT / "data" / "bench" / "engine_gpu_h100.json"))
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--parts", default="1234", help="which parts to run (see the module docstring)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.exit(2, "engine_bench: needs a CUDA GPU (the committed JSON is the H100 run)\n")
    run(args.out, args.max_new_tokens, args.parts)


MODES = {  # a mode's ModelRunner options
    "dynamic": {"cache": "dynamic"},                       # transformers' DynamicCache, eager
    "static": {},                                          # the StaticKVCache, eager (the engine's default)
    "eager, cuDNN attention": {"avoid_cudnn": False},      # PyTorch's default SDPA choice (cuDNN first on an H100)
    "eager": {},                                           # without cuDNN attention
    "graphed": {"graphs": True},                           # decode steps replayed from CUDA graphs
}


class ClockedRunner(ModelRunner):
    """A `ModelRunner` that, while `clocking` is true, synchronises the GPU on each side of every
    forward and adds its time to `spent` (seconds): the models' share of a round (part 4). A chain's
    `forward_tree` runs `forward`: timed once."""
    clocking = False
    spent = 0.0
    _depth = 0

    def forward(self, *args, **kwargs):
        return self._clocked(super().forward, *args, **kwargs)

    def forward_tree(self, *args, **kwargs):
        return self._clocked(super().forward_tree, *args, **kwargs)

    def _clocked(self, call, *args, **kwargs):
        if not self.clocking or self._depth:
            return call(*args, **kwargs)
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        self._depth += 1
        sync()
        t0 = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            sync()
            self.spent += time.perf_counter() - t0
            self._depth -= 1


def runners_for(mode: str, *models, runner=ModelRunner):
    """One runner per model (None stays None) with the mode's options (`MODES`)."""
    return [None if model is None else runner(model, **MODES[mode]) for model in models]


def run(out_path, max_new_tokens, parts):
    torch.manual_seed(0)
    preset = get_preset("offline")
    res = {"device": torch.cuda.get_device_name(), "dtype": "bfloat16 (the float32 identity check in float32)",
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
           "date": datetime.date.today().isoformat(), "max_new_tokens": max_new_tokens,
           "cache_capacity": f"prompt + {static_cache.CHUNK}, rounded up to a multiple of {static_cache.CHUNK}",
           "timing": "host wall clock around each call after warm-up; the results' tokens are on the host, so "
                     "every generation is complete when its clock stops",
           "draft_weights": {name: weights_facts(preset[key])  # which weights each draft name measured
                             for name, key in (("draft-s", "draft_small"), ("draft-m", "draft_medium"))}}

    def save():
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)

    rows = eval_subset(per_category=1, seed=0)
    warm_rows = eval_subset(per_category=1, seed=1)[:2]
    res["prompts"] = [r["id"] for r in rows]

    def load(dtype):
        target, tok = load_model(preset["target"], "cuda", dtype)
        drafts = {name: load_model(preset[key], "cuda", dtype)[0]
                  for name, key in (("draft-s", "draft_small"), ("draft-m", "draft_medium"))}
        return target, tok, drafts

    def encode(tok, rs):
        return [tok(format_prompt(tok, r), return_tensors="pt").input_ids.cuda() for r in rs]

    def gen(target, draft, ids, method, gamma=4):
        return generate(target, ids, max_new_tokens, method=method, draft=draft, gamma=gamma)

    # ---------------------------------------------------------------- 1. float32 identity
    if "1" in parts:
        target, tok, drafts = load(torch.float32)
        prompts = encode(tok, rows)
        ident = {}
        for label, draft in (("ar", None), *((f"greedy {name}", drafts[name]) for name in ("draft-s", "draft-m"))):
            method = "ar" if draft is None else "greedy"
            tokens = {}
            for mode in ("dynamic", "static", "graphed"):
                runners = runners_for(mode, target, draft)  # one per model, reused over the prompts
                tokens[mode] = [gen(*runners, p, method).new_token_ids for p in prompts]
            dyn, static, graph = tokens["dynamic"], tokens["static"], tokens["graphed"]
            ident[label] = {"static_eq_dynamic": sum(a == b for a, b in zip(static, dyn)),
                            "graphed_eq_static": sum(a == b for a, b in zip(graph, static)),
                            "eq_ar": None, "prompts": len(prompts), "tokens": dyn}
        for label in ident:
            ident[label]["eq_ar"] = sum(a == b for a, b in zip(ident[label]["tokens"], ident["ar"]["tokens"]))
        for label in ident:
            del ident[label]["tokens"]
        res["float32_identity"] = ident
        print("identity", ident, flush=True)
        save()
        del target, drafts
        torch.cuda.empty_cache()

    target, tok, drafts = load(torch.bfloat16)
    prompts, warm = encode(tok, rows), encode(tok, warm_rows)

    # ---------------------------------------------------------------- 2. one step
    if "2" in parts:
        steps = {}

        def step_ms(model, n, graph, repeats=30):
            ids = torch.randint(0, 1000, (1, 100), device="cuda")
            runner, = runners_for("graphed" if graph else "eager", model)
            runner.begin(ids.shape[1])
            runner.forward(ids)  # the prefill (eager)
            new = torch.randint(0, 1000, (1, n), device="cuda")
            times = []
            for _ in range(repeats + 3):  # the first calls record the graph (graphed) or warm up
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                runner.forward(torch.cat([ids, new], 1), n)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) * 1e3)
                runner.rollback(100)
            return statistics.median(times[3:])

        with torch.inference_mode():
            for name, model in (("target", target), ("draft-s", drafts["draft-s"]), ("draft-m", drafts["draft-m"])):
                for n in ((1, 5) if name == "target" else (1,)):
                    eager, graph = step_ms(model, n, False), step_ms(model, n, True)
                    steps[f"{name} {n} token{'s' if n > 1 else ''}"] = {"eager_ms": eager, "graphed_ms": graph,
                                                                        "speedup": eager / graph}
        res["step"] = steps
        print("steps", steps, flush=True)
        save()

    # ---------------------------------------------------------------- 3. the loop
    if "3" in parts:
        configs = [("ar", None, 1), ("greedy draft-s", "draft-s", 4), ("greedy draft-m", "draft-m", 4)]
        graph_extra = [(f"greedy draft-s gamma {g}", "draft-s", g) for g in (2, 3, 5, 6)]
        loops = {}

        def bench(mode, label, draft_name, gamma, runners):
            target, draft = runners["target"], runners.get(draft_name)
            method = "ar" if draft is None else "greedy"
            for w in warm:
                gen(target, draft, w, method, gamma)
            out = [gen(target, draft, p, method, gamma) for p in prompts]
            tokens = sum(len(r.new_token_ids) for r in out)
            wall = sum(r.wall_s for r in out)
            rounds = [s for r in out for s in r.rounds]
            loops[f"{mode} | {label}"] = {
                "mode": mode, "method": label, "gamma": gamma, "tokens": tokens, "wall_s": wall,
                "tok_per_s": tokens / wall, "target_calls": sum(r.target_calls for r in out),
                "tau": tokens / sum(r.target_calls for r in out), "ms_per_round": wall / len(rounds) * 1e3,
                "per_prompt_tok_per_s": [len(r.new_token_ids) / r.wall_s for r in out],
                "draft_ms": sum(s.draft_ms for s in rounds), "verify_ms": sum(s.verify_ms for s in rounds),
                "bookkeeping_ms": sum(s.bookkeeping_ms for s in rounds),
                "token_ids": [r.new_token_ids for r in out]}
            print(mode, label, f"{tokens / wall:.1f} tok/s tau {loops[f'{mode} | {label}']['tau']:.2f}", flush=True)

        for mode in ("eager, cuDNN attention", "eager", "graphed"):  # the cuDNN trap first: fresh prompts, fresh shapes
            runners = dict(zip(["target", *drafts], runners_for(mode, target, *drafts.values())))
            for label, d, g in configs + (graph_extra if mode == "graphed" else []):
                bench(mode, label, d, g, runners)
            if mode == "graphed":
                res["graph_captures"] = {"target": runners["target"].captures,
                                         "drafts": sum(runners[name].captures for name in drafts)}
        for key in loops:
            mode = loops[key]["mode"]
            ar = loops[f"{mode} | ar"]["tok_per_s"]
            loops[key]["speedup_vs_ar_same_mode"] = loops[key]["tok_per_s"] / ar
            loops[key]["speedup_vs_eager_ar"] = loops[key]["tok_per_s"] / loops["eager | ar"]["tok_per_s"]
            loops[key]["eq_ar_tokens"] = sum(a == b for a, b in zip(loops[key]["token_ids"],
                                                                     loops[f"{mode} | ar"]["token_ids"]))
        for key in loops:
            del loops[key]["token_ids"]
        res["loop"] = loops
        save()

    # ---------------------------------------------------------------- 4. anatomy of a generation
    if "4" in parts:
        anatomy, profiles = {}, {}
        draft = drafts["draft-s"]
        for mode in ("eager, cuDNN attention", "eager", "graphed"):
            runners = runners_for(mode, target, draft, runner=ClockedRunner)  # warm-up, timing and profile
            for w in warm:
                gen(*runners, w, "greedy")
            total = fwd = 0.0
            for p in prompts[:3]:
                for runner in runners:
                    runner.clocking, runner.spent = True, 0.0
                r = gen(*runners, p, "greedy")
                for runner in runners:
                    runner.clocking = False
                total, fwd = total + r.wall_s, fwd + sum(runner.spent for runner in runners)
            anatomy[mode] = {"wall_s": total, "forward_s": fwd, "outside_forwards": 1 - fwd / total}
            fresh = eval_subset(per_category=1, seed=2)[:1] if mode.startswith("eager, cuDNN") else rows[:1]
            p = encode(tok, fresh)[0]
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                r = gen(*runners, p, "greedy")
            events = prof.key_averages()
            rows_cpu = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
            rows_dev = sorted(events, key=lambda e: getattr(e, "self_device_time_total", 0), reverse=True)[:10]
            launches = sum(e.count for e in events
                           if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
            graph_launches = sum(e.count for e in events if e.key in ("cudaGraphLaunch",))
            profiles[mode] = {
                "rounds": len(r.rounds), "wall_ms": r.wall_s * 1e3, "kernel_launches": launches,
                "graph_launches": graph_launches,
                "device_ms": sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e3,
                "top_host_ops": [{"op": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3, "count": e.count}
                                 for e in rows_cpu],
                "top_device_ops": [{"op": e.key[:80], "self_device_ms": getattr(e, "self_device_time_total", 0) / 1e3,
                                    "count": e.count} for e in rows_dev]}
            print(mode, anatomy[mode], profiles[mode]["kernel_launches"], flush=True)
        res["anatomy"] = anatomy
        res["profile"] = profiles
        save()
    return res


if __name__ == "__main__":
    main()
