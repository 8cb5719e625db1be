"""The H100 benchmark of notebook 08: `python -m specdec_lab.tree_attention_bench [--out FILE]` (GPU only).

1. the kernel grid: P in {128, 512, 1024, 2048} x T in {16, 64, 256}, bf16, SmolLM2-135M's heads (9 on 3
   KV heads, head_dim 64): SDPA with the bool mask, SDPA without a mask (the floor), FlexAttention with a
   block mask, both Triton kernels, and two ablations (the walk by loads, no prefix split); GPU time per
   call, 50 calls captured in a CUDA graph and replayed (eager with CUDA events where capture fails);
2. the compiled kernels against the oracle (a time-boxed subset, run last; the CPU tests run the rest);
3. notebook 06's tree methods with the target on each backend: tokens compared with SDPA's (fp32, bf16),
   and one eager tree-verification forward timed per backend.
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

from specdec_utils import generate, get_preset, load_model
from specdec_utils.core import tree as trees
from specdec_utils.core import tree_attention as ta
from specdec_utils.core.graphs import record_cuda_graph
from specdec_utils.core.kv_cache import trim_cache
from specdec_utils.core.medusa import load_heads
from specdec_utils.core.runner import forward_tree
from specdec_utils.prompts import eval_subset, format_prompt
from specdec_utils.utils import REPO_ROOT

DEVICE = "cuda"  # GPU only: main() refuses without one
BACKENDS = ("sdpa", "tree_triton", "tree_triton_masked")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO_ROOT / "data" / "bench" / "tree_attention_gpu_h100_bfloat16.json"))
    parser.add_argument("--parts", default="123", help="which parts to run (1 kernels, 2 correctness, 3 end to end)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or not ta.AVAILABLE:
        parser.exit(2, "tree_attention_bench: needs a CUDA GPU and triton (the committed JSON is the H100 run)\n")
    run(args.out, args.parts)


def random_tree(kind: str, size: int, rng: random.Random) -> list[int]:
    """Parent indices of a `size`-node tree of one shape (-1: the root's child)."""
    if kind == "chain":
        return [i - 1 for i in range(size)]
    if kind == "star":
        return [-1] * size
    if kind == "deep":
        return [-1] + [i - 1 if rng.random() < 0.9 else rng.randrange(-1, i) for i in range(1, size)]
    if kind == "medusa":
        return [-1] + [rng.randrange(max(-1, i - 8), i) for i in range(1, size)]
    return [-1] + [rng.randrange(-1, i) for i in range(1, size)]


def graph_time_us(fn, calls: int = 50, replays: int = 10) -> float:
    """GPU microseconds per call of `fn`: `calls` calls captured in one CUDA graph, replayed `replays` times."""
    def step():  # what the graph records
        for _ in range(calls):
            fn()
    graph, _ = record_cuda_graph(step)  # the package's recorder: a warm-up of the whole step, its own pool
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (calls * replays) * 1e3


def event_time_us(fn, calls: int = 200) -> float:
    """GPU microseconds per call of `fn`, eager, between two CUDA events (where graph capture fails)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls * 1e3


def qkv(prefix: int, size: int, dtype=torch.bfloat16, heads: int = 9, kv_heads: int = 3):
    """Random q [1, heads, size, 64] and k, v [1, kv_heads, prefix + size, 64] on the GPU."""
    q = torch.randn(1, heads, size, 64, device=DEVICE, dtype=dtype)
    k = torch.randn(1, kv_heads, prefix + size, 64, device=DEVICE, dtype=dtype)
    return q, k, torch.randn_like(k)


def kernel_grid(rng: random.Random, started: float) -> dict:
    """Part 1: every kernel's GPU time and largest error against the oracle, per (prefix, tree size)."""
    import torch._dynamo
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    torch._dynamo.config.recompile_limit = 256
    flex = torch.compile(flex_attention, dynamic=False)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    grid = {}
    for prefix in (128, 512, 1024, 2048):
        for size in (16, 64, 256):
            parents = torch.tensor(random_tree("medusa", size, rng), device=DEVICE)
            q, k, v = qkv(prefix, size)
            mask = ta.mask_from_parents(parents, prefix)
            k_full, v_full = k.repeat_interleave(3, 1).contiguous(), v.repeat_interleave(3, 1).contiguous()
            block_mask = create_block_mask(lambda b, h, qi, ki: mask[qi, ki], 1, 1, size, prefix + size,
                                           device=DEVICE, BLOCK_SIZE=128)
            kernels = {
                "sdpa_bool_mask": lambda: sdpa(q, k_full, v_full, attn_mask=mask),
                "sdpa_no_mask": lambda: sdpa(q, k_full, v_full),
                "flex_block_mask": lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=True),
                "triton_masked": lambda: ta.tree_attention_masked(q, k, v, mask),
                "triton_parents": lambda: ta.tree_attention(q, k, v, parents),
                "triton_parents_load_walk": lambda: ta._launch(q, k, v, None, parents.int(), None, False, gather=False),
                "triton_parents_one_split": lambda: ta._launch(q, k, v, None, parents.int(), None, False, splits=1),
            }
            expected = ta.reference(q, k, v, mask).float()
            row = {}
            for name, kernel in kernels.items():
                try:
                    error = (kernel().float() - expected).abs().max().item() if name != "sdpa_no_mask" else None
                    try:
                        us, how = graph_time_us(kernel), "graph"
                    except Exception:
                        torch.cuda.synchronize()
                        us, how = event_time_us(kernel), "eager"
                    row[name] = {"us": round(us, 2), "timed": how,
                                 "max_abs_err": None if error is None else round(error, 4)}
                except Exception as exc:
                    row[name] = {"error": repr(exc)[:150]}
            row["depth"] = int(trees.depths(parents).max())
            grid[f"P{prefix}_T{size}"] = row
            times = {name: entry.get("us") for name, entry in row.items() if isinstance(entry, dict)}
            print(round(time.time() - started), prefix, size, times, flush=True)
    return grid


