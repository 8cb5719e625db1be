"""Solutions to the exercises of notebook 05 (hierarchical drafting); `tests/test_solutions.py` checks them."""
import numpy as np
import torch

from specdec_utils import bench, theory
from specdec_utils.ngram import NgramDraft


# Exercise 1 ------------------------------------------------------------------------------------
def tau2_sweep(taus=(0.5, 1.0, 2.0, 3.0), small: str = "ngram", middle: str = "draft-s") -> list:
    """Benchmark variants: `small` under `middle` with a fixed tau2 each (tau1 out of the way, M2's
    rejection not ending the round), plus the adaptive default with the same rule, plus the best
    pair of notebook 04 (entropy-stop) with `middle`. Run them with `bench.run_benchmark(...,
    drafts=models)` next to "ar"."""
    base = {"reject_ends_round": False, "tau1": 1e9}
    variants = [bench.Variant(f"{small} > {middle} tau2 {tau:g}", "hierarchical", params={**base, "tau2": tau},
                              draft=middle, draft_small=small) for tau in taus]
    variants.append(bench.Variant(f"{small} > {middle} adaptive", "hierarchical",
                                  params={"reject_ends_round": False}, draft=middle, draft_small=small))
    variants.append(bench.Variant(f"{middle} entropy-stop", "entropy-stop", draft=middle))
    return variants


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
