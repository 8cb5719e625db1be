"""The course's exactness test: is a decoding method's output distributed exactly as the target's?

On a tiny vocabulary the target's distribution over whole outputs can be enumerated: every
sequence of up to `n` tokens (ending early at an end-of-sequence token), with its probability
under the target's own (warped) sampling. Run the method many times with a seeded generator, count
the sequences, and compare with a Pearson chi-square test. Counting whole sequences checks every
output token jointly, not only the first one, so a method that is right at the first position and
wrong later (a cache rolled back one token too far, a policy that peeks at the target) fails.

`chi_square_p_value` and `total_variation` take counters and dicts keyed by outcome (whole sequences)
or tensors over token ids (one position's counts and probabilities). A seeded test passes or fails for
good, so each states its resolution: `min_detectable_tv`, the smallest bias (in total variation) that
its trials detect with 90% power at its alpha, estimated once by simulation. Low-dimensional summaries
(one position, the token drawn after a rejection) resolve smaller biases than whole outputs.

`ToyLM` is a causal LM small enough to make thousands of generations take seconds: its next-token
logits depend on the last two tokens and the position, through a small hidden state and an output
head, and its "KV cache" stores the token ids it has seen, so a wrong rollback changes its output
exactly as it would change a transformer's.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from types import SimpleNamespace

import torch
from torch import nn

from .core.engine import Sampler


class ToyLM(nn.Module):
    """A tiny, fast causal LM with the interface the engine uses (`input_ids`, `past_key_values`,
    `use_cache`, `logits_to_keep`; `get_output_embeddings()`). Logits at position j are
    `lm_head(tanh(E1[x_j] + E2[x_(j-1)] + P[j]))`, scaled by `sharpness`. The cache is a legacy tuple
    ((ids, ids),) holding the ids seen so far as a [1, 1, length, 1] tensor."""

    def __init__(self, vocab_size: int, seed: int = 0, hidden: int = 8, sharpness: float = 2.0,
                 max_positions: int = 256):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.last = nn.Parameter(torch.randn(vocab_size, hidden, generator=generator))
        self.before_last = nn.Parameter(torch.randn(vocab_size + 1, hidden, generator=generator))  # +1: none
        self.position = nn.Parameter(0.5 * torch.randn(max_positions, hidden, generator=generator))
        self.lm_head = nn.Linear(hidden, vocab_size, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(sharpness * torch.randn(vocab_size, hidden, generator=generator))
        self.config = SimpleNamespace(vocab_size=vocab_size)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=0, **kwargs):
        seen = past_key_values[0][0][0, 0, :, 0].long()[None] if past_key_values else input_ids[:, :0]
        ids = torch.cat([seen.expand(input_ids.shape[0], -1), input_ids], dim=1)
        positions = torch.arange(seen.shape[1], ids.shape[1])
        before = torch.where(positions > 0, ids[:, (positions - 1).clamp(min=0)], len(self.last))
        hidden = torch.tanh(self.last[ids[:, positions]] + self.before_last[before] + self.position[positions])
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        stored = ids[:1, None, :, None].float()
        return SimpleNamespace(logits=self.lm_head(hidden), past_key_values=((stored, stored),))


@torch.no_grad()
def exact_distribution(target, prompt: torch.Tensor, n_tokens: int, sampler: Sampler,
                       eos_ids: set[int] = frozenset()) -> dict[tuple[int, ...], float]:
    """P(output = s) for every output s of the target's own sampling: up to `n_tokens` tokens, each
    drawn from `sampler.probs(logits)`, stopping after an end-of-sequence token. Enumerated level by
    level with one batched forward per level; sequences of probability 0 are left out."""
    finished: dict[tuple[int, ...], float] = {}
    frontier = {(): 1.0}
    for level in range(n_tokens):
        prefixes = list(frontier)
        batch = torch.cat([prompt.repeat(len(prefixes), 1),
                           torch.tensor(prefixes, dtype=prompt.dtype).reshape(len(prefixes), level)], dim=1)
        probs = sampler.probs(target(input_ids=batch).logits[:, -1].double()).double()
        frontier_next = {}
        for prefix, row in zip(prefixes, probs):
            for token in row.nonzero().flatten().tolist():
                sequence, p = prefix + (token,), frontier[prefix] * float(row[token])
                (finished if token in eos_ids or level == n_tokens - 1 else frontier_next)[sequence] = p
        frontier = frontier_next
    return finished


def sample_outputs(run, trials: int, seed: int = 0) -> Counter:
    """Count the outputs of `run(generator)` (a list of new token ids) over `trials` calls that
    share one seeded generator. On the CPU the calls run on one thread: a tiny model's operations take
    microseconds, so more threads only add their start-up cost to each (many cores make it slower, not
    faster)."""
    generator = torch.Generator().manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return Counter(tuple(run(generator)) for _ in range(trials))
    finally:
        torch.set_num_threads(threads)


def _as_mapping(values) -> Mapping:
    """A Counter or dict as it is; a 1-D tensor, array or list as {index: value} (a bincount, a
    probability row)."""
    if isinstance(values, Mapping):
        return values
    return dict(enumerate(torch.as_tensor(values).flatten().tolist()))


def _cells(probs: list[float], total: float, min_expected: float) -> list[int]:
    """Pearson's cells: each outcome expected at least `min_expected` times keeps a cell of its own;
    the others share one pooled cell, the last index."""
    alone = [p * total >= min_expected for p in probs]
    pooled = sum(alone)
    index, cells = 0, []
    for own in alone:
        cells.append(index if own else pooled)
        index += own
    return cells


def chi_square_p_value(counts, probs, min_expected: float = 5.0) -> float:
    """Pearson goodness-of-fit p-value of observed `counts` against the distribution `probs`: both
    keyed by outcome (a Counter and a dict), or both 1-D tensors over token ids (a bincount and a
    probability row). Outcomes expected fewer than `min_expected` times are pooled into one cell;
    an observed outcome of probability 0 gives 0.0 (impossible under `probs`); a single cell gives 1.0
    (nothing to test). The chi-square upper tail is the regularized upper incomplete gamma function."""
    counts, probs = _as_mapping(counts), _as_mapping(probs)
    if any(n > 0 and probs.get(key, 0.0) <= 0 for key, n in counts.items()):
        return 0.0
    total = sum(counts.values())
    keys = list(probs)
    cells = _cells([probs[key] for key in keys], total, min_expected)
    observed, expected = [0.0] * (max(cells, default=0) + 1), [0.0] * (max(cells, default=0) + 1)
    for key, cell in zip(keys, cells):
        observed[cell] += counts.get(key, 0)
        expected[cell] += probs[key] * total
    kept = [(o, e) for o, e in zip(observed, expected) if e > 0]
    if len(kept) < 2:
        return 1.0
    observed_t, expected_t = torch.tensor(kept, dtype=torch.float64).T
    statistic = ((observed_t - expected_t) ** 2 / expected_t).sum()
    degrees = torch.tensor(len(kept) - 1.0, dtype=torch.float64)
    return torch.special.gammaincc(degrees / 2, statistic / 2).item()


def total_variation(a, b) -> float:
    """Total-variation distance between two distributions, each given as counts or probabilities
    (a Counter or dict keyed by outcome, or a 1-D tensor over token ids); each is normalized by its
    own total, so `total_variation(counts, probs)` compares the empirical distribution with `probs`."""
    a, b = _as_mapping(a), _as_mapping(b)
    total_a, total_b = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a.get(k, 0) / total_a - b.get(k, 0) / total_b) for k in set(a) | set(b))


def min_detectable_tv(probs, trials: int, alpha: float = 1e-3, power: float = 0.9, share: float = 0.5,
                      simulations: int = 400, seed: int = 0, min_expected: float = 5.0) -> float:
    """The smallest bias, in total variation, that `chi_square_p_value` (with its pooling) detects at
    level `alpha` with probability `power` from `trials` samples of a method whose output should
    follow `probs` (a dict or tensor as in `chi_square_p_value`; an int n means uniform over n outcomes).
    Estimated by simulation: `simulations` multinomial samples of the biased distribution per
    candidate bias, bisection on the bias (to 0.001).

    The bias moves mass delta from the outcomes outside A, proportionally, to those in A, proportionally:
    q = p + delta * (p 1_A / P(A) - p 1_B / P(B)), so TV(p, q) = delta. A holds the most likely outcomes,
    as many as bring P(A) closest to `share`. The Pearson statistic's noncentrality is then
    trials * delta^2 * (1/P(A) + 1/P(B)), and by Cauchy-Schwarz no bias of the same TV that moves mass
    into a set of probability P(A) has less, so with `share` = 0.5 (the default, the minimum over P(A))
    this is about the worst direction: the result bounds every bias (up to pooling and the chi-square
    approximation). A smaller `share` gives the smaller TV of a bias concentrated on the likeliest
    outcomes. Returns inf when even the largest such bias is missed (e.g. every outcome pooled)."""
    if isinstance(probs, int):
        probs = [1.0 / probs] * probs
    p = torch.tensor(list(_as_mapping(probs).values()), dtype=torch.float64)
    p = (p[p > 0] / p.sum()).sort(descending=True).values
    if len(p) < 2:
        return math.inf
    size_a = int((p.cumsum(0)[:-1] - share).abs().argmin()) + 1  # the likeliest outcomes, P(A) closest to share
    in_a = torch.arange(len(p)) < size_a
    mass_a, mass_b = p[in_a].sum(), p[~in_a].sum()
    cells = torch.tensor(_cells(p.tolist(), trials, min_expected))
    n_cells = int(cells.max()) + 1
    expected = torch.zeros(n_cells, dtype=torch.float64).index_add_(0, cells, p * trials)
    keep = expected > 0
    degrees = torch.tensor(keep.sum().item() - 1.0, dtype=torch.float64)
    if degrees < 1:
        return math.inf
    direction = torch.where(in_a, p / mass_a, -p / mass_b)

    def detected(delta: float) -> float:
        q = (p + delta * direction).clamp(min=0)
        generator = torch.Generator().manual_seed(seed)
        draws = torch.multinomial(q.float().expand(simulations, -1), trials, replacement=True, generator=generator)
        counts = torch.zeros(simulations, len(p), dtype=torch.float64).scatter_add_(
            1, draws, torch.ones_like(draws, dtype=torch.float64))
        observed = torch.zeros(simulations, n_cells, dtype=torch.float64).index_add_(1, cells, counts)
        statistic = ((observed[:, keep] - expected[keep]) ** 2 / expected[keep]).sum(1)
        p_values = torch.special.gammaincc(degrees / 2, statistic / 2)
        return (p_values < alpha).double().mean().item()

    high = float(mass_b)
    if detected(high) < power:
        return math.inf
    low = 0.0
    while high - low > 0.001:
        middle = (low + high) / 2
        low, high = (low, middle) if detected(middle) >= power else (middle, high)
    return round(high, 3)