def end_to_end(rng: random.Random, started: float) -> dict:
    """Part 3: notebook 06's tree methods with the target on each backend."""
    torch.backends.cuda.enable_cudnn_sdp(False)  # cuDNN's SDPA re-plans every new shape
    preset = get_preset()
    prompts, new_tokens = 6, 48
    rows = eval_subset(2)[:prompts]
    result = {"prompts": prompts, "new_tokens": new_tokens, "cudnn_sdp": False}
    settings = [("medusa", {"tree_nodes": 16}), ("medusa", {"tree_nodes": 64}),
                ("draft-tree", {"width": 2, "tree_nodes": 8})]
    for dtype_name in ("float32", "bfloat16"):
        dtype = getattr(torch, dtype_name)
        target, tokenizer = load_model(preset["medusa_target"], device=DEVICE, dtype=dtype)
        draft = load_model(preset["tree_draft"], device=DEVICE, dtype=dtype)[0]
        heads = load_heads(preset["heads"], target)
        prompt_ids = [tokenizer(format_prompt(tokenizer, row), return_tensors="pt").input_ids.to(DEVICE)
                      for row in rows]
        same = {}
        for method, params in settings:
            reference = None
            for backend in BACKENDS:
                ta.use_backend(target, backend)
                outs = [generate(target, ids, new_tokens, method=method, draft=draft, heads=heads, gamma=4,
                                 params=params, eos_token_id=tokenizer.eos_token_id) for ids in prompt_ids]
                tokens = [out.new_token_ids for out in outs]
                if backend == "sdpa":
                    reference = tokens
                tau = sum(len(out.new_token_ids) for out in outs) / sum(out.target_calls for out in outs)
                same[f"{method} {params} {backend}"] = {
                    "identical_to_sdpa": sum(a == b for a, b in zip(tokens, reference)), "of": prompts,
                    "tau": round(tau, 3)}
            print(round(time.time() - started), dtype_name, method, params,
                  {key: value for key, value in same.items() if key.startswith(method)}, flush=True)
        result[f"tokens_{dtype_name}"] = same
        if dtype_name == "bfloat16":
            result["verification_step_ms_eager"] = verification_steps(target, prompt_ids[0], rng, started)
        ta.use_backend(target, "sdpa")
        del target, draft, heads
    return result


