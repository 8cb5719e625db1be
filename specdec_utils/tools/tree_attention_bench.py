"""The H100 benchmark of notebook 07: `python -m specdec_utils.tools.tree_attention_bench [--out FILE]` (GPU only).

1. the kernel grid: P in {128, 512, 1024, 2048} x T in {16, 64, 256}, bf16, SmolLM2-135M's heads (9 on 3
   KV heads, head_dim 64): SDPA with the bool mask, SDPA without a mask (the floor), FlexAttention with a
   block mask, both Triton kernels, and two ablations (the walk by loads, no prefix split); GPU time per
   call, 50 calls captured in a CUDA graph and replayed (eager with CUDA events where capture fails);
2. notebook 06's tree methods with the target on each backend: tokens compared with SDPA's (fp32, bf16),
   and one eager tree-verification forward timed per backend;
3. the compiled kernels against the oracle (a time-boxed subset; the CPU tests run the rest).
Writes data/bench/tree_attention_gpu_h100_bfloat16.json by default. Needs the offline target prepared
(`python -m specdec_utils --prepare`)."""
import argparse
import datetime
import json
import random
import statistics
import time

import torch

import transformers

from .. import generate, get_preset, load_model

from ..core import tree as trees

from ..core import tree_attention as ta
from ..core.kv_cache import trim_cache
from ..core.medusa import load_heads
from ..prompts import eval_subset, format_prompt
from ..utils import REPO_ROOT

