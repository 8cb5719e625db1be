"""Tree proposers for the engine (notebook 06): Medusa heads, and a draft model that grows a tree.

Both return a `Proposal` with `parents` set; the engine verifies the whole tree in one target pass
(`runner.forward_tree`), walks it (`verify.verify_tree`) and keeps the accepted path's cache entries
(`kv_cache.gather_cache`). Candidates are chosen deterministically (top-k), so the per-round pruning
rules may read their probabilities and sampled verification stays exact (one-hot q; `tree.py`).
`DraftTreePolicy(sample_children=True)` instead draws each node's children i.i.d. from the draft's
warped distribution (SpecInfer), with a shape that never depends on the drawn values.

| method | proposer | policy (its parameters) |
|---|---|---|
| `medusa` | `MedusaProposer(heads)` | `MedusaPolicy`: tree template, node budget, top-k, pruning |
| `draft-tree` | `DraftTreeProposer(draft)` | `DraftTreePolicy`: width, node budget, pruning |
"""
from __future__ import annotations

import math

import torch

from . import tree as trees
from .checks import is_count as _count
from .checks import is_number as _number
from .checks import require
from .engine import Proposal
from .medusa import MedusaHeads
from .policies import DraftingPolicy
from .runner import as_runner


class TreePolicy(DraftingPolicy):
    """What a tree method's round looks like: `gamma` = the tree's depth (capped by the budget),
    `tree_nodes` its size at most, `prune` one of the three pruning rules (`tree.prune_keep`) at
    `threshold`. `acceptance="typical"` (Medusa's typical acceptance, Cai et al. 2024, Sec. 2.3.1) is
    the *lossy* alternative to exact verification when sampling, kept for comparison only."""
    name = "tree"
    reason = "tree"

    def __init__(self, gamma: int = 4, tree_nodes: int = 32, prune: str = "none", threshold: float = 0.1,
                 acceptance: str = "exact", typical_eps: float = 0.09, typical_delta: float = 0.3):
        super().__init__(gamma)
        require("tree_nodes", tree_nodes, _count(tree_nodes, 1), "an integer >= 1")
        require("prune", prune, prune in trees.PRUNING, f"one of {', '.join(trees.PRUNING)}")
        require("threshold", threshold, _number(threshold, 0, 1), "a number in [0, 1]")
        require("acceptance", acceptance, acceptance in ("exact", "typical"), "'exact' or 'typical' (lossy)")
        self.tree_nodes, self.prune, self.threshold = tree_nodes, prune, threshold
        self.acceptance, self.typical = acceptance, (typical_eps, typical_delta)


class MedusaPolicy(TreePolicy):
    """`tree`: "sparse" (Medusa's construction from the heads' measured rank accuracies, `tree_nodes`
    best paths), "cartesian" (every combination of each head's top `topk`, cut to `tree_nodes` in
    breadth-first order), or a list of rank paths of your own."""
    name = "medusa"

    def __init__(self, gamma: int = 4, tree_nodes: int = 32, tree="sparse", topk: int = 10, prune: str = "none",
                 threshold: float = 0.1, acceptance: str = "exact", typical_eps: float = 0.09,
                 typical_delta: float = 0.3):
        super().__init__(gamma, tree_nodes, prune, threshold, acceptance, typical_eps, typical_delta)
        require("topk", topk, _count(topk, 1), "an integer >= 1")
        ok = tree in ("sparse", "cartesian") or (isinstance(tree, (list, tuple)) and all(
            isinstance(p, (list, tuple)) and p and all(_count(r, 0) for r in p) for p in tree))
        require("tree", tree, ok, "'sparse', 'cartesian' or a list of rank paths such as [(0,), (1,), (0, 0)]")
        self.tree, self.topk = tree, topk