def verification_steps(target, prompt_ids: torch.Tensor, rng: random.Random, started: float) -> dict:
    """Milliseconds of one eager tree-verification forward per backend (median of 20 after 5 warm-ups)."""
    steps = {}
    for prefix in (len(prompt_ids[0]), 1024):
        ids = prompt_ids if prefix != 1024 else torch.randint(100, 40000, (1, 1024), device=DEVICE)
        for size in (16, 64):
            parents = torch.tensor(random_tree("medusa", size, rng))
            nodes = torch.randint(100, 40000, (size,), device=DEVICE)
            row = {}
            for backend in BACKENDS:
                ta.use_backend(target, backend)
                with torch.no_grad():
                    _, cache = forward_tree(target, ids[:, :-1], nodes[:0], parents[:0], None, num_logits=1)
                    committed = ids.shape[1] - 1
                    times = []
                    for _ in range(25):
                        torch.cuda.synchronize()
                        start = time.perf_counter()
                        forward_tree(target, ids, nodes, parents, cache, num_logits=size + 1)
                        torch.cuda.synchronize()
                        times.append((time.perf_counter() - start) * 1e3)
                        trim_cache(cache, committed)
                row[backend] = round(statistics.median(times[5:]), 2)
            steps[f"P{prefix}_T{size}"] = row
            print(round(time.time() - started), "step", prefix, size, row, flush=True)
    return steps


def correctness(rng: random.Random) -> dict:
    """Part 2: both compiled kernels against the oracle."""
    tolerance = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
    worst, failures, count = {}, [], 0
    cases = [(torch.bfloat16, size, prefix, kind, (9, 3))
             for size in (1, 100, 256) for prefix in (0, 1000) for kind in ("chain", "star", "deep")]
    cases += [(torch.bfloat16, 100, 1000, "random", (4, 4))]
    cases += [(dtype, 100, 1000, "deep", (9, 3)) for dtype in (torch.float16, torch.float32)]
    for dtype, size, prefix, kind, (heads, kv_heads) in cases:
        parents = torch.tensor(random_tree(kind, size, rng), device=DEVICE)
        q, k, v = qkv(prefix, size, dtype, heads, kv_heads)
        mask = ta.mask_from_parents(parents, prefix)
        expected = ta.reference(q, k, v, mask).float()
        for name, out in (("parents", ta.tree_attention(q, k, v, parents)),
                          ("masked", ta.tree_attention_masked(q, k, v, mask))):
            error = (out.float() - expected).abs().max().item()
            count += 1
            key = str(dtype).split(".")[1]
            worst[key] = max(worst.get(key, 0), error)
            if error > tolerance[key]:
                failures.append((key, size, prefix, kind, heads, name, error))
    return {"cases": count, "worst_abs_err": worst, "tolerance": tolerance, "failures": failures[:20],
            "max_depth": 256}


def run(out_path, parts: str):
    """Run the chosen parts (a string of '1', '2', '3') in the order 1, 3, 2, writing the results after each;
    part 2 only while the run is under 7 minutes old."""
    import triton
    started = time.time()
    rng = random.Random(0)
    torch.manual_seed(0)
    results = {"device": torch.cuda.get_device_name(), "dtype": "bfloat16",
               "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                            "triton": triton.__version__},
               "date": datetime.date.today().isoformat(),
               "timing": "GPU time per call: 50 calls captured in a CUDA graph, replayed 10 times "
                         "(eager with events where capture fails)",
               "shapes": "B=1, 9 query heads on 3 KV heads, head_dim 64 (SmolLM2-135M's attention)"}

    def save():
        with open(out_path, "w") as file:
            json.dump(results, file, indent=1)

    if "1" in parts:
        results["grid"] = kernel_grid(rng, started)
        save()
    if "3" in parts:
        results["end_to_end"] = end_to_end(rng, started)
        save()
    if "2" in parts and time.time() - started < 420:
        results["correctness"] = correctness(rng)
        print(round(time.time() - started), results["correctness"], flush=True)
        save()
    print("done", round(time.time() - started), flush=True)


if __name__ == "__main__":
    main()