dev = "cuda"  # GPU only: main() refuses without one


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO_ROOT / "data" / "bench" / "tree_attention_gpu_h100_bfloat16.json"))
    parser.add_argument("--parts", default="123", help="which parts to run (1 kernels, 2 correctness, 3 end to end)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or not ta.AVAILABLE:
        parser.exit(2, "tree_attention_bench: needs a CUDA GPU and triton (the committed JSON is the H100 run)\n")
    run(args.out, args.parts)


def run(out_path, PART):
    import triton
    T0 = time.time(); rng = random.Random(0); torch.manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "dtype": "bfloat16",
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "triton": triton.__version__},
           "date": datetime.date.today().isoformat(), "timing": "GPU time per call: 50 calls captured in a CUDA graph, replayed 10 times (eager with events where capture fails)",
           "shapes": "B=1, 9 query heads on 3 KV heads, head_dim 64 (SmolLM2-135M's attention)"}
    def save():
        json.dump(res, open(out_path, "w"), indent=1)

    def tree(kind, T):
        if kind == "chain": return [i - 1 for i in range(T)]
        if kind == "star": return [-1] * T
        if kind == "deep": return [-1] + [i - 1 if rng.random() < 0.9 else rng.randrange(-1, i) for i in range(1, T)]
        if kind == "medusa": return [-1] + [rng.randrange(max(-1, i - 8), i) for i in range(1, T)]
        return [-1] + [rng.randrange(-1, i) for i in range(1, T)]

    def gtime(fn, n=50, reps=10):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for _ in range(3): fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n): fn()
        g.replay(); torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps): g.replay()
        e1.record(); torch.cuda.synchronize()
        return e0.elapsed_time(e1) / (n * reps) * 1e3

    def etime(fn, n=200):
        for _ in range(5): fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(n): fn()
        e1.record(); torch.cuda.synchronize()
        return e0.elapsed_time(e1) / n * 1e3

    def qkv(P, T, dt=torch.bfloat16, H=9, Hkv=3):
        q = torch.randn(1, H, T, 64, device=dev, dtype=dt); k = torch.randn(1, Hkv, P + T, 64, device=dev, dtype=dt)
        return q, k, torch.randn_like(k)

    if "1" in PART:  # 1. the kernel grid
        import torch._dynamo
        torch._dynamo.config.recompile_limit = 256
        from torch.nn.attention.flex_attention import flex_attention, create_block_mask
        flex = torch.compile(flex_attention, dynamic=False)
        grid = {}
        for P in (128, 512, 1024, 2048):
            for T in (16, 64, 256):
                parents = torch.tensor(tree("medusa", T), device=dev); q, k, v = qkv(P, T)
                mask = ta.mask_from_parents(parents, P)
                kk, vv = k.repeat_interleave(3, 1).contiguous(), v.repeat_interleave(3, 1).contiguous()
                bm = create_block_mask(lambda b, h, qi, ki: mask[qi, ki], 1, 1, T, P + T, device=dev, BLOCK_SIZE=128)
                fns = {"sdpa_bool_mask": lambda: torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask),
                       "sdpa_no_mask": lambda: torch.nn.functional.scaled_dot_product_attention(q, kk, vv),
                       "flex_block_mask": lambda: flex(q, k, v, block_mask=bm, enable_gqa=True),
                       "triton_masked": lambda: ta.tree_attention_masked(q, k, v, mask),
                       "triton_parents": lambda: ta.tree_attention(q, k, v, parents),
                       "triton_parents_load_walk": lambda: ta._launch(q, k, v, None, parents.int(), None, False, gather=False),
                       "triton_parents_one_split": lambda: ta._launch(q, k, v, None, parents.int(), None, False, splits=1)}
                ref = ta.reference(q, k, v, mask).float(); out = {}
                for name, fn in fns.items():
                    try:
                        err = (fn().float() - ref).abs().max().item() if name != "sdpa_no_mask" else None
                        try: t = gtime(fn); how = "graph"
                        except Exception: torch.cuda.synchronize(); t = etime(fn); how = "eager"
                        out[name] = {"us": round(t, 2), "timed": how, "max_abs_err": None if err is None else round(err, 4)}
                    except Exception as exc:
                        out[name] = {"error": repr(exc)[:150]}
                out["depth"] = int(trees.depths(parents).max())
                grid[f"P{P}_T{T}"] = out
                print(round(time.time() - T0), P, T, {k_: v_.get("us") for k_, v_ in out.items() if isinstance(v_, dict)}, flush=True)
        res["grid"] = grid; save()

    if "3" in PART:  # 3. the target's tree verification on each backend
        torch.backends.cuda.enable_cudnn_sdp(False)  # issue 13's trap: cuDNN SDPA re-plans every new shape
        preset = get_preset()
        N, NEW = 6, 48
        rows = eval_subset(2)[:N]
        e2e = {"prompts": N, "new_tokens": NEW, "cudnn_sdp": False}
        settings = [("medusa", {"tree_nodes": 16}), ("medusa", {"tree_nodes": 64}), ("draft-tree", {"width": 2, "tree_nodes": 8})]
        for dtn in ("float32", "bfloat16"):
            dt = getattr(torch, dtn)
            target, tok = load_model(preset["medusa_target"], device=dev, dtype=dt)
            draft = load_model(preset["tree_draft"], device=dev, dtype=dt)[0]
            heads = load_heads(preset["heads"], target)
            ids_all = [tok(format_prompt(tok, r), return_tensors="pt").input_ids.to(dev) for r in rows]
            same = {}
            for method, params in settings:
                ref = None
                for be in ("sdpa", "tree_triton", "tree_triton_masked"):
                    ta.use_backend(target, be)
                    outs = [generate(target, ids, NEW, method=method, draft=draft, heads=heads, gamma=4, params=params,
                                     eos_token_id=tok.eos_token_id) for ids in ids_all]
                    toks = [o.new_token_ids for o in outs]
                    if be == "sdpa": ref = toks
                    same[f"{method} {params} {be}"] = {"identical_to_sdpa": sum(a == b for a, b in zip(toks, ref)), "of": N,
                        "tau": round(sum(len(o.new_token_ids) for o in outs) / sum(o.target_calls for o in outs), 3)}
                print(round(time.time() - T0), dtn, method, params, {k_: v_ for k_, v_ in same.items() if k_.startswith(method)}, flush=True)
            e2e[f"tokens_{dtn}"] = same
            if dtn == "bfloat16":  # the verification forward's time per backend, eager
                steps = {}
                for P_len in (len(ids_all[0][0]), 1024):
                    ids = ids_all[0] if P_len != 1024 else torch.randint(100, 40000, (1, 1024), device=dev)
                    for T in (16, 64):
                        parents = torch.tensor(tree("medusa", T)); nodes = torch.randint(100, 40000, (T,), device=dev)
                        row = {}
                        for be in ("sdpa", "tree_triton", "tree_triton_masked"):
                            ta.use_backend(target, be)
                            with torch.no_grad():
                                _, cache = trees.forward_tree(target, ids[:, :-1], nodes[:0], parents[:0], None, num_logits=1)
                                L = ids.shape[1] - 1; ts = []
                                for i in range(25):
                                    torch.cuda.synchronize(); t0 = time.perf_counter()
                                    trees.forward_tree(target, ids, nodes, parents, cache, num_logits=T + 1)
                                    torch.cuda.synchronize(); ts.append((time.perf_counter() - t0) * 1e3)
                                    trim_cache(cache, L)
                            row[be] = round(statistics.median(ts[5:]), 2)
                        steps[f"P{P_len}_T{T}"] = row
                        print(round(time.time() - T0), "step", P_len, T, row, flush=True)
                e2e["verification_step_ms_eager"] = steps
            ta.use_backend(target, "sdpa")
            del target, draft, heads
        res["end_to_end"] = e2e; save()
    if "2" in PART and time.time() - T0 < 420:  # 2. correctness of the compiled kernels
        tol = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
        worst, fails, n = {}, [], 0
        cases = [(torch.bfloat16, T, P, kind, (9, 3)) for T in (1, 100, 256) for P in (0, 1000) for kind in ("chain", "star", "deep")]
        cases += [(torch.bfloat16, 100, 1000, "random", (4, 4))]
        cases += [(dt, 100, 1000, "deep", (9, 3)) for dt in (torch.float16, torch.float32)]
        for dt, T, P, kind, (H, Hkv) in cases:
            parents = torch.tensor(tree(kind, T), device=dev); q, k, v = qkv(P, T, dt, H, Hkv)
            mask = ta.mask_from_parents(parents, P); ref = ta.reference(q, k, v, mask).float()
            for name, o in (("parents", ta.tree_attention(q, k, v, parents)), ("masked", ta.tree_attention_masked(q, k, v, mask))):
                e = (o.float() - ref).abs().max().item(); n += 1
                key = str(dt).split(".")[1]; worst[key] = max(worst.get(key, 0), e)
                if e > tol[key]: fails.append((key, T, P, kind, H, name, e))
        res["correctness"] = {"cases": n, "worst_abs_err": worst, "tolerance": tol, "failures": fails[:20], "max_depth": 256}
        print(round(time.time() - T0), res["correctness"], flush=True); save()

    print("done", round(time.time() - T0), flush=True)


if __name__ == "__main__":
    main()
