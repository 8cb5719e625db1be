"""Solutions to notebook 11's exercises (checked by tests/test_solutions.py).

Each exercise has code and, in `ANSWERS`, its answer in words; `python notebooks/solutions/ch11.py` prints the
answers with the numbers the code computes from the committed measurements (none is typed here).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

ANSWERS = {
    1: "Each of the b slots of the block anchored at s reads the s context positions before its anchor and the b "
       "slots of its own block, so the mask allows b * (s_1 + ... + s_A) + A * b^2 pairs (`allowed_pairs`; "
       "`training_mask` builds it and the count is checked on it). A causal mask over [context | blocks] would let "
       "a block read context positions at and after its anchor (the features of x_s already hold what comes "
       "next: at decode time they do not exist yet) and the slots of every earlier block (another round's "
       "drafts); it would also take away the pairs from a slot to the slots after it in its own block, which the "
       "decode-time pass has.",
    2: "A greedy round at gamma keeps draft i only if drafts 1..i were all right, so with per-slot agreements "
       "a_1..a_gamma it commits 1 + a_1 + a_1 a_2 + ... + a_1...a_gamma tokens on average (`expected_tau`). From the "
       "shipped drafter's last training batch this predicts more than its held-out tau (the script prints "
       "both). The training agreement compares argmaxes inside the draft vocabulary, so where the target's own "
       "choice lies outside it a 'match' is no match; it is measured on one batch of training text, which the "
       "target wrote in bfloat16, against held-out prompts in float32; and a held-out round near the end of a "
       "64-token continuation cannot keep all gamma drafts. (The product of per-slot agreements is no upper bound: "
       "if hard text makes slots fail together, all-right rounds are more common than the product says.)",
    3: "The two tie when tau_block / r_block = tau_chain / r_chain, that is tau_block = tau_chain * r_block / r_chain "
       "(`break_even`). The script computes it from a CPU run's costs and from the H100's step times. Where the "
       "verification pass dominates both rounds and six head steps cost about what one block pass with its walk "
       "costs, r_chain and r_block are close and the block drafter must nearly match the chain's tau; where the head "
       "steps are a larger share of the chain's round than the block pass is of the block's (the H100's eager "
       "steps, priced as in the exercise), the block drafter ties with a lower tau. The block pass's price on the GPU "
       "is an assumption: its slot-by-slot walk synchronises with the host unless the loop runs on the device.",
    4: "The context's keys and values depend only on the context features, their positions and the layer's own k and "
       "v weights, never on the block: so each layer can project a position once, when its features arrive, and keep "
       "the result (`context_kv`); a round then projects only the b slots and attends over [cached context | block] "
       "(`block_layer_cached`), which equals `block_layer` (the script checks it on a small untrained drafter). "
       "Without the cache a round's k and v projections of the context grow with the context's length n; with it "
       "they cost the positions committed since the last round, a handful, whatever n is. The attention itself still "
       "reads all n cached keys: that part grows with n either way, as it does in the target.",
}


# 1. The mask by hand -----------------------------------------------------------------------
def training_mask(starts: list[int], n: int, b: int) -> torch.Tensor:
    """The training mask over [n context positions | A blocks of b slots] for blocks anchored at `starts`
    ([A * b, n + A * b], True = may attend): a slot reads the context before its anchor and its own block."""
    A = len(starts)
    context = torch.arange(n)[None, :] < torch.tensor(starts).repeat_interleave(b)[:, None]
    block = torch.eye(A, dtype=torch.bool).repeat_interleave(b, 0).repeat_interleave(b, 1)
    return torch.cat([context, block], 1)


def allowed_pairs(starts: list[int], b: int) -> int:
    """The number of True entries of `training_mask(starts, n, b)`, in closed form."""
    return b * sum(starts) + len(starts) * b * b


# 2. From per-slot agreement to tau ------------------------------------------------------------
def expected_tau(agreement: list[float], gamma: int) -> float:
    """Expected tokens per greedy round at `gamma` from per-slot agreements a_1..a_gamma (independent slots)."""
    tau, keep = 1.0, 1.0
    for a in agreement[:gamma]:
        keep *= a
        tau += keep
    return tau


# 3. Break-even ----------------------------------------------------------------------------
def break_even(tau_chain: float, r_chain: float, r_block: float) -> float:
    """The block drafter's tau at which its tokens per target step equal the chain's."""
    return tau_chain * r_block / r_chain


# 4. Cache the context's keys and values ------------------------------------------------------
def context_kv(layer, context: torch.Tensor, context_rope) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's keys (rotated) and values of the context [B, n, H]: [B, n_kv, n, head_dim] each. They depend only
    on the context, so a decoder computes them once per position and keeps them."""
    def heads(t, proj):
        return proj(t).view(*t.shape[:-1], layer.n_kv, layer.head_dim).transpose(-2, -3)
    cos, sin = context_rope
    k = heads(context, layer.k)
    half = k.shape[-1] // 2
    return k * cos + torch.cat([-k[..., half:], k[..., :half]], -1) * sin, heads(context, layer.v)


