"""Hierarchical drafting with three models and loop-back (HSDDW; notebook 05).

Levels, fastest first: M1 (`small`: a small draft, or the zero-cost `ngram.NgramDraft`), M2
(`middle`: a stronger draft), Mp (the target, run by the engine). One engine round:

1. M1 drafts a few tokens, stopping early when its own entropy exceeds theta1 (self-verify,
   notebook 04) or when it has nothing to say (an n-gram table with no match).
2. M2 **pre-verifies** them in one forward: greedy matching, or rejection sampling with M1's
   distributions as the proposal, then adds one token of its own (its correction at the first
   rejection, or its bonus token). Every token that survives is therefore an exact sample from
   M2 (notebook 02's theorem, one level down), and M2's distribution at it is known.
3. **Loop-back**: if M2 accepted all of M1's tokens and is itself confident about the token it
   added (its entropy <= theta2), go back to 1 from the new end. Otherwise (M2 rejected one of M1's
   tokens, or is unsure, or the round is full) stop.
4. The pending tokens go to the target as one proposal whose distributions are **M2's**; the
   engine verifies them in one target pass (greedy matching, or rejection sampling), unchanged.

Why it is lossless: the pending tokens are a draft of M2's own sampling process (step 2), with a
length chosen by a stopping rule that looks only at what was produced before (M2's and M1's
entropies, M2's verdicts); that is all the target's rejection sampling needs (notebook 04,
section 2). Greedy: every pending token the target keeps equals its argmax.

Thresholds are HSDDW's: theta1 is the running mean of M1's entropy at the tokens M2 rejected, theta2
the running mean of M2's entropy at the tokens the target rejected (one per rejection), both
starting at `theta*_0` (0 in HSDDW's code: one token per level until the first rejection).
`hierarchical-noloop` skips step 3: one pre-verification per round, "pre-verify + self-verify".
"""
from __future__ import annotations

import torch

from .checks import is_count as _count
from .checks import is_number as _number
from .checks import require
from .engine import DraftModelProposer, DraftStep, Proposal
from .ngram import NgramDraft
from .policies import DraftingPolicy
from .runner import as_runner
from .sampling import rejection_sample, sample_token
from .verify import greedy_verify


class HierarchyPolicy(DraftingPolicy):
    """How much each level drafts. `gamma` caps the pending tokens of a round (M1's and M2's
    together), `max_small` M1's tokens per pre-verification; theta1 / theta2 are fixed entropy thresholds (nats),
    or None for HSDDW's adaptive running means starting at theta1_0 / theta2_0. With
    `reject_ends_round=False` (not HSDDW's rule) a round goes on after M2 corrects M1, as long as M2
    is confident in its correction: M2's verdict on M1 then says nothing about M2's own tokens."""
    name = "hierarchical"
    reason = "middle unsure"  # the round stop that shows the loop-back rule at work
    loop_back = True

    def __init__(self, gamma: int = 10, max_small: int = 4, theta1: float | None = None,
                 theta2: float | None = None, theta1_0: float = 0.0, theta2_0: float = 0.0,
                 reject_ends_round: bool = True):
        super().__init__(gamma)
        max_gamma = gamma
        require("reject_ends_round", reject_ends_round, isinstance(reject_ends_round, bool), "True or False")
        self.reject_ends_round = reject_ends_round
        require("max_small", max_small, _count(max_small, 0), "an integer >= 0")
        for name, value in (("theta1", theta1), ("theta2", theta2)):
            require(name, value, value is None or _number(value, 0), "a number >= 0 (nats) or None (adaptive)")
        for name, value in (("theta1_0", theta1_0), ("theta2_0", theta2_0)):
            require(name, value, _number(value, 0), "a number >= 0 (nats)")
        self.max_gamma, self.max_small = max_gamma, max_small
        self.adaptive1, self.adaptive2 = theta1 is None, theta2 is None
        self.theta1 = theta1_0 if theta1 is None else theta1
        self.theta2 = theta2_0 if theta2 is None else theta2
        self.rejected1: list[float] = []  # M1's entropy where M2 rejected
        self.rejected2: list[float] = []  # M2's entropy where the target rejected

    def round_gamma(self) -> int:
        return self.max_gamma

    def stop_after(self, step) -> bool:  # M1's self-verify: propose the token, then stop if unsure
        return step.entropy > self.theta1

    def middle_rejected(self, entropy: float) -> None:
        """M2 rejected a token M1 drafted with this entropy (nats): an event the policy learns from."""
        self.rejected1.append(entropy)
        if self.adaptive1:
            self.theta1 = sum(self.rejected1) / len(self.rejected1)

    def middle_unsure(self, entropy: float) -> bool:
        return entropy > self.theta2

    def observe(self, stats) -> None:
        if stats.accepted < stats.drafted:  # the target rejected pending token number `accepted`
            self.rejected2.append(stats.detail["middle_entropies"][stats.accepted])
            if self.adaptive2:
                self.theta2 = sum(self.rejected2) / len(self.rejected2)


class NoLoopPolicy(HierarchyPolicy):
    """`hierarchical-noloop`: M1 self-verifies, M2 pre-verifies once, the target verifies."""
    name = "hierarchical-noloop"
    reason = "no loop-back"
    loop_back = False


