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
       "longest-trained drafter's last training batch this predicts more than its held-out tau (the script prints "
       "both): the agreements are measured on training text with the true token before every slot (the Markov "
       "head reads it; at decode time it reads the drafted one, which is the same only while the drafts are "
       "right), on the positions inside the draft vocabulary, and the product treats the slots' errors as "
       "independent while hard text makes them fail together.",
    3: "The two tie when tau_block / r_block = tau_chain / r_chain, that is tau_block = tau_chain * r_block / r_chain "
       "(`break_even`). On the CPU a head step costs a large share of a target step, so six of them make r_chain "
       "large and the block drafter needs far less tau to tie. On a GPU a head step is a few percent of an eager "
       "target step and a wider pass costs about one step, so r_chain and r_block move closer and the block "
       "drafter needs a tau nearer the chain's; the script computes it from the committed H100 step times, with "
       "the block pass priced as one head step (an assumption: it was not measured there).",
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


def main() -> None:
    blocks = json.loads((ROOT / "data/bench/block_drafters_h200.json").read_text())
    run = blocks["runs"]["markov64_9000_steps"]
    gamma = run["block_size"] - 1
    last = run["train_curve"][-1]["agreement"]
    print("1.", ANSWERS[1])
    print(f"   anchors [2, 5, 8], b = 4, n = 10: {allowed_pairs([2, 5, 8], 4)} pairs "
          f"(the mask holds {int(training_mask([2, 5, 8], 10, 4).sum())})")
    print("2.", ANSWERS[2])
    print(f"   predicted from the last training batch: {expected_tau(last, gamma):.2f}; held-out: "
          f"{run['eval'][f'tau_gamma{gamma}']:.2f} (gamma {gamma})")
    print("3.", ANSWERS[3])
    steps = json.loads((ROOT / "data/bench/draft_step_h100.json").read_text())["steps"]
    head_log = json.loads((ROOT / "data/models/eagle-head/config.json").read_text())["log"]
    c_head = steps["eagle-head"]["median_ms"] / steps["target"]["median_ms"]
    r_chain, r_block = 6 * c_head + 1.0, c_head + 1.0  # a wider pass priced as one step on the GPU
    tau_chain = head_log["eval"]["tau_gamma6"]
    print(f"   H100, eager: head step {c_head:.3f} target steps; r_chain {r_chain:.2f}, r_block {r_block:.2f}; "
          f"with the shipped head's tau {tau_chain:.2f} the block drafter ties at tau "
          f"{break_even(tau_chain, r_chain, r_block):.2f}")


if __name__ == "__main__":
    main()