class DraftTreePolicy(TreePolicy):
    """The draft expands, level by level, the `width` best nodes of the level (by path probability)
    into their `width` best children; the tree keeps the `tree_nodes` best nodes overall (EAGLE-2's
    expand-then-rerank). `sample_children=True` (sampled decoding only): the first `width` nodes of
    each level each get `width` children drawn i.i.d. from the draft (SpecInfer); no reranking."""
    name = "draft-tree"

    def __init__(self, gamma: int = 4, tree_nodes: int = 32, width: int = 3, prune: str = "none",
                 threshold: float = 0.1, acceptance: str = "exact", sample_children: bool = False,
                 typical_eps: float = 0.09, typical_delta: float = 0.3):
        super().__init__(gamma, tree_nodes, prune, threshold, acceptance, typical_eps, typical_delta)
        require("width", width, _count(width, 1), "an integer >= 1")
        require("sample_children", sample_children, isinstance(sample_children, bool), "True or False")
        if sample_children and prune != "none":
            raise ValueError("prune must be 'none' with sample_children=True: pruning reads the drawn tokens' "
                             "probabilities, which would bias sampled verification")
        self.width, self.sample_children = width, sample_children


def _entropy_frac(logp: torch.Tensor) -> torch.Tensor:
    """Entropy / log(V) of each row of log-probabilities [..., V]."""
    return -(logp.exp() * logp).nan_to_num().sum(-1) / math.log(logp.shape[-1])


class MedusaProposer:
    """Medusa: the heads read the target's hidden state at the position that produced the newest
    token (the engine hands it over after each pass: `needs_target_hidden`), so their guesses cost
    no model forward. The first round (no hidden state yet) proposes nothing."""
    needs_target_hidden = True

    def __init__(self, heads: MedusaHeads):
        self.heads, self.hidden = heads, None
        self._templates: dict = {}

    def observe_target(self, hidden: torch.Tensor) -> None:
        self.hidden = hidden[-1]  # the state at the position that produced the newest token

    def rollback(self, committed: int) -> None:
        if committed == 0:  # a new generation: its first round has no hidden state yet (none of the last one's)
            self.hidden = None

    def template(self, policy: MedusaPolicy, depth: int):
        key = (str(policy.tree), policy.tree_nodes, policy.topk, depth)
        if key not in self._templates:
            if policy.tree == "sparse":
                acc = self.heads.rank_accuracy
                if acc is None:
                    raise ValueError("tree='sparse' needs the heads' measured rank accuracies (heads.rank_accuracy); "
                                     "measure them with medusa.rank_accuracy, or use tree='cartesian'")
                paths = trees.sparse_paths([row[:policy.topk] for row in acc[:depth]], policy.tree_nodes)
            elif policy.tree == "cartesian":
                paths = trees.cartesian_paths([policy.topk] * depth)
                paths = sorted(paths, key=lambda p: (len(p), p))[:policy.tree_nodes]
            else:
                paths = [tuple(p) for p in policy.tree if len(p) <= depth and max(p) < policy.topk]
                paths = sorted(paths, key=lambda p: (len(p), p))[:policy.tree_nodes]
            self._templates[key] = trees.rank_tree_parents(paths) if paths else ([], torch.zeros(0, dtype=torch.long))
        return self._templates[key]

    def propose(self, tokens, gamma, policy, sampler, generator, index) -> Proposal:
        depth = min(gamma, self.heads.num_heads)
        if self.hidden is None or depth == 0:
            return Proposal(tokens[0, :0], None, "no draft" if self.hidden is None else "budget", 0)
        paths, parents = self.template(policy, depth)
        if not paths:
            return Proposal(tokens[0, :0], None, "tree", 0, parents=parents)
        logp_all = torch.log_softmax(self.heads(self.hidden).float(), -1)  # [K, V']
        top_logp, top_idx = logp_all.topk(min(policy.topk, logp_all.shape[-1]), dim=-1)
        ids = top_idx if self.heads.vocab_ids is None else self.heads.vocab_ids[top_idx]
        d = torch.tensor([len(p) - 1 for p in paths])
        r = torch.tensor([p[-1] for p in paths])
        nodes = ids[d, r].to(tokens.device)
        prob = top_logp[d, r].exp().cpu()
        keep = trees.prune_keep(prob, parents, _entropy_frac(logp_all).cpu()[d], policy.prune, policy.threshold)
        nodes, parents, prob = trees.subtree(nodes, parents, keep, prob)
        detail = {"tree_nodes": len(nodes), "pruned": int((~keep).sum()),
                  "tree_depth": int(trees.depths(parents).max()) if len(parents) else 0}
        return Proposal(nodes, None, "tree", 1, self.heads.vocab_size, detail, parents)


