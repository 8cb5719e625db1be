"""Solutions to notebook 07's exercises (checked by tests/test_solutions.py).

Each exercise has code and, in `ANSWERS`, its answer in words; `python notebooks/solutions/ch07.py` prints the
answers with the numbers the code computes (exercise 3 reads the shipped head's committed training log, so its
numbers are computed here, not typed).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

ANSWERS = {
    1: "For n = 3 positions and 2 unrolled steps the mask has 15 allowed pairs: step 0 is the ordinary causal "
       "mask (1 + 2 + 3 = 6), and step 1 at position j sees the step-0 entries 0..j plus itself (2 + 3 + 4 = 9). "
       "In general, for S unrolled steps, S n(n+1)/2 + n S(S-1)/2 (`allowed_pairs`). A plain causal mask over the 6 "
       "entries laid out step by step would allow 21: it would let a step-1 entry see step-0 entries at later "
       "positions (tokens it has not drafted yet: the future) and other positions' step-1 entries (drafts of "
       "another round), neither of which exists at decode time.",
    2: "With every step placed at position j instead of j + s, step 0 is unchanged (it sits at j anyway) but every "
       "later step differs from the package's `ttt_forward` (`position_bug_gap` prints the largest difference). "
       "RoPE makes attention depend on the distance between positions: at decode time draft s + 1 sits s positions "
       "after the last committed entry, so a head trained at the wrong distances learns a relation it never meets "
       "when it drafts. The bug raises no error: only the comparison with the decode-time forward catches it.",
    3: "With g_s the agreement of unrolled step s on training batches (its inputs are the true tokens, so g_s is the "
       "chance that draft s + 1 is right when the earlier ones were), a greedy chain of gamma drafts keeps "
       "1 + g_0 + g_0 g_1 + ... + g_0...g_(gamma-1) tokens per round on average. On the shipped head's last logged "
       "batch this predicts more than the held-out replay measures (the script prints both): the training "
       "agreement is measured on the training text (the held-out prompts are other text), it skips the positions "
       "whose target token lies outside the draft vocabulary (the head can never draft those), and the product "
       "assumes each step's agreement is independent of how hard the text around it is, which it is not.",
}


# 1. The mask by hand -----------------------------------------------------------------------
def ttt_mask(n: int, steps: int) -> torch.Tensor:
    """The training-time-test mask over entries (k, j), laid out step by step ([steps * n, steps * n], True =
    may attend): step 0 is causal over positions; step k >= 1 at j sees step-0 entries 0..j and its own steps
    1..k at j."""
    step = torch.arange(steps).repeat_interleave(n)
    pos = torch.arange(n).repeat(steps)
    committed = (step[None, :] == 0) & (pos[None, :] <= pos[:, None])
    own_path = (step[None, :] >= 1) & (step[None, :] <= step[:, None]) & (pos[None, :] == pos[:, None])
    return committed | own_path


def allowed_pairs(n: int, steps: int) -> int:
    """The number of True entries of `ttt_mask(n, steps)`, in closed form."""
    return steps * n * (n + 1) // 2 + n * steps * (steps - 1) // 2


def causal_pairs(n: int, steps: int) -> int:
    """What a plain causal mask over the steps * n entries would allow."""
    total = steps * n
    return total * (total + 1) // 2


# 2. A position bug -------------------------------------------------------------------------
def ttt_forward_positions(head, features, ids, steps: int, shift_per_step: int = 1) -> torch.Tensor:
    """Notebook 07's `ttt_forward_masked` with step k's entries at position j + shift_per_step * k (1: right;
    0: the bug). features [n, F], ids [n]; returns [steps, n - 1, H]."""
    L = ids.shape[0] - 1
    tokens = torch.cat([ids, ids.new_zeros(steps)])
    mask = ttt_mask(L, steps)
    group = head.n_heads // head.n_kv
    xs, rs, outs = [], [], []
    for k in range(steps):
        x, r = head.inputs(features[:L] if k == 0 else outs[-1], tokens[1 + k:1 + k + L], own=k > 0)
        xs.append(x)
        rs.append(r)
        positions = torch.arange(L).repeat(k + 1) + shift_per_step * torch.arange(k + 1).repeat_interleave(L)
        q, kk, v = head.qkv(torch.cat(xs), positions)
        kk, v = kk.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        scores = (q @ kk.transpose(-1, -2)) / head.head_dim ** 0.5
        allowed = mask[:(k + 1) * L, :(k + 1) * L]
        weights = scores.float().masked_fill(~allowed, float("-inf")).softmax(-1).to(v.dtype)
        outs.append(head.finish(weights @ v, torch.cat(rs))[k * L:])
    return torch.stack(outs)


def position_bug_gap(head, features, ids, steps: int = 3) -> list[float]:
    """Per unrolled step, the largest |difference| between the bugged forward (every step at position j) and the
    package's `ttt_forward`."""
    with torch.no_grad():
        theirs = head.ttt_forward(features[None], ids[None], steps)
        bugged = ttt_forward_positions(head, features, ids, steps, shift_per_step=0)
    return [float((bugged[k] - theirs[k][0]).abs().max()) for k in range(steps)]