class HierarchicalProposer:
    """M1 drafts, M2 pre-verifies (and loops back to M1 while confident); the engine's target
    verifies what is pending. Each model keeps its own KV cache, rolled back at both levels."""

    def __init__(self, small, middle):
        self.is_ngram = isinstance(small, NgramDraft)
        # a model M1 drafts exactly as a two-model draft does, with the policy's self-verify
        self.small = small if self.is_ngram else DraftModelProposer(small)
        self.middle = as_runner(middle)

    def rollback(self, committed: int) -> None:
        if not self.is_ngram:
            self.small.rollback(committed)
        self.middle.keep_at_most(committed)  # a token M2 itself proposed is not in its cache: keep what it has

    def runners(self) -> tuple:
        return (self.middle,) if self.is_ngram else (self.middle, *self.small.runners())

    def propose(self, tokens, gamma, policy, sampler, generator, index) -> Proposal:
        pending, rows, sources, entropies = [], [], [], []
        detail = {"small_forwards": 0, "middle_forwards": 0, "small_drafted": 0, "small_accepted": 0,
                  "middle_tokens": 0, "pre_verifications": 0}
        stop, vocab = "gamma", None
        while len(pending) < gamma:
            seq = _extend(tokens, pending)
            small_tokens, small_rows, small_entropies = self._draft_small(
                seq, min(policy.max_small, gamma - len(pending) - 1), policy, sampler, generator,
                index + len(pending), detail)
            k = len(small_tokens)
            logits = self.middle.forward(_extend(seq, small_tokens), k + 1)
            detail["middle_forwards"] += 1
            detail["pre_verifications"] += 1
            vocab = logits.shape[-1]
            new, n_accepted, pending_rows, confidence = self.pre_verify(small_tokens, small_rows, logits, sampler,
                                                                        generator)
            rows += pending_rows
            entropies += torch.special.entr(confidence.float()).sum(-1).tolist()
            pending += new
            sources += ["small"] * n_accepted + ["middle"] * (len(new) - n_accepted)
            detail["small_accepted"] += n_accepted
            detail["middle_tokens"] += len(new) - n_accepted
            self.rollback(seq.shape[1] + n_accepted)  # what both caches may keep: M2 agreed with it
            if n_accepted < k:
                policy.middle_rejected(small_entropies[n_accepted])
                if policy.reject_ends_round:
                    stop = "middle rejected"
                    break
            if len(pending) >= gamma:
                stop = "gamma"
                break
            if not policy.loop_back:
                stop = "no loop-back"
                break
            if policy.middle_unsure(entropies[-1]):
                stop = "middle unsure"
                break
        detail["middle_entropies"] = entropies  # M2's entropy at each pending token (the policy learns from them)
        detail["sources"] = sources
        draft_probs = torch.stack(rows) if rows else None
        forwards = detail["small_forwards"] + detail["middle_forwards"]
        return Proposal(torch.tensor(pending, dtype=tokens.dtype, device=tokens.device), draft_probs, stop,
                        forwards, vocab, detail)

    def pre_verify(self, small_tokens: list[int], small_rows: list, logits: torch.Tensor, sampler, generator):
        """M2 judges M1's k tokens from its logits [k + 1, V]: greedy matching, or rejection sampling
        with M1's rows as the proposal. Returns the tokens that stand (the accepted prefix plus M2's
        own token), how many of M1's were accepted, M2's rows for them (when sampling: the target's
        verifier needs the distribution each pending token is an exact sample of), and M2's
        distributions there (for its entropy)."""
        k = len(small_tokens)
        if sampler.greedy:
            new = greedy_verify(torch.tensor(small_tokens, dtype=torch.long, device=logits.device), logits).tolist()
            return new, len(new) - 1, [], logits[:len(new)].float().softmax(-1)
        middle_probs = sampler.probs(logits)
        small_probs = torch.stack(small_rows) if k else middle_probs[:0]
        new = rejection_sample(small_probs, middle_probs, torch.tensor(small_tokens, dtype=torch.long),
                               generator).tolist()
        return new, len(new) - 1, list(middle_probs[:len(new)]), middle_probs[:len(new)]

    def _draft_small(self, seq, limit, policy, sampler, generator, index, detail):
        """M1 drafts up to `limit` tokens after `seq`, with self-verify (`policy.stop_after`). Returns its
        tokens, the rows they were sampled from (when sampling) and M1's entropy at each of them."""
        entropies: list[float] = []
        watch = _Watch(policy, entropies)
        if not self.is_ngram:
            proposal = self.small.propose(seq, limit, watch, sampler, generator, index)
            detail["small_forwards"] += proposal.draft_calls
            tokens = proposal.tokens.tolist()
            rows = list(proposal.probs) if proposal.probs is not None else [None] * len(tokens)
        else:
            tokens, rows, ids = [], [], seq[0].tolist()
            for position in range(limit):
                logits = self.small.next_logits(ids + tokens)
                if logits is None:  # no match: nothing to propose
                    break
                logits = logits.to(seq.device)
                probs = None if sampler.greedy else sampler.probs(logits)
                step = DraftStep(position, index + position, logits, None, probs)
                step.drawn = int(logits.argmax()) if sampler.greedy else sample_token(probs, generator)
                tokens.append(step.drawn)
                rows.append(probs)
                if watch.stop_after(step):
                    break
        detail["small_drafted"] += len(tokens)
        return tokens, rows, entropies


def _extend(tokens: torch.Tensor, more: list[int]) -> torch.Tensor:
    return torch.cat([tokens, tokens.new_tensor([more])], dim=1) if more else tokens


class _Watch:
    """The policy as M1 sees it: the same decisions, and M1's entropy at each token it proposed
    recorded for the proposer (the policy's own state is never written from outside)."""

    def __init__(self, policy, entropies: list[float]):
        self.policy, self.entropies = policy, entropies
        self.reason, self.needs_hidden = policy.reason, policy.needs_hidden

    def stop_before(self, step) -> bool:
        return self.policy.stop_before(step)

    def stop_after(self, step) -> bool:
        self.entropies.append(step.entropy)
        return self.policy.stop_after(step)
