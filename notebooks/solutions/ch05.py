"""Solutions to the exercises of notebook 05 (hierarchical drafting); `tests/test_solutions.py` checks them.

Each exercise has code and, in `ANSWERS`, its answer in words; `python notebooks/solutions/ch05.py` prints the
answers with the numbers the code computes (exercise 4 reads the n-gram table's committed training log). Exercise
1's answer is a measurement: `judge_theta2_sweep` words it from your run's records, with the spread.
"""
import json
from pathlib import Path

import numpy as np
import torch

from specdec_utils import report, theory
from specdec_utils import measure
from specdec_utils.core.ngram import NgramDraft

REPO = Path(__file__).resolve().parents[2]
P_TOY = torch.tensor([0.30, 0.20, 0.15, 0.10, 0.10, 0.08, 0.05, 0.02])   # notebook 02's toy target
Q_TOY = torch.tensor([0.10, 0.35, 0.25, 0.05, 0.10, 0.05, 0.10, 0.00])   # and its toy draft

ANSWERS = {
    1: "Run `theta2_sweep()` with `measure.run_benchmark(..., drafts=models)` next to \"ar\" on training prompts "
       "(tuning), then `judge_theta2_sweep(records)`: it words each fixed theta2 against the adaptive default and "
       "against the pair from a paired bootstrap over prompts. What to expect: a low theta2 (0.5 nats) rarely "
       "loops back, so it behaves like `hierarchical-noloop`; a high one (3 nats) loops back even when M2 is "
       "unsure and wastes drafts. The adaptive default is well placed when no fixed theta2 is faster outside the "
       "spread (on a 2-core CPU with a handful of prompts, ties are the usual verdict). Whether any theta2 reaches "
       "the pair is the question of the notebook's section 6: with a free M1 right only a minority of the time "
       "under a draft that costs a few percent of the target, the formula leaves a small gain at best (section 4's "
       "ceiling), so expect ties with the pair, not a clear win. Check the chosen theta2 once on evaluation prompts.",
    2: "A kept token was proposed and accepted: P(x kept) = q(x) min(1, p(x)/q(x)) = min(p(x), q(x)), so the kept "
       "token follows min(p, q) / sum(min(p, q)), not p. Every token the draft overrates (q >= p) is "
       "over-represented (p/Z > p, with Z = sum(min(p, q)) = 1 - TV); a token it underrates gets q/Z, which is "
       "below p only when q/p < Z; tokens the draft cannot propose are never emitted. For "
       "notebook 02's toy vectors `kept_token_distribution(P_TOY, Q_TOY)` gives it and its total-variation "
       "distance to p (printed by this script); it is zero only when p = q.",
    3: "`min_agreement_for_gain(0.25, 0.3, 0.8)`: an M1 at a quarter of a 7B-like middle's cost needs a12 of "
       "roughly a half or more to gain 10% over the M2 pair (the exact grid value is printed). For M2 = `draft-s` "
       "put in section 1's measured c2 and a2p (a full run on the course CPU gives c2 about 0.04 and a2p about 0.64, section 1's box; "
       "the script uses those): the required a12 is far higher, above anything our levels reach under `draft-s` "
       "(the n-gram agrees with it less than half the time), because a draft that cheap leaves only a few percent "
       "of a round to save.",
    4: "`context_only(table)` answers from the live text only (prompt lookup). The n-gram table's training log "
       "measured both on held-out positions: the live text alone answers about a third of the positions and is "
       "right about three quarters of the time where it answers; with the table the level answers about three "
       "quarters of the positions at a lower hit rate, and its overall agreement with the target is much higher "
       "(this script prints the logged values). In speed, run `hierarchical` under `draft-s` with both levels in "
       "one benchmark and compare them with `report.speedup(records, with_table, baseline=lookup_only)`: the "
       "table's extra coverage is what turns the free level from an occasional copier into an M1 that answers "
       "most of the time.",
}


# Exercise 1 ------------------------------------------------------------------------------------
def theta2_sweep(taus=(0.5, 1.0, 2.0, 3.0), small: str = "ngram", middle: str = "draft-s") -> list:
    """Benchmark variants: `small` under `middle` with a fixed theta2 each (theta1 out of the way, M2's
    rejection not ending the round), plus the adaptive default with the same rule, plus the best
    pair of notebook 04 (entropy-stop) with `middle`. Run them with `measure.run_benchmark(...,
    drafts=models)` next to "ar"."""
    base = {"reject_ends_round": False, "theta1": 1e9}
    variants = [measure.Variant(f"{small} > {middle} theta2 {tau:g}", "hierarchical", params={**base, "theta2": tau},
                              draft=middle, draft_small=small) for tau in taus]
    variants.append(measure.Variant(f"{small} > {middle} adaptive", "hierarchical",
                                  params={"reject_ends_round": False}, draft=middle, draft_small=small))
    variants.append(measure.Variant(f"{middle} entropy-stop", "entropy-stop", draft=middle))
    return variants