class DraftTreeProposer:
    """A draft model grows the tree: one forward for the committed tokens (the root's children),
    then one batched forward per level over the nodes it expands (tree mask against its own cache).
    Its cache holds committed tokens only between rounds."""

    def __init__(self, draft):
        self.runner, self.prefix = as_runner(draft), 0

    @property
    def draft(self):
        return self.runner.model

    def rollback(self, committed: int) -> None:
        self.runner.rollback(min(self.prefix, committed))

    def runners(self) -> tuple:
        return (self.runner,)

    def propose(self, tokens, gamma, policy: DraftTreePolicy, sampler, generator, index) -> Proposal:
        if gamma == 0:
            return Proposal(tokens[0, :0], None, "budget", 0)
        sample = policy.sample_children and not sampler.greedy
        logits = self.runner.forward(tokens)
        self.prefix, forwards, vocab = tokens.shape[1], 1, logits.shape[-1]
        tok, par, score, prob, ent, qrows = [], [], [], [], [], []
        fed: list[int] = []  # candidate indices the draft has seen, in feeding order
        frontier, rows = [-1], logits
        for depth in range(1, gamma + 1):
            level = []
            for j, parent in enumerate(frontier):
                logp = torch.log_softmax(rows[j].float(), -1)
                frac = float(_entropy_frac(logp))
                base = score[parent] if parent >= 0 else 0.0
                if sample:
                    q = sampler.probs(rows[j])
                    picks = torch.multinomial(q.cpu(), policy.width, replacement=True,  # the CPU generator
                                              generator=generator).tolist()
                else:
                    q = None
                    picks = logp.topk(policy.width).indices.tolist()
                for x in picks:
                    level.append(len(tok))
                    tok.append(x), par.append(parent), score.append(base + float(logp[x]))
                    prob.append(float(logp[x].exp())), ent.append(frac), qrows.append(q)
            if depth == gamma:
                break
            if sample:
                frontier = level[:policy.width]
            else:
                frontier = sorted(level, key=lambda c: -score[c])[:policy.width]
                frontier.sort()
            # feed the frontier: the draft's fed set is a tree of its own (parents of fed nodes are fed)
            position = {c: i for i, c in enumerate(fed)}
            before = len(fed)
            fed += frontier
            position.update({c: before + i for i, c in enumerate(frontier)})
            fed_parents = torch.tensor([position[par[c]] if par[c] >= 0 else -1 for c in fed])
            rows = self.runner.forward_tree(tokens, torch.tensor([tok[c] for c in fed]), fed_parents, fed=before,
                                            num_logits=len(frontier))
            forwards += 1
        nodes = torch.tensor(tok, dtype=torch.long)
        parents = torch.tensor(par, dtype=torch.long)
        keep = torch.ones(len(tok), dtype=torch.bool)
        if not sample and len(tok) > policy.tree_nodes:  # the best nodes by path probability
            order = sorted(range(len(tok)), key=lambda c: (-score[c], c))[:policy.tree_nodes]
            keep = torch.zeros(len(tok), dtype=torch.bool)
            keep[order] = True
        keep &= trees.prune_keep(torch.tensor(prob), parents, torch.tensor(ent), policy.prune, policy.threshold)
        q = torch.stack(qrows) if sample else None
        n_before = len(tok)
        nodes, parents, q = trees.subtree(nodes, parents, keep, q)
        detail = {"tree_nodes": len(nodes), "pruned": n_before - len(nodes),
                  "tree_depth": int(trees.depths(parents).max()) if len(parents) else 0}
        return Proposal(nodes.to(tokens.device), q, "tree", forwards, vocab, detail, parents)
