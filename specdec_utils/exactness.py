"""The course's exactness test: is a decoding method's output distributed exactly as the target's?

On a tiny vocabulary the target's distribution over whole outputs can be enumerated: every
sequence of up to `n` tokens (ending early at an end-of-sequence token), with its probability
under the target's own (warped) sampling. Run the method many times with a seeded generator, count
the sequences, and compare with a Pearson chi-square test. Counting whole sequences checks every
output token jointly, not only the first one, so a method that is right at the first position and
wrong later (a cache rolled back one token too far, a policy that peeks at the target) fails.

`ToyLM` is a causal LM small enough to make thousands of generations take seconds: its next-token
logits depend on the last two tokens and the position, through a small hidden state and an output
head, and its "KV cache" stores the token ids it has seen, so a wrong rollback changes its output
exactly as it would change a transformer's.
"""
from __future__ import annotations

from collections import Counter
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
    share one seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    return Counter(tuple(run(generator)) for _ in range(trials))


def chi_square_p_value(counts: Counter, probs: dict, min_expected: float = 5.0) -> float:
    """Pearson goodness-of-fit p-value of observed `counts` against `probs` (both keyed by outcome).
    Outcomes expected fewer than `min_expected` times are pooled into one cell; an outcome of
    probability 0 that was observed gives 0.0."""
    if any(key not in probs for key in counts):
        return 0.0
    total = sum(counts.values())
    observed, expected, pooled_observed, pooled_expected = [], [], 0, 0.0
    for key, p in probs.items():
        if p * total >= min_expected:
            observed.append(counts.get(key, 0))
            expected.append(p * total)
        else:
            pooled_observed += counts.get(key, 0)
            pooled_expected += p * total
    if pooled_expected > 0:
        observed.append(pooled_observed)
        expected.append(pooled_expected)
    observed_t = torch.tensor(observed, dtype=torch.float64)
    expected_t = torch.tensor(expected, dtype=torch.float64)
    statistic = ((observed_t - expected_t) ** 2 / expected_t).sum()
    degrees = torch.tensor(len(observed) - 1.0, dtype=torch.float64)
    return torch.special.gammaincc(degrees / 2, statistic / 2).item()


def total_variation(counts: Counter, probs: dict) -> float:
    """Total-variation distance between the empirical distribution of `counts` and `probs`."""
    total = sum(counts.values())
    keys = set(counts) | set(probs)
    return 0.5 * sum(abs(counts.get(k, 0) / total - probs.get(k, 0.0)) for k in keys)
