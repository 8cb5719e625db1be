"""Verification: which drafted tokens stand, one part for chains and trees (notebooks 01, 02, 06).

A proposal is a token tree: `parents[i] < i` is node i's parent, -1 for a child of the root (the
newest committed token). A chain is the tree whose parents are `arange(k) - 1`. The target's logits
for it come from one pass: row 0 is the root's next-token distribution, row 1 + i node i's. A
verifier walks from the root and returns a `Verdict`: the accepted nodes (`path`) and the new tokens
(the accepted path, then one token from the target: the correction, or the bonus after a leaf).

- **greedy** (temperature 0): move to the child whose token is the target's argmax while there is
  one; then add the argmax. The output is the target's own greedy output.
- **exact** (sampling): SpecInfer's multi-step speculative sampling (Miao et al. 2024). Try the
  children in turn; child c is accepted with probability min(1, p(x_c) / q_c(x_c)); after a
  rejection p <- norm(max(p - q_c, 0)) (`sampling.residual`); after all rejections sample from
  what is left (`sampling.accept_tree_sampled`, tensor operations on explicit uniforms). q_c is
  the distribution child c was drawn from (one-hot for a child chosen deterministically, such as
  a head's top-k guess: accepted with probability p(x_c), and rejected by zeroing x_c). For a
  chain this is Leviathan et al.'s rejection sampling, run by
  `sampling.rejection_sample`: the same rule, vectorised (the fast path), k + 1 uniforms per round
  (`sampling.accept_sampled`, the function the device loop records on the GPU).
- **typical** (sampling, Medusa's typical acceptance, Cai et al. 2024, Sec. 2.3.1): move to the most
  likely child whose target probability exceeds min(eps, delta * exp(-H(p))), then sample from p.
  It is NOT lossless; it exists to measure how far it moves the output.

Every uniform is a float64 draw from the CPU generator, and every token the verifier itself draws comes from
`sampling.sample_token`, so runs are reproducible across devices (drafters draw their own proposals).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .sampling import accept_greedy, accept_tree_greedy, accept_tree_sampled, rejection_sample, sample_token
from .tree import tree_mask


class Verdict(NamedTuple):
    """`tokens`: the accepted nodes' tokens then one target token; `path`: the accepted node indices
    (a chain's are 0..n-1)."""
    tokens: list[int]
    path: list[int]


def children_lists(parents: list[int]) -> dict[int, list[int]]:
    """{node (-1 = root): its children in index order}."""
    out: dict[int, list[int]] = {-1: []}
    for i, parent in enumerate(parents):
        out.setdefault(parent, []).append(i)
        out.setdefault(i, [])
    return out


def greedy_verify(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Greedy verification of a chain: accept draft tokens while each equals the target's argmax, then
    add the target's own argmax at the first mismatch (or its bonus token after all k).
    draft_tokens [k], target_logits [k+1, V]; returns between 1 and k+1 token ids."""
    target_choice = target_logits.argmax(-1)
    n, _ = accept_greedy(draft_tokens.to(target_choice.device), target_choice)  # the leading run of matches
    return target_choice[:int(n) + 1]  # equals the accepted drafts, then the target's token


class Verifier:
    """Exact verification: greedy at temperature 0, lossless sampling otherwise (chain or tree)."""
    name = "exact"
    lossless = True

    def __call__(self, proposal, target_logits: torch.Tensor, sampler, generator) -> Verdict:
        if proposal.parents is None:  # a chain: the vectorised fast path
            if sampler.greedy:
                tokens = greedy_verify(proposal.tokens, target_logits).tolist()
            else:
                # probs None: every draft chosen deterministically (one-hot q), as for trees
                tokens = rejection_sample(proposal.probs, sampler.probs(target_logits), proposal.tokens,
                                          generator).tolist()
            return Verdict(tokens, list(range(len(tokens) - 1)))
        return verify_tree(proposal.tokens, proposal.parents, proposal.probs, target_logits, sampler, generator)


class TypicalVerifier(Verifier):
    """Medusa's typical acceptance when sampling (lossy); greedy at temperature 0."""
    name = "typical"
    lossless = False

    def __init__(self, eps: float = 0.09, delta: float = 0.3):
        self.eps, self.delta = eps, delta

    def __call__(self, proposal, target_logits, sampler, generator) -> Verdict:
        if sampler.greedy:
            return super().__call__(proposal, target_logits, sampler, generator)
        k = len(proposal.tokens)
        parents = proposal.parents.tolist() if proposal.parents is not None else list(range(-1, k - 1))
        return typical_walk(proposal.tokens.tolist(), children_lists(parents), target_logits, sampler, generator,
                            self.eps, self.delta)


def verify_tree(nodes: torch.Tensor, parents: torch.Tensor, q, target_logits: torch.Tensor, sampler,
                generator) -> Verdict:
    """Walk a tree exactly: greedy at temperature 0, SpecInfer's sampling otherwise. nodes, parents [T];
    target_logits [T + 1, V] (row 0 = root); `q` [T, V]: the distribution each node was drawn from
    (sampled children), or None: every node was chosen deterministically (one-hot q)."""
    if sampler.greedy:
        return greedy_walk(nodes, parents, target_logits)
    return exact_walk(nodes, parents, q, target_logits, sampler, generator)


def _row(target_logits, sampler, node: int) -> torch.Tensor:
    """The target's warped distribution after `node` (-1: the root); only visited rows are warped."""
    return sampler.probs(target_logits[node + 1:node + 2])[0]


def greedy_walk(nodes: torch.Tensor, parents: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """The greedy walk (`sampling.accept_tree_greedy`, the tensor walk the device loop records), read back once."""
    nodes, parents = nodes.cpu(), parents.cpu()
    ancestors = tree_mask(parents)
    n, deepest, after = accept_tree_greedy(nodes, parents + 1, ancestors, ancestors.sum(-1),
                                           target_logits.argmax(-1).cpu())
    path = ancestors[deepest].nonzero().flatten().tolist() if int(n) else []  # ancestors come first (parents[i] < i)
    return Verdict(nodes[path].tolist() + [int(after)], path)


def exact_walk(nodes: torch.Tensor, parents: torch.Tensor, q, target_logits: torch.Tensor, sampler,
               generator) -> Verdict:
    """SpecInfer's walk (`sampling.accept_tree_sampled`, tensor operations), read back once; `q` [T, V] the
    distribution each node was drawn from, or None (one-hot). The walk reads one uniform per node it tries and one
    for its last token: it is handed T + 1, and `generator` is then left exactly that many draws on, as a walk
    drawing them one by one would leave it."""
    generator = torch.default_generator if generator is None else generator
    state = generator.get_state()
    uniforms = torch.rand(len(nodes) + 1, generator=generator, dtype=torch.float64)
    device = target_logits.device
    on_path, tried, after = accept_tree_sampled(nodes, parents + 1, None if q is None else q.to(device),
                                                sampler.probs(target_logits), uniforms.to(device))
    generator.set_state(state)
    torch.rand(int(tried) + 1, generator=generator, dtype=torch.float64)  # the uniforms the walk used, no more
    path = on_path.nonzero().flatten().tolist()
    return Verdict(nodes.cpu()[path].tolist() + [int(after)], path)


def typical_walk(tokens, children, target_logits, sampler, generator, eps, delta) -> Verdict:
    node, path = -1, []
    while True:
        p = _row(target_logits, sampler, node)
        bar = min(eps, delta * math.exp(-float(torch.special.entr(p).sum())))
        good = [c for c in children[node] if float(p[tokens[c]]) > bar]
        if not good:
            return Verdict([tokens[c] for c in path] + [sample_token(p, generator)], path)
        node = max(good, key=lambda c: float(p[tokens[c]]))
        path.append(node)