def block_layer_cached(layer, x: torch.Tensor, cached, block_rope, mask) -> torch.Tensor:
    """The notebook's `block_layer` with the context's keys and values taken from `context_kv`'s cache."""
    import torch.nn.functional as F

    def heads(t, proj, count, rope=None):
        y = proj(t).view(*t.shape[:-1], count, layer.head_dim).transpose(-2, -3)
        if rope is None:
            return y
        cos, sin = rope
        half = y.shape[-1] // 2
        return y * cos + torch.cat([-y[..., half:], y[..., :half]], -1) * sin

    h = layer.in_norm(x)
    q = heads(h, layer.q, layer.n_heads, block_rope)
    k = torch.cat([cached[0], heads(h, layer.k, layer.n_kv, block_rope)], -2)
    v = torch.cat([cached[1], heads(h, layer.v, layer.n_kv)], -2)
    group = layer.n_heads // layer.n_kv
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
    x = x + layer.o(attended.transpose(-2, -3).flatten(-2))
    n = layer.post_norm(x)
    return x + layer.down(F.silu(layer.gate(n)) * layer.up(n))


def cached_check(n: int = 12, b: int = 4) -> float:
    """The largest difference between the cached layer and the package's layer on a small untrained drafter."""
    from specdec_utils.core.block import block_drafter_for
    from specdec_utils.models import tiny_model
    drafter = block_drafter_for(tiny_model("tiny-llama", seed=0).eval(), b, layers=2, seed=1).eval()
    g = torch.Generator().manual_seed(0)
    x, context = torch.randn(1, b, drafter.hidden_size, generator=g), torch.randn(1, n, drafter.hidden_size, generator=g)
    rope_block, rope_context = drafter._rope(n + torch.arange(b)[None]), drafter._rope(torch.arange(n)[None])
    mask = torch.ones(1, b, n + b, dtype=torch.bool)
    with torch.no_grad():
        return max(float((block_layer_cached(layer, x, context_kv(layer, context, rope_context), rope_block, mask)
                          - layer(x, context, rope_block, rope_context, mask)).abs().max()) for layer in drafter.layers)


def main() -> None:
    shipped = json.loads((ROOT / "data/models/block-drafter/config.json").read_text())
    run = shipped["log"]
    gamma = shipped["block_size"] - 1
    last = run["train_log"][-1]["agreement"]
    print("1.", ANSWERS[1])
    print(f"   anchors [2, 5, 8], b = 4, n = 10: {allowed_pairs([2, 5, 8], 4)} pairs "
          f"(the mask holds {int(training_mask([2, 5, 8], 10, 4).sum())})")
    print("2.", ANSWERS[2])
    print(f"   predicted from the last training batch: {expected_tau(last, gamma):.2f}; held-out: "
          f"{run['eval'][f'tau_gamma{gamma}']:.2f} (gamma {gamma})")
    print("3.", ANSWERS[3])
    cpu = json.loads((ROOT / "data/bench/block_cpu_avx512_bfloat16.json").read_text())["costs_target_steps"]
    tau_chain = json.loads((ROOT / "data/models/eagle-head/config.json").read_text())["log"]["eval"]["tau_gamma6"]
    r_chain, r_block = 6 * cpu["eagle-head"] + cpu["target x7"], cpu["block-drafter"] + cpu["target x8"]
    print(f"   CPU (bfloat16, the committed block benchmark's costs): r_chain {r_chain:.2f}, r_block {r_block:.2f}; "
          f"with the shipped head's tau {tau_chain:.2f} the block drafter ties at tau "
          f"{break_even(tau_chain, r_chain, r_block):.2f}")
    steps = json.loads((ROOT / "data/bench/draft_step_h100.json").read_text())["steps"]
    c_head = steps["eagle-head"]["median_ms"] / steps["target"]["median_ms"]
    r_chain, r_block = 6 * c_head + 1.0, c_head + 1.0  # a wider pass priced as one step on the GPU
    print(f"   H100, eager: head step {c_head:.3f} target steps; r_chain {r_chain:.2f}, r_block {r_block:.2f}; "
          f"with the shipped head's tau {tau_chain:.2f} the block drafter ties at tau "
          f"{break_even(tau_chain, r_chain, r_block):.2f}")
    print("4.", ANSWERS[4])
    print(f"   cached layer against the package's layer, largest difference {cached_check():.1e}")


if __name__ == "__main__":
    main()
