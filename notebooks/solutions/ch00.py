"""Solutions to the exercises of notebook 00 (why decoding is slow); `tests/test_solutions.py` checks them.

The numbers these exercises ask for depend on the machine, so the code computes them; each function's
docstring says the answer in words and what to look at. Run them in notebook 00 after its section 2, e.g.
`best_gamma_measured(0.7, 0.08, NEW_TOKENS, latency_ms[LOW])`.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from specdec_utils.theory import expected_accepted_length, optimal_gamma
from specdec_utils.utils import time_fn


# Exercise 1 ------------------------------------------------------------------------------------
def verify_cost_ratio(new_tokens, latency_ms, k: float) -> float:
    """T(k) / T(1): the measured cost of a pass over k tokens in one-token passes, linearly interpolated
    between the measured k of section 2 (`NEW_TOKENS`, `latency_ms[dtype]`)."""
    return float(np.interp(k, new_tokens, latency_ms)) / float(latency_ms[0])


def speedup_with_measured_verify(alpha: float, gamma: int, c: float, verify_ratio: float) -> float:
    """Theorem 3.8 with the "1" of gamma c + 1 replaced by the measured T(gamma + 1) / T(1)."""
    return float(expected_accepted_length(alpha, gamma)) / (gamma * c + verify_ratio)


def best_gamma_measured(alpha: float, c: float, new_tokens, latency_ms, max_gamma: int | None = None) -> int:
    """The best gamma once verification is charged its measured cost.

    Answer: the shape of T(k) moves the best gamma, not just its level. Charging T(gamma + 1) / T(1) instead
    of 1 lowers the speedups where a wide pass costs more than a 1-token pass, and raises them where it
    measured less. If most of the growth is one step from 1 to 2 tokens and later tokens add little (float32
    on the course CPU: the matrix-matrix kernel's price up front), that step is paid once per round whatever
    gamma is, so the best gamma tends to move up; if every extra token adds cost (a steady, steep curve, as
    bfloat16 has on a CPU without bfloat16 instructions), it moves down; on a flat curve the textbook optimum
    survives up to timing noise (a step either way). Compare the result with
    `optimal_gamma(alpha, c)` for each dtype: the gap between them measures how far "verification is
    nearly free" is from true on your machine. gamma + 1 must stay within the measured k (at most 16)."""
    max_gamma = max_gamma or int(max(new_tokens)) - 1
    gammas = range(1, max_gamma + 1)
    return max(gammas, key=lambda g: speedup_with_measured_verify(
        alpha, g, c, verify_cost_ratio(new_tokens, latency_ms, g + 1)))


def textbook_gamma(alpha: float, c: float, max_gamma: int = 15) -> int:
    """The formula's best gamma (verification at the price of one pass), for comparison."""
    return optimal_gamma(alpha, c, max_gamma=max_gamma)


# Exercise 2 ------------------------------------------------------------------------------------
def kv_cache_bytes(config, length: int, bytes_per_value: int) -> int:
    """Bytes of keys and values attention reads in every pass over a cache of `length` positions:
    2 (keys and values) x layers x KV heads x head dim x length.

    Answer: with PROMPT_LEN = 512 the 1-token pass gets a little slower, and only a little: the part of
    the model that grows with the cache length is attention (it reads every cached key and value and
    computes a score for each position), while the weight products, most of the pass, do not change.
    For the course's target this cache is a few percent of the weights' bytes at 512 positions (compare
    `kv_cache_bytes(config, 512, 4)` with `weight_bytes[torch.float32]`), so the section 2 curve keeps its
    shape: a pass over several new tokens still costs far less than several passes. The cache catches up
    with the weights only at thousands of positions or with large batches."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * length * bytes_per_value


@torch.no_grad()
def forward_ms_at(model, prompt_len: int, num_new: int, repeats: int = 5, seed: int = 0) -> float:
    """Median ms of one pass over `num_new` random tokens on top of a `prompt_len`-position cache
    (random tokens: the values do not change the time)."""
    from specdec_utils import trim_cache
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(vocab, (1, prompt_len + num_new), generator=torch.Generator().manual_seed(seed))
    cache = model(input_ids=ids[:, :prompt_len], use_cache=True).past_key_values

    def step():
        model(input_ids=ids[:, prompt_len:], past_key_values=cache, use_cache=True)
        trim_cache(cache, prompt_len)
    return time_fn(step, repeats=repeats, warmup=1)["median"] * 1e3


# Exercise 3 ------------------------------------------------------------------------------------
def matmul_rates(hidden: int, intermediate: int, rows=(1, 2, 4, 16, 256), dtype=torch.float32,
                 repeats: int = 5) -> dict:
    """GFLOP/s of x @ W.T (x: rows x hidden, W: intermediate x hidden) for each number of rows.

    Answer: the rate grows with the number of rows and saturates somewhere between tens and a few hundred
    rows. With 1 or 2 rows the product is bound by reading W, so its rate grows about in proportion to the
    rows; at 16 rows it is still well below the 256-row rate of section 2. That is why the 16-token float32
    pass took several times the arithmetic estimate (which assumed the 256-row rate), and why the extra
    rows after the first step up come almost for free: the kernel is not yet using its arithmetic."""
    rates = {}
    for k in rows:
        x = torch.randn(k, hidden).to(dtype)
        w = torch.randn(intermediate, hidden).to(dtype)
        seconds = time_fn(lambda: torch.nn.functional.linear(x, w), repeats=repeats, warmup=1)["median"]
        rates[k] = 2 * k * hidden * intermediate / seconds / 1e9
    return rates


# Exercise 4 ------------------------------------------------------------------------------------
def thread_slowdown(model, num_new_tokens=(1, 16), prompt_len: int = 64, threads: int = 1, repeats: int = 5) -> dict:
    """Time of a pass over k tokens with `threads` threads divided by its time with the current number,
    for each k (the thread count is restored afterwards).

    Answer: a pass limited by arithmetic slows by up to the ratio of the thread counts (about 2x from two
    cores to one); a pass limited by memory bandwidth or by per-operator overhead slows much less, since
    one core can already stream most of the bandwidth and Python launches operators one at a time anyway.
    On the course CPU the 16-token pass slows more than the 1-token pass: the wide pass is the one limited
    by compute, the 1-token pass is not."""
    before = torch.get_num_threads()
    base = {k: forward_ms_at(model, prompt_len, k, repeats) for k in num_new_tokens}
    torch.set_num_threads(threads)
    try:
        fewer = {k: forward_ms_at(model, prompt_len, k, repeats) for k in num_new_tokens}
    finally:
        torch.set_num_threads(before)
    return {k: fewer[k] / base[k] for k in num_new_tokens}


# Exercise 5 ------------------------------------------------------------------------------------
@torch.no_grad()
def generate_vs_loop(model, input_ids, steps: int, greedy_decode) -> dict:
    """Milliseconds per token of `model.generate(..., do_sample=False)` and of notebook 00's
    `greedy_decode`, and whether they produced the same tokens.

    Answer: both run the same model the same number of times and give the same tokens; the difference is
    the work around each forward. `generate` prepares and updates its inputs every step (attention mask,
    cache positions, model kwargs), runs logits processors and stopping criteria, and keeps scores it may
    return; `greedy_decode` does only the forward and an argmax. On the course CPU a step takes tens of ms,
    so that overhead is a few percent at most; on a GPU, where a small model's step takes a few ms, it is a
    much larger share, which is one reason engines write their own decode loops."""
    start = time.perf_counter()
    ours = greedy_decode(model, input_ids, steps)
    loop_ms = (time.perf_counter() - start) * 1e3 / steps
    mask = torch.ones_like(input_ids)
    start = time.perf_counter()
    out = model.generate(input_ids, attention_mask=mask, max_new_tokens=steps, do_sample=False, pad_token_id=0)
    theirs = out[0, input_ids.shape[1]:].tolist()  # may stop early at an end-of-sequence token
    generate_ms = (time.perf_counter() - start) * 1e3 / max(len(theirs), 1)
    return {"loop_ms": loop_ms, "generate_ms": generate_ms, "same_tokens": theirs == list(ours)[:len(theirs)]}


# Exercise 6 ------------------------------------------------------------------------------------
def compiled_step_ms(model, input_ids, steps: int = 32, max_cache_len: int = 256) -> float:
    """GPU only: ms per token of greedy decoding with a transformers StaticCache and the forward wrapped
    in `torch.compile(mode="reduce-overhead")` (CUDA graphs), after warm-up.

    Answer: yes, on a GPU the static cache pays off once the step is compiled: fixed shapes and addresses
    let CUDA graphs replay the whole step without Python or kernel-launch overhead, and a small model's
    eager step is mostly that overhead. The course's own H100 measurement (the last table of notebook 00's lab
    page, `data/bench/engine_gpu_h100.json`) shows the target step several times faster captured in a CUDA graph
    than eager. On a CPU there are no kernel launches to save; the lab page times the static cache there in eager
    mode."""
    from transformers import StaticCache
    if not torch.cuda.is_available():
        raise RuntimeError("exercise 6 needs a GPU (SPECDEC_PRESET=colab-gpu)")
    step = torch.compile(model.forward, mode="reduce-overhead")

    @torch.no_grad()
    def decode():
        cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
        ids, length = input_ids, 0
        for _ in range(steps):
            positions = torch.arange(length, length + ids.shape[1], device=ids.device)
            logits = step(input_ids=ids, past_key_values=cache, cache_position=positions, use_cache=True).logits
            length += ids.shape[1]
            ids = logits[:, -1:].argmax(-1)
    for _ in range(3):  # compile and capture
        decode()
    torch.cuda.synchronize()
    start = time.perf_counter()
    decode()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / steps


# The answers in words, by exercise number (each is the docstring of the function that computes it).
ANSWERS = {1: best_gamma_measured.__doc__, 2: kv_cache_bytes.__doc__, 3: matmul_rates.__doc__,
           4: thread_slowdown.__doc__, 5: generate_vs_loop.__doc__, 6: compiled_step_ms.__doc__}