# 3. From per-step agreement to tau ---------------------------------------------------------
def expected_chain_tau(agreement: list[float], gamma: int) -> float:
    """Tokens per round of a greedy chain of `gamma` drafts when draft k + 1 is right with probability
    agreement[k] given the earlier ones were (past the list's end: its last value), bonus token included."""
    tau, reach = 1.0, 1.0
    for k in range(gamma):
        reach *= agreement[min(k, len(agreement) - 1)]
        tau += reach
    return tau


def shipped_head_numbers(models_dir: Path | None = None) -> dict:
    """The shipped head's last logged per-step training agreement, the tau it predicts at gamma 4 and 6, and the
    held-out replay's tau at the same gammas (committed in data/models/eagle-head/config.json)."""
    models_dir = models_dir or Path(__file__).resolve().parents[2] / "data" / "models"
    log = json.loads((models_dir / "eagle-head" / "config.json").read_text())["log"]
    agreement = log["curve"][-1]["agreement"]
    return {"agreement": agreement,
            "predicted": {g: expected_chain_tau(agreement, g) for g in (4, 6)},
            "held_out": {4: log["eval"]["tau_gamma4"], 6: log["eval"]["tau_gamma6"]}}


if __name__ == "__main__":
    for number, answer in ANSWERS.items():
        print(f"{number}. {answer}\n")
    print(f"1. n = 3, 2 steps: {int(ttt_mask(3, 2).sum())} allowed pairs (closed form {allowed_pairs(3, 2)}; "
          f"a plain causal mask: {causal_pairs(3, 2)})")
    from specdec_utils.core.eagle import eagle_head_for
    from specdec_utils.core.hidden import capture_hidden
    from specdec_utils.models import tiny_model
    target = tiny_model("tiny-llama", vocab_size=64, seed=0).eval()
    head = eagle_head_for(target, seed=1).eval()
    ids = torch.randint(3, 64, (12,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), capture_hidden(target, head.features) as captured:
        target(input_ids=ids[None])
    gaps = position_bug_gap(head, captured[0][0], ids)
    print("2. every step at position j: largest difference from ttt_forward per step: "
          + ", ".join(f"step {k}: {g:.2e}" for k, g in enumerate(gaps)))
    numbers = shipped_head_numbers()
    print("3. shipped head, last logged training agreement per step: "
          + ", ".join(f"{a:.3f}" for a in numbers["agreement"]))
    for gamma in (4, 6):
        print(f"   gamma {gamma}: predicted tau {numbers['predicted'][gamma]:.2f}, held-out replay "
              f"{numbers['held_out'][gamma]:.2f}")
