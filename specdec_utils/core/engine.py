"""One decode loop for every method of the course, with small pluggable parts.

A round of speculative decoding has four steps, and each is one part here:

1. **propose**: a *proposer* returns the round's candidate tokens, a chain or a token tree (and, when
   sampling, the distributions they were drawn from). `DraftModelProposer` is the two-model draft of
   notebooks 01-02; `NoDraft` proposes nothing, which turns the loop into plain decoding (`ar`).
2. **how many**: a *drafting policy* (`policies.py`) chooses gamma for the round and may stop the
   proposer mid-round (notebooks 03 and 04).
3. **verify**: one target pass over the candidates (`runner.ModelRunner.forward_tree`: a chain is a
   tree whose parents are arange(k) - 1, and runs as an ordinary causal forward), then a *verifier*
   (`verify.py`) keeps the accepted path plus one target token: greedy, exact sampling, or Medusa's
   (lossy) typical acceptance.
4. **commit**: the committed tokens are appended, the target's cache keeps the accepted path
   (`ModelRunner.commit`: a gather for a tree, a pointer move for a chain), the proposer rolls its
   caches back to them, and the policy observes the round.

`decode` is that loop; `methods.generate` (the public entry point) picks the parts from a method name
(`methods.METHODS`, a registry). Compared with vLLM v1 (a proposer, the model runner, a rejection
sampler) and Hugging Face (`CandidateGenerator` plus the assisted-decoding loop), the split is the
same, without batching.

The parts are duck-typed. A policy is a `policies.DraftingPolicy`. A verifier (`verify.Verifier`,
`verify.TypicalVerifier`) is called as `verifier(proposal, target_logits, sampler, generator)`, the target's logits
[k + 1, V] (row 0 = the root's), and returns the accepted path and the new tokens. A proposer has
`propose(tokens, gamma, policy, sampler, generator, index) -> Proposal` (at most `gamma` tokens along any path;
`index` = tokens generated so far) and `rollback(committed)`, called after each round with the number of committed
tokens its caches may keep; one that reads the target's hidden state sets `needs_target_hidden = True` (and
`target_hidden`, where to read it: `hidden.capture_hidden`'s `where`, default "norm"), and after each pass the loop
calls its `observe_target(h)` with the target's states [n, ...] at every position the pass committed, in order (the
last row produced the newest token); one that owns `ModelRunner`s lists them in `runners()` (no two models may
share one cache).

The one rule that keeps caches right: a cache only ever holds committed tokens at the start of a
round, and each forward feeds a model every token its cache has not seen yet. Each model's cache
belongs to its `ModelRunner` (allocated once, rolled back by moving a pointer; CUDA graphs on a GPU).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property

import torch

from .checks import check_count, check_prompt_ids, check_sampling
from .checks import is_int as _is_int
from .runner import ModelRunner, as_runner, attention_backends, forward_uncached  # noqa: F401 (re-exported)
from .sampling import sample_token, warp_logits
from .verify import Verifier, greedy_verify  # noqa: F401 (re-exported)


# --------------------------------------------------------------------------- results
@dataclass
class RoundStats:
    """What one round (one target pass that commits tokens: `GenerationResult`) did. `gamma` is the policy's choice
    for the round, `drafted` the tokens actually proposed, `accepted` how many the verifier accepted (a draft past
    the token budget is never counted; an EOS among them ends the output, so `new_tokens` may be fewer than
    `accepted` + 1); `stop` says why drafting ended: "gamma" (reached the policy's gamma), "budget" (the token
    budget left fewer than gamma + 1 tokens), "tree" (a draft's tree), "no draft" (plain decoding, or a first round
    with nothing to draft from yet), or the policy's own reason ("entropy", ...).
    `draft_calls` counts draft passes (a policy that stops *before* a token has paid for the
    pass that told it to stop). Times are wall-clock milliseconds on the host."""
    gamma: int
    drafted: int
    accepted: int
    stop: str
    draft_calls: int
    new_tokens: int
    draft_ms: float
    verify_ms: float
    bookkeeping_ms: float
    detail: dict = field(default_factory=dict)  # a proposer's own counts (e.g. per level, notebook 05)


@dataclass
class GenerationResult:
    """What one generation produced and what it cost: the engine and the device loop (`device_loop.DeviceLoop`)
    return this one type, counted by one rule.

    A *round* is a target pass that commits tokens (it verifies the round's drafts, if any, and adds the target's
    own token after the accepted ones); `rounds` holds one `RoundStats` per round (empty for methods that run outside
    the engine). `target_calls` counts every target forward pass: the rounds, plus a prefill pass that commits
    nothing where an executor runs one. The engine's prefill is its first round's pass (target_calls ==
    len(rounds)); the device loop first runs a pass over all of the prompt but its last token (target_calls ==
    len(rounds) + 1), except for a one-token prompt, whose one prefill pass makes the first token: a round. So
    `tokens_per_target_call` (the course's tau) always counts the prefill's pass, and `tokens_per_round` (new tokens
    per round, the papers' acceptance length) counts no pass that commits nothing; on the engine they are equal.

    `draft_calls` counts draft forward passes; `drafted` and `accepted` count draft tokens proposed and accepted by
    the target, and `accepted_per_position[i]` how often draft position i (0-based) was accepted. A draft is counted
    as accepted only if it was kept: never one past `max_new_tokens` (the engine never drafts past it; the device
    loop, whose rounds have one shape, drafts `gamma` tokens even there, and `drafted` counts them).
    """
    new_token_ids: list[int] = field(default_factory=list)
    target_calls: int = 0
    draft_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    rounds: list[RoundStats] = field(default_factory=list)
    method: str = ""

    @property
    def acceptance_rate(self) -> float:
        """Fraction of drafted tokens the target accepted (accepted / drafted)."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def tokens_per_target_call(self) -> float:
        """New tokens per target forward pass, the prefill's included (the class docstring): about 1 for plain
        decoding, up to gamma + 1. The course's tau."""
        return len(self.new_token_ids) / self.target_calls if self.target_calls else float("nan")

    @property
    def accepted_per_round(self) -> list[int]:
        """Drafts the target accepted in each round."""
        return [r.accepted for r in self.rounds]

    @property
    def tokens_per_round(self) -> float:
        """New tokens per round, a round being a target pass that commits tokens (the class docstring): a prefill
        pass that commits nothing is left out, the papers' acceptance length. On the engine, whose prefill is its
        first round, it equals `tokens_per_target_call`."""
        return len(self.new_token_ids) / len(self.rounds) if self.rounds else float("nan")

    def round_sums(self) -> dict:
        """Sums over `rounds` (what the bench JSON records): time per part and stop reasons."""
        stops: dict[str, int] = {}
        detail: dict[str, int] = {}
        for r in self.rounds:
            stops[r.stop] = stops.get(r.stop, 0) + 1
            for key, value in r.detail.items():
                if isinstance(value, (int, float)):
                    detail[key] = detail.get(key, 0) + value
        sums = {"rounds": len(self.rounds),
                "draft_ms": sum(r.draft_ms for r in self.rounds),
                "verify_ms": sum(r.verify_ms for r in self.rounds),
                "bookkeeping_ms": sum(r.bookkeeping_ms for r in self.rounds),
                "stops": stops}
        if detail:
            sums["detail"] = detail
        return sums


# --------------------------------------------------------------------------- sampling settings
@dataclass(frozen=True)
class Sampler:
    """How tokens are chosen: greedy at temperature 0, else sampled from the warped distribution
    (temperature, then top-k, then top-p; `sampling.warp_logits`). The draft and the target are
    warped with the same settings, which keeps speculative sampling lossless and its acceptance high."""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return warp_logits(logits, self.temperature, self.top_k, self.top_p)


# --------------------------------------------------------------------------- proposing
@dataclass
class DraftStep:
    """One token the draft is about to propose, as a drafting policy sees it. `position` counts
    from 0 within the round, `index` within the whole generation (tokens already committed +
    position). `probs` is the distribution the token is sampled from (None when greedy); the
    derived `confidence_probs`, `entropy` and `token_prob` use the draft's plain softmax
    (temperature 1) when greedy, so that they still measure how sure the draft is.

    When sampling, `stop_before` is asked before the token is drawn, so it cannot read `token`
    (or `token_prob`): a rule that dropped a token because of which token it was would hand the
    verifier tokens that are not distributed as `probs`, and the output would no longer be the
    target's. `stop_after` sees the drawn token; greedy tokens (the argmax) are always visible."""
    position: int
    index: int
    logits: torch.Tensor
    drawn: int | None  # the token, once drawn
    probs: torch.Tensor | None
    hidden: torch.Tensor | None = None  # the draft's last hidden state here, if a policy asked

    @property
    def token(self) -> int:
        if self.drawn is None:
            raise RuntimeError("a sampled draft token is drawn after stop_before: a stop decision that reads "
                               "it would bias the proposal, so read step.probs / step.entropy there, or the "
                               "token in stop_after")
        return self.drawn

    @cached_property
    def confidence_probs(self) -> torch.Tensor:
        return self.probs if self.probs is not None else self.logits.float().softmax(-1)

    @cached_property
    def entropy(self) -> float:
        """Shannon entropy of the draft's next-token distribution, in nats."""
        return float(torch.special.entr(self.confidence_probs).sum())

    @cached_property
    def token_prob(self) -> float:
        """The draft's probability of the token it chose."""
        return float(self.confidence_probs[self.token])


@dataclass
class Proposal:
    """A round's candidates: `tokens` [k] and, when sampling, `probs` [k, V], the distributions
    q_i they were drawn from (what rejection sampling needs). `draft_calls` counts draft passes;
    `detail` holds a proposer's own per-round counts, copied to `RoundStats.detail`.

    A tree (notebook 06) also sets `parents` [k] (`tree.py`: parents[i] < i, -1 = a child of the
    root); None means a chain (parents arange(k) - 1). `probs` is the distribution each node was drawn
    from, or None when every node was chosen deterministically (top-k guesses, or greedy), which
    sampled verification treats as one-hot."""
    tokens: torch.Tensor
    probs: torch.Tensor | None
    stop: str
    draft_calls: int
    vocab: int | None = None  # logits per position of the proposing model, once it ran
    detail: dict = field(default_factory=dict)
    parents: torch.Tensor | None = None


class NoDraft:
    """Proposes nothing: every round is one target step. This is plain decoding (`ar`)."""

    def propose(self, tokens, gamma, policy, sampler, generator, index) -> Proposal:
        return Proposal(tokens[0, :0], None, "no draft", 0)

    def rollback(self, committed: int) -> None:
        pass


def draw_chain(first, advance, gamma: int, policy, sampler: Sampler, generator, index: int):
    """The token loop of a proposer whose tokens come one slot after another (an EAGLE chain, a block drafter's
    slots). `first` is (full-vocabulary logits [V], greedy token) of the first slot; `advance(token, position)`
    returns the same for the next slot once `token` was drafted at `position`. Before each token the policy may
    stop (`stop_before`: it must not read a sampled token); the token is the greedy one or is drawn from the
    sampler's warped logits; after it the policy may stop (`stop_after`). Returns (drafted token ids, the
    distributions they were drawn from [k, V] or None when greedy, the stop reason)."""
    drafted, rows, stop = [], [], "gamma"
    logits, best = first
    for position in range(gamma):
        probs = None if sampler.greedy else sampler.probs(logits)
        step = DraftStep(position, index + position, logits, None, probs, None)
        if sampler.greedy:
            step.drawn = best
        if policy.stop_before(step):
            stop = policy.reason
            break
        if not sampler.greedy:
            step.drawn = sample_token(probs, generator)
        drafted.append(step.drawn)
        rows.append(probs)
        if policy.stop_after(step):
            stop = policy.reason
            break
        if position + 1 < gamma:
            logits, best = advance(step.drawn, position)
    return drafted, (torch.stack(rows) if rows and rows[0] is not None else None), stop


class DraftModelProposer:
    """A draft model proposes up to `gamma` tokens, one forward each, asking the policy before
    and after every token whether to go on (Leviathan et al. 2023, Algorithm 1, step 1).
    `draft`: a model, or a `ModelRunner` (which then owns the draft's cache and graphs)."""

    def __init__(self, draft):
        self.runner = as_runner(draft)

    @property
    def draft(self):
        return self.runner.model

    def propose(self, tokens, gamma, policy, sampler, generator, index) -> Proposal:
        rows, stop, forwards, vocab = [], "gamma", 0, None
        candidate = tokens
        hidden = "head" if policy.needs_hidden else None
        for position in range(gamma):
            out = self.runner.forward(candidate, 1, hidden)
            logits, state = out if hidden else (out, None)
            forwards, vocab = forwards + 1, logits.shape[-1]
            probs = None if sampler.greedy else sampler.probs(logits[-1])
            step = DraftStep(position, index + position, logits[-1], None, probs,
                             state[-1] if state is not None else None)
            if sampler.greedy:
                step.drawn = int(logits[-1].argmax())
            if policy.stop_before(step):  # decided before a sampled token is drawn
                stop = policy.reason
                break
            if not sampler.greedy:
                step.drawn = sample_token(probs, generator)
            rows.append(probs)
            candidate = torch.cat([candidate, candidate.new_tensor([[step.drawn]])], dim=1)
            if policy.stop_after(step):
                stop = policy.reason
                break
        draft_tokens = candidate[0, tokens.shape[1]:]
        draft_probs = torch.stack(rows) if rows and rows[0] is not None else None
        return Proposal(draft_tokens, draft_probs, stop, forwards, vocab)

    def rollback(self, committed: int) -> None:
        # After a fully accepted round the draft's cache lacks its last proposal: keep what it has.
        self.runner.keep_at_most(committed)

    def runners(self) -> tuple:
        """The runners (caches) this proposer owns; the loop checks that no two models share one."""
        return (self.runner,)


# --------------------------------------------------------------------------- the loop
@torch.inference_mode()
def decode(target, proposer, policy, input_ids: torch.Tensor, max_new_tokens: int, sampler: Sampler,
           eos_ids: set[int], generator=None, method: str = "", verifier=None) -> GenerationResult:
    """The decode loop every method runs: propose, verify in one target pass, commit, roll back.

    `target`: a model or its `ModelRunner`; `verifier`: a `verify.Verifier` (default: exact).
    Stops after `max_new_tokens` tokens or after a token in `eos_ids`. A round never drafts past
    the budget (k drafts + 1 target token <= tokens left). The first target pass is also the
    prefill, so a draft that is always accepted needs ceil(n / (gamma + 1)) target passes.
    """
    target = as_runner(target)
    runners = [target, *getattr(proposer, "runners", tuple)()]
    if len({id(r) for r in runners}) < len(runners):
        raise ValueError("two models of this generation share one ModelRunner (one cache): give each its own runner "
                         "(the same model may drive several)")
    target.begin(input_ids.shape[1])
    proposer.rollback(0)  # a new generation: a draft runner reused from an earlier call keeps nothing of it
    return _decode(target, proposer, policy, verifier or Verifier(), input_ids, max_new_tokens, sampler, eos_ids,
                   generator, method)


def _decode(target: ModelRunner, proposer, policy, verifier, input_ids, max_new_tokens, sampler, eos_ids,
            generator, method):
    result = GenerationResult(accepted_per_position=[0] * getattr(policy, "initial_gamma", 0), method=method)
    tokens = input_ids  # prompt + committed
    vocab = _vocab_size(target.model)
    hidden = getattr(proposer, "target_hidden", "norm") if getattr(proposer, "needs_target_hidden", False) else None
    start = time.perf_counter()
    while not finished(result.new_token_ids, max_new_tokens, eos_ids):
        t0 = time.perf_counter()
        gamma = policy.round_gamma()
        room = max_new_tokens - len(result.new_token_ids) - 1  # k drafts + 1 target token
        proposal = proposer.propose(tokens, min(gamma, room), policy, sampler, generator,
                                    len(result.new_token_ids))
        k = len(proposal.tokens)
        stop = "budget" if proposal.stop == "gamma" and room < gamma else proposal.stop
        _check_vocab(proposal, vocab)  # before the forward: on a GPU an id out of range is a device assert
        t1 = time.perf_counter()

        prefix = tokens.shape[1]
        parents = proposal.parents if proposal.parents is not None else _chain(k)
        out = target.forward_tree(tokens, proposal.tokens, parents, num_logits=k + 1, hidden=hidden)
        target_logits, states = out if hidden else (out, None)
        if vocab is None and proposal.vocab not in (None, target_logits.shape[-1]):
            raise ValueError(f"draft and target must share the output vocabulary, got "
                             f"{proposal.vocab} and {target_logits.shape[-1]} logits")
        verdict = verifier(proposal, target_logits, sampler, generator)
        t2 = time.perf_counter()

        n_accepted = len(verdict.tokens) - 1
        kept = append_until_eos(result.new_token_ids, verdict.tokens, eos_ids)
        tokens = torch.cat([tokens, tokens.new_tensor([kept])], dim=1)
        committed = tokens.shape[1] - 1  # the newest token is in no cache yet
        target.commit(prefix, verdict.path[:len(kept)], committed)
        if hidden:  # the states of every position now committed that this pass fed: the rows before the tree
            before = states.shape[0] - k  # (the uncached prompt tokens, the root last), then the accepted nodes
            accepted = torch.as_tensor(list(verdict.path[:len(kept) - 1]), dtype=torch.long)
            rows = torch.cat([torch.arange(before), before + accepted]).to(states.device)
            proposer.observe_target(states[rows])
        proposer.rollback(committed)
        if len(result.accepted_per_position) < n_accepted:
            result.accepted_per_position += [0] * (n_accepted - len(result.accepted_per_position))
        for position in range(n_accepted):
            result.accepted_per_position[position] += 1
        result.target_calls += 1
        result.draft_calls += proposal.draft_calls
        result.drafted += k
        result.accepted += n_accepted
        stats = RoundStats(gamma, k, n_accepted, stop, proposal.draft_calls, len(kept),
                           (t1 - t0) * 1e3, (t2 - t1) * 1e3, 0.0, proposal.detail)
        policy.observe(stats)
        stats.bookkeeping_ms = (time.perf_counter() - t2) * 1e3
        result.rounds.append(stats)
    result.wall_s = time.perf_counter() - start
    return result


def _chain(k: int) -> torch.Tensor:
    return torch.arange(k) - 1


def _vocab_size(model) -> int | None:
    """Token ids the model's embedding table holds (None when the model does not say)."""
    embeddings = getattr(model, "get_input_embeddings", None)
    table = embeddings() if callable(embeddings) else None
    return getattr(table, "num_embeddings", None)


def _check_vocab(proposal: Proposal, vocab: int | None) -> None:
    if vocab is None or not len(proposal.tokens):
        return
    if proposal.vocab not in (None, vocab):
        raise ValueError(f"draft and target must share the output vocabulary, got {proposal.vocab} and {vocab} "
                         f"token ids")
    largest = int(proposal.tokens.max())
    if largest >= vocab:
        raise ValueError(f"draft and target must share the output vocabulary: the draft proposed token id "
                         f"{largest}, which the target's embedding table (size {vocab}) does not hold")


def append_until_eos(new_token_ids: list[int], tokens: list[int], eos_ids: set[int]) -> list[int]:
    """Append `tokens` to `new_token_ids`, stopping after the first EOS; return what was kept."""
    kept = []
    for token in tokens:
        kept.append(token)
        if token in eos_ids:
            break
    new_token_ids.extend(kept)
    return kept


def finished(new_token_ids: list[int], max_new_tokens: int, eos_ids: set[int]) -> bool:
    return len(new_token_ids) >= max_new_tokens or bool(new_token_ids and new_token_ids[-1] in eos_ids)


def as_id_set(eos_token_id) -> set[int]:
    """None, one id, or a collection of ids (a list, a set, a tensor) -> a set of ids."""
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.flatten().tolist()
    if _is_int(eos_token_id):
        return {int(eos_token_id)}
    try:
        ids = list(eos_token_id)
    except TypeError:
        ids = None
    if ids is None or not all(_is_int(token) for token in ids):
        raise ValueError(f"eos_token_id must be None, a token id or a collection of token ids, got {eos_token_id!r}")
    return {int(token) for token in ids}


def check_arguments(input_ids, max_new_tokens, temperature, top_k, top_p, gamma=None) -> None:
    """Reject bad arguments with a message naming the argument and what is allowed (the rules of `checks.py`, which
    the device loop and `sampling.warp_logits` apply too)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.shape[0] != 1:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a tensor of shape [1, seq_len] (batch size 1 only), got {shape}")
    check_prompt_ids(input_ids)
    check_count("max_new_tokens", max_new_tokens)
    if gamma is not None:
        check_count("gamma", gamma)
    check_sampling(temperature, top_k, top_p)