def judge_theta2_sweep(records: list[dict], adaptive: str | None = None, pair: str | None = None) -> list[str]:
    """One sentence per fixed theta2 of a `theta2_sweep` run: its speedup over the adaptive default and over the
    pair, with the paired bootstrap interval over prompts and the word (faster / slower / a tie) from it."""
    labels = list(dict.fromkeys(r["method"] for r in records))
    adaptive = adaptive or next(m for m in labels if m.endswith("adaptive"))
    pair = pair or next(m for m in labels if m.endswith("entropy-stop"))
    out = []
    for label in (m for m in labels if " theta2 " in m):
        vs_default, vs_pair = report.speedup(records, label, adaptive), report.speedup(records, label, pair)
        out.append(f"{label}: {vs_default:.2fx} of the adaptive default ({report.verdict(vs_default)}), "
                   f"{vs_pair:.2fx} of {pair} ({report.verdict(vs_pair)})")
    return out


# Exercise 2 ------------------------------------------------------------------------------------
def kept_token_distribution(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, float]:
    """M1 proposes x ~ q, M2 (distribution p) keeps it with probability min(1, p(x)/q(x)), so
    P(x proposed and kept) = q(x) min(1, p(x)/q(x)) = min(p(x), q(x)). Keeping only kept tokens (and
    dropping the correction) emits min(p, q) / sum(min(p, q)); returns it and its TV distance to p."""
    p, q = p.double() / p.double().sum(), q.double() / q.double().sum()
    kept = torch.minimum(p, q)
    kept = kept / kept.sum()
    return kept, 0.5 * float((kept - p).abs().sum())


# Exercise 3 ------------------------------------------------------------------------------------
def min_agreement_for_gain(cost_ratio: float, c2: float, a2p: float, gain: float = 1.1,
                           grid=np.linspace(0.01, 0.99, 99)) -> float | None:
    """The lowest M1-M2 agreement a12 on `grid` at which M1 (cost `cost_ratio` * c2) under M2 (cost
    c2, acceptance a2p) beats the best M2 pair by `gain`, as the notebook's map measures it (the M1
    pair left out); None if no agreement on the grid is enough."""
    for a12 in grid:
        if theory.hierarchy_gain(float(a12), a2p, None, cost_ratio * c2, c2) >= gain:
            return float(a12)
    return None


# Exercise 4 ------------------------------------------------------------------------------------
def context_only(table: NgramDraft) -> NgramDraft:
    """The same n-gram level, answering from the live text only (prompt lookup decoding)."""
    return NgramDraft(table.tables, table.vocab_size, use_context=True, use_table=False)


def logged_lookup_levels(path: Path = REPO / "data" / "models" / "ngram" / "training_log.json") -> dict:
    """Coverage, hit rate and agreement with the target of the n-gram level with and without its table, as the
    table's training log measured them on held-out positions."""
    log = json.loads(Path(path).read_text())["eval"]
    return {part: {key: log[part][key] for key in ("coverage", "hit_rate", "agreement")}
            for part in ("context_only", "with_context") if part in log}


def answers() -> list[str]:
    kept, tv = kept_token_distribution(P_TOY, Q_TOY)
    levels = logged_lookup_levels()
    lines = [f"1. {ANSWERS[1]}",
             f"2. {ANSWERS[2]}\n   kept-token distribution {[round(x, 3) for x in kept.tolist()]} "
             f"against p {[round(x, 3) for x in P_TOY.tolist()]}: TV = {tv:.3f}",
             f"3. {ANSWERS[3]}\n   7B-like middle (c2 0.3, a2p 0.8): a12 >= {min_agreement_for_gain(0.25, 0.3, 0.8)}; "
             f"draft-s (c2 0.037, a2p 0.640): a12 >= {min_agreement_for_gain(0.25, 0.037, 0.640)}",
             f"4. {ANSWERS[4]}"]
    for part, m in levels.items():
        lines.append(f"   {part}: answers {m['coverage']:.1%} of positions, right where it answers {m['hit_rate']:.1%}, "
                     f"agrees with the target {m['agreement']:.1%} overall")
    return lines


if __name__ == "__main__":
    print("\n".join(answers()))
