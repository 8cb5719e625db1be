"""A whole greedy speculative round on the device: draft, verify, accept and commit with no host work in
between, replayed from one CUDA graph, with one read-back per round.

The graphed runners of notebook 09 replay each *pass* from a graph, but the loop around the passes stays on
the host: before every pass it builds the positions and the mask on the CPU and copies them into the
graph's inputs, and after every draft step it reads the drafted token back to decide what to feed next. On
an H100 that host work costs about as much as the GPU work for a 135M target (0.5 ms per draft step for a
draft whose step is a fraction of that). Here everything a round needs lives on the GPU:

    state      tokens [capacity] (the prompt and every token committed so far), L (how many), the caches
    draft      gamma steps (the draft model's, or an EAGLE head's), each token the argmax of the last step,
               fed straight into the next one
    verify     one target pass over [token L-1, d_0 .. d_gamma-1] at positions L-1 .. L+gamma-1; the mask is
               computed in the graph from the positions (slot s is visible to row r iff s <= L-1+r)
    accept     n = the number of leading drafts equal to the target's argmax (a cumulative product), the
               bonus token = the target's argmax after them; both written into `tokens`; L += n + 1
    read back  n and the round's tokens: one small copy, the only time the host waits for the GPU

No rollback is needed: every cache is indexed by position. After a round that accepted n drafts, the first rejected
draft's keys and values sit at the new L - 1, where the next round's first row (the newest committed token) writes
before anything attends to them; the later ones sit past it, hidden by the mask until a later round overwrites
them. Rounds have a fixed shape (gamma drafts, gamma+1 verified rows), which is what lets one graph serve every
round; the price is that a round always drafts gamma tokens, even past the last one the caller asked for (the extra
ones are dropped, and not counted as accepted: the statistics follow the engine's, `DeviceLoop._result`). gamma=0 is
the target alone through the same machinery: the fair baseline.

`DeviceTreeLoop` does the same for EAGLE-2's dynamic tree in fixed shapes (the frontier grown one head step per depth,
the nodes reranked, one tree pass, the acceptance walk as tensor operations, the accepted path's keys and values
gathered into place).

Greedy, the output is the target's own greedy output up to floating-point rounding (float32: the same tokens, tested
on the CPU against transformers' forward and measured on the GPU). Sampled chains (`temperature > 0`) run notebook
02's rule in the same fixed shapes, with no host work in between:

    draft      each draft token drawn from the draft's warped distribution q_k (inverse CDF of one uniform), fed on
    verify     the same pass; the target's warped distributions p_0 .. p_gamma
    accept     draft k kept iff u_k * q_k(d_k) < p_k(d_k); n = the leading run of kept drafts
    after      one token drawn from norm(max(0, p_n - q_n)), with q_gamma = 0 (so after gamma kept drafts it is
               p_gamma itself, the bonus); an empty residual falls back to p_n, as in the engine

The round's 2 gamma + 1 uniforms are drawn on the host from the caller's `torch.Generator` (float64, like the
engine's) and copied into a static buffer before the round: the same seed gives the same draws on any device,
and the copy is a write, so the round still reads back once. A sampled tree (`DeviceTreeLoop`) walks its nodes
with the engine's tensor walk (`sampling.accept_tree_sampled`, SpecInfer's rule), which reads one uniform per node it
tries and one for the token after: the round is handed nodes + 1 uniforms, reads back how many it used, and the
generator is left exactly that many draws on, as the engine's walk leaves it.
"""
from __future__ import annotations

import time

import torch

from . import tree_attention
from .checks import check_count, check_prompt_ids, check_sampling, is_count
from .engine import GenerationResult, RoundStats, Sampler, append_until_eos, as_id_set, finished
from .graphs import GraphCache
from .kv_cache import move_path
from .plain_llama import PlainLlama, check_plain_llama, recompile_room
from .runner import attention_backends
from .sampling import accept_greedy, accept_sampled, accept_tree_greedy, accept_tree_sampled, draw
from .tree import tree_allowed

CHUNK = 128  # capacity is rounded up to a multiple of this


def top_k_rows(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the `k` largest entries along the last dimension of `x`, largest first, a tie to the lower
    index: `torch.topk` for a small k as k argmax passes, each removing its winner. On a GPU `topk` over a row of the
    head's vocabulary is a radix select run by one thread block per row, the largest item of the tree's drafting in
    notebook 09's profile (data/bench/device_round_profile_h100.json); k argmax reductions, which the compiler fuses
    with the operations around them, cost a few kernels of a few microseconds."""
    # a removed winner becomes -inf, below every entry left (an entry that was -inf already counts as the lowest
    # finite value), so the k indices are distinct whatever the row holds
    work, indices = x.clamp(min=torch.finfo(x.dtype).min), []
    for j in range(k):
        i = work.argmax(-1, keepdim=True)
        indices.append(i)
        if j + 1 < k:
            work = work.scatter(-1, i, float("-inf"))
    indices = torch.cat(indices, -1)
    return x.gather(-1, indices), indices


def _compiling(method):
    """Run a loop's entry point with dynamo's recompile limit raised for a compiled loop (its steps compile once per
    shape; the default limit, 8, would leave later shapes eager), restored afterwards: nothing global changes."""
    import functools

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with recompile_room(self.compiled):
            return method(self, *args, **kwargs)
    return run


class DeviceLoop:
    """Speculative decoding with the round on the device, greedy or sampled (see the module docstring).

    `DeviceLoop(target)` (gamma 0) is the target alone; `DeviceLoop(target, draft=draft, gamma=4)` a draft
    model's chain; `DeviceLoop(target, head=head, gamma=5)` an EAGLE head's chain (`eagle.EagleHead`);
    `DeviceLoop(target, drafter=drafter, gamma=7)` a block drafter's block (`block.BlockDrafter`: one pass drafts
    the block, its Markov head, if any, then walks the slots; the fused target features sit in a buffer). The
    target and a draft are plain Llamas (`plain_llama.PlainLlama`). `graphs` (default: on a CUDA GPU) records
    the round as one CUDA graph. `compile=True` (or "steps") first compiles the target's pass, the draft's step and
    the head's step with `torch.compile`, each on its own, the glue between them (argmax, masks, acceptance, commit)
    left as separate small kernels; `compile="round"` also compiles the whole round as one graph (`fullgraph`), so
    that the glue is fused too. On the CPU the round runs op by op unless compiled (how the tests check it).
    `temperature` > 0 samples (warped with `top_k` and `top_p` as in the engine, the draft's distribution too): the
    output is distributed exactly as the target's own sampling; temperature 0 (the default) is greedy."""

    def __init__(self, target, draft=None, head=None, gamma: int = 4, capacity: int = 512, graphs: bool | None = None,
                 compile: bool | str = False, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 attention: str = "sdpa", drafter=None):
        check_sampling(temperature, top_k, top_p)  # the engine's rules (`checks.py`)
        if attention not in ("sdpa", "triton"):
            raise ValueError(f"attention must be 'sdpa' (PyTorch's attention with a mask over the whole buffer) or "
                             f"'triton' (notebook 08's kernel, reading the prefix unmasked), got {attention!r}")
        if attention == "triton":
            if not tree_attention.AVAILABLE:
                raise ValueError(f"attention='triton' needs Triton: {tree_attention.WHY}")
        self.attention = attention
        if compile not in (False, True, "steps", "round"):
            raise ValueError(f"compile must be False, True or 'steps' (each pass compiled), or 'round' (the whole "
                             f"round compiled as one graph), got {compile!r}")
        check_count("gamma", gamma, 0, "an integer >= 0 (0: the target alone)")
        gamma = int(gamma)  # (a numpy integer, as the engine takes)
        given = sum(m is not None for m in (draft, head, drafter))
        if given > 1:
            raise ValueError("give one of a draft model, an EAGLE head or a block drafter, not several")
        if gamma > 0 and not given:
            raise ValueError(f"gamma={gamma} needs a draft model, an EAGLE head or a block drafter (gamma=0 is the "
                             f"target alone)")
        if gamma == 0 and given:
            raise ValueError("gamma=0 drafts nothing: leave out the draft, or give gamma >= 1")
        if drafter is not None and gamma > drafter.block_size - 1:
            raise ValueError(f"gamma must be at most {drafter.block_size - 1} (this drafter's block_size - 1), "
                             f"got {gamma}")
        check_plain_llama(target.config)
        if draft is not None:
            check_plain_llama(draft.config)
        self.device = next(target.parameters()).device
        self.graphs = self.device.type == "cuda" if graphs is None else bool(graphs)
        if self.graphs and self.device.type != "cuda":
            raise ValueError(f"graphs=True needs a CUDA GPU; the target is on {self.device}")
        self.gamma, self.head, self.drafter, self.compiled = gamma, head, drafter, bool(compile)
        self.borrower = head if head is not None else drafter  # the module whose draft vocabulary the drafts use
        # the warping of every distribution (the draft's and the target's alike, as in the engine); greedy at 0
        self.sampler = Sampler(temperature, top_k, top_p)
        self.sampled = not self.sampler.greedy
        self.compile_mode = ("steps" if compile is True else compile) or None
        self.scratch = getattr(self, "scratch", 0)  # head cache slots past the positions (a tree's entries)
        self.method = "ar" if gamma == 0 else ("sampling" if self.sampled else "greedy") if draft is not None \
            else "eagle-chain" if head is not None else "block"
        self.target = PlainLlama(target, 1, CHUNK)
        self.draft = PlainLlama(draft, 1, CHUNK) if draft is not None else None
        self.taps = tuple(self.borrower.target_hidden) if self.borrower is not None else ()
        self.steps = {"verify": self._verify, "draft": self._draft_step, "head": self._head_step,
                      "block": self._block_step}
        if self.compiled:  # (dynamo's recompile limit is raised while a loop runs: `recompile_room`)
            self.steps = {k: torch.compile(f, dynamic=False) for k, f in self.steps.items()}
        # what a generation runs and a graph records (the compiled steps inlined into it with "round")
        self.round_fn = torch.compile(self._round, dynamic=False, fullgraph=True) if compile == "round" else self._round
        self.capacity, self.graph = 0, None
        self.recorded = GraphCache()  # the round's graph and its memory pool, dropped together with the buffers
        self._allocate(capacity)

    def set_gamma(self, gamma: int) -> None:
        """Draft `gamma` tokens per round from now on (the round is recorded again; a compiled step keeps what it
        compiled for the shapes it has seen)."""
        if self.gamma == 0 or not is_count(gamma):
            raise ValueError(f"set_gamma takes an integer >= 1 on a loop with a draft or a head, got {gamma!r} "
                             f"on a loop with gamma={self.gamma}")
        self.gamma = int(gamma)
        self._allocate(self.capacity)

    @property
    def span(self) -> int:
        """How many slots past L a round may write (the verified rows, and the token after them)."""
        return self.gamma + 1

    # ------------------------------------------------------------------ buffers
    def _allocate(self, capacity: int) -> None:
        capacity = -(-max(capacity, CHUNK) // CHUNK) * CHUNK
        device = self.device
        for core in (self.target, self.draft):
            if core is not None:
                core.grow(capacity)
        self.capacity = capacity
        with torch.inference_mode(False):
            self.tokens = torch.zeros(capacity, dtype=torch.long, device=device)
            self.L = torch.zeros(1, dtype=torch.long, device=device)
            # a round's read-back: n, the tokens at L .. L + gamma, how many of its uniforms it used, and whether its
            # own checks held (1; a tree's: `DeviceTreeLoop._round`)
            self.out = torch.zeros(self.gamma + 4, dtype=torch.long, device=device)
            # a sampled round's draws (a chain: gamma for the drafts, gamma for the acceptances, one for the token
            # after, all used; a tree: `_draws`)
            self.uniforms = torch.zeros(self._draws(), dtype=torch.float64, device=device)
            self.all_used = torch.full((1,), self.uniforms.shape[0] if self.sampled else 0, device=device)
            self.held = torch.ones(1, dtype=torch.long, device=device)
            if self.head is not None:
                head = self.head
                weight = head.k.weight
                self.head_k = weight.new_zeros(head.n_kv, capacity + self.scratch, head.head_dim)
                self.head_v = torch.zeros_like(self.head_k)
                self.h0 = weight.new_zeros(1, head.hidden_size)
                self.logits0 = weight.new_zeros(1, head.draft_vocab)
            if self.drafter is not None:  # the fused target features of every committed position, by position
                self.context = self.drafter.fc.weight.new_zeros(capacity, self.drafter.hidden_size)
        self.cols = torch.arange(capacity, device=device)
        if self.attention == "triton":  # the target's pass reads its rows' block mask and the prefix unmasked
            self.causal = torch.ones(self.span, self.span, dtype=torch.bool, device=device).tril()
            self.splits = tree_attention.block_splits(capacity, self.span, self.target.kv_heads, device)
        self.head_cols = torch.arange(capacity + self.scratch, device=device)
        self.offsets = torch.arange(self.gamma + 2, device=device)
        self.graph = None  # recorded on the old buffers: the graph and its pool go
        self.recorded.invalidate()

    DRAWS_VARY = False  # a chain's sampled round uses every uniform it is handed; a tree's, only those it tries

    def _draws(self) -> int:
        """How many uniforms a round is handed."""
        return 2 * self.gamma + 1

    # ------------------------------------------------------------------ the steps (compiled with compile=True)
    def _visible(self, rows):
        """The mask of rows at positions `rows` [n] over the whole buffer: slot s is visible iff s <= the row's
        position (every cache here is indexed by position)."""
        return self.cols[None] <= rows[:, None]

    def _target_pass(self, ids, positions, slots, mask):
        """The target's body over `ids` [n] at `positions` [n], written at `slots` [n]: with SDPA `mask` [n, capacity]
        says which slots each row sees; with attention="triton" it is the rows' own [n, n] block, every row seeing the
        whole prefix before `slots[0]` (the rows sit at consecutive slots). Returns (hidden states, tapped features)."""
        if self.attention == "triton":
            return self.target.body(ids[None], positions[None], slots, None, self.capacity, self.taps,
                                    block=(slots[:1], mask, self.splits))
        return self.target.body(ids[None], positions[None], slots, mask[None], self.capacity, self.taps)

    def _verify(self, ids, rows):
        """The target's pass over `ids` [n] at positions `rows` [n]: (its argmax at every row [n], the EAGLE
        features [n, F] or None)."""
        n = rows.shape[0]  # a chain: causal, on the kernel as a block after the prefix
        x, tapped = self._target_pass(ids, rows, rows,
                                      self.causal[:n, :n] if self.attention == "triton" else self._visible(rows))
        return self._choice(self.target.logits(x)[0]), (torch.cat(tapped, -1)[0] if tapped else None)

    def _draft_step(self, ids, rows):
        """The draft model fed `ids` [n] at positions `rows` [n]: its choice after the last one (`_choice`)."""
        core = self.draft
        x, _ = core.body(ids[None], rows[None], rows, self._visible(rows)[None], self.capacity)
        return self._choice(core.logits(x[:, -1]))  # [1] or [1, V]

    def _choice(self, logits):
        """What a round needs of logits [n, V]: greedy, the argmax of each row [n]; sampled, each row's warped
        distribution [n, V] (float64, as the engine compares them)."""
        return self.sampler.probs(logits).double() if self.sampled else logits.argmax(-1)

    def _head_step(self, features, tokens, rows, own: bool, slots=None, mask=None):
        """The EAGLE head's layer over entries (features [n, F|H], tokens [n]) at positions `rows` [n], its keys
        and values written at slots `slots` (default: the positions), attending where `mask` [n, slots of the head's
        cache] allows (default: slot <= position): (h [n, H], draft-vocabulary logits [n, V'])."""
        slots = rows if slots is None else slots
        mask = self.head_cols[None] <= rows[:, None] if mask is None else mask
        return self.head.cached_step(features, tokens, rows, self.head_k, self.head_v, slots, mask, own)

    def _block_step(self, anchor, position):
        """The block drafter's pass for the anchor token `anchor` [1] at `position` [1], reading the fused features
        of every position before it: draft-vocabulary logits of its slots [block_size - 1, V']."""
        mask = (self.cols < position)[None, None]  # [1, 1, capacity]: rows past the anchor are stale or empty
        return self.drafter(self.context[None], anchor[None], position[None], mask)[0, 0]

    def _to_full(self, draft_ids):
        ids = self.borrower.vocab_ids
        return draft_ids if ids is None else ids[draft_ids]

    # ------------------------------------------------------------------ one round
    def _pick(self, choice, k: int):
        """Draft k's token [1] and the distribution it was drawn from [1, V] (None when greedy): `choice` is a
        step's `_choice` (the argmax, or the warped distribution, drawn from with uniform k)."""
        if not self.sampled:
            return choice, None
        return draw(choice, self.uniforms[k:k + 1]), choice

    def _head_pick(self, logits, k: int):
        """`_pick` for the EAGLE head's draft-vocabulary logits [1, V']: a full-vocabulary token, and q over the
        full vocabulary (zero outside the head's tokens)."""
        token, q = self._pick(self._choice(logits), k)
        if q is not None and self.borrower.vocab_ids is not None:
            q = q.new_zeros(1, self.borrower.vocab_size).index_copy_(1, self.borrower.vocab_ids, q)
        return self._to_full(token), q

    def _draft(self, L):
        """gamma drafted tokens [gamma], each fed straight into the next step, and (sampled) the distributions they
        were drawn from [gamma, V] (None when greedy)."""
        g, steps = self.gamma, self.steps
        if self.draft is not None:
            # the draft re-reads the newest two committed tokens: whether the last round accepted every draft
            # or not, its cache then holds every committed position (re-writing one it had is harmless)
            rows = L - 2 + self.offsets[:2]
            token, q = self._pick(steps["draft"](self.tokens.index_select(0, rows), rows), 0)
            drafted, qs = [token], [q]
            for k in range(1, g):
                token, q = self._pick(steps["draft"](token, L + k - 1), k)  # d_(k-1) sits at position L + k - 1
                drafted.append(token)
                qs.append(q)
        elif self.drafter is not None:
            # a block: one pass from the newest committed token; slot k's logits get the Markov head's bias from
            # the token drafted before it (none without a Markov head), so each slot's q is fixed before its draw
            anchor = self.tokens.index_select(0, L - 1)
            logits = steps["block"](anchor, L - 1)
            drafted, qs, token = [], [], anchor
            for k in range(g):
                token, q = self._head_pick(logits[k:k + 1] + self.drafter.markov(token), k)
                drafted.append(token)
                qs.append(q)
        else:
            # EAGLE: the head's output for the newest committed entry (kept by the last round's catch-up)
            h = self.h0
            token, q = self._head_pick(self.logits0, 0)
            drafted, qs = [token], [q]
            for k in range(1, g):  # entry (h, d_(k-1)) sits at position L + k - 2
                h, logits = steps["head"](h, token, L + k - 2, own=True)
                token, q = self._head_pick(logits, k)
                drafted.append(token)
                qs.append(q)
        return torch.cat(drafted), (torch.cat(qs) if self.sampled else None)

    def _accept(self, drafts, q, target):
        """(n, the target's token after the n leading drafts it keeps [1]): the engine's own acceptance functions.
        Greedy: `target` is its argmax at each verified row [gamma + 1] (`sampling.accept_greedy`). Sampled:
        `target` is p [gamma + 1, V], `q` [gamma, V] what the drafts were drawn from, and the round's last gamma + 1
        uniforms decide (`sampling.accept_sampled`, notebook 02's rule)."""
        if not self.sampled:
            return accept_greedy(drafts, target)
        return accept_sampled(drafts, q, target, self.uniforms[self.gamma:])  # (q None: gamma 0, nothing drafted)

    def _round(self):
        g, L = self.gamma, self.L
        drafts, q = self._draft(L) if g else (self.tokens[:0], None)
        rows = L - 1 + self.offsets[:g + 1]  # the newest committed token, then the drafts
        target, features = self.steps["verify"](torch.cat([self.tokens.index_select(0, L - 1), drafts]), rows)
        n, after = self._accept(drafts, q, target)
        self.tokens.index_copy_(0, rows[1:], drafts)
        self.tokens.index_copy_(0, L + n, after)  # the target's own token after them
        return self._finish(L, n, rows, features)

    def _finish(self, L, n, rows, features, used=None, held=None):
        """The end of a round that kept n drafts: for an EAGLE head, its entries (feature p, token p+1) for the
        verified positions `rows` [gamma + 1] (`features`: the target's at those positions); entry L + n - 1, whose
        token is the newest committed one (at L + n), drafts the next round (rows past it are overwritten before being
        read). Then the round's result into `out` (n, the tokens at L .. L + gamma, the uniforms `used` [1], default
        all of them, and `held` [1], 0 where a check of the round failed, default 1: read back with the rest, so a
        check costs no read of its own) and L += n + 1."""
        if self.drafter is not None:  # the verified positions' features (rows past L + n are rewritten before read)
            self.context.index_copy_(0, rows, self.drafter.fuse(features))
        if self.head is not None:
            h, logits = self.steps["head"](features, self.tokens.index_select(0, rows + 1), rows, own=False)
            self.h0.copy_(h.index_select(0, n.view(1)))
            self.logits0.copy_(logits.index_select(0, n.view(1)))
        self.out.copy_(torch.cat([n.view(1), self.tokens.index_select(0, L + self.offsets[:self.gamma + 1]),
                                  self.all_used if used is None else used.view(1),
                                  self.held if held is None else held.view(1).long()]))
        self.L.add_(n + 1)
        return self.out

    # ------------------------------------------------------------------ generation
    def _prefill(self, core, prompt, n, taps=()):
        """`core`'s causal pass over the first `n` tokens of `prompt` [P] at positions 0..n-1, filling its cache there:
        (the hidden states, the tapped features)."""
        rows = torch.arange(n, device=self.device)
        mask = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        return core.body(prompt[None, :n], rows[None], rows, mask[None], n, taps)

    def _begin(self, prompt, tapped=None) -> None:
        """Reset the state to `prompt` [P] (P >= 2): the target's cache holds positions 0..P-2 (P-1 is fed by the
        first round), the draft's 0..P-3, the head's entries 0..P-2 and its output for the last one. `tapped`: the
        target's features from its prefill when that pass has run already (`_first_token`'s)."""
        P, device = prompt.shape[0], self.device
        self.tokens.zero_()
        self.tokens[:P] = prompt
        self.L.fill_(P)
        # (cuDNN's attention plans each new shape anew, ~50 ms on an H100: every prompt's length is new)
        with attention_backends(device):
            if tapped is None:
                _, tapped = self._prefill(self.target, prompt, P - 1, self.taps)
            if self.draft is not None and P > 2:
                self._prefill(self.draft, prompt, P - 2)
            if self.drafter is not None:
                self.context[:P - 1] = self.drafter.fuse(torch.cat(tapped, -1)[0])
            if self.head is not None:
                rows = torch.arange(P - 1, device=device)
                h, logits = self._head_step(torch.cat(tapped, -1)[0], prompt[1:P], rows, own=False)
                self.h0.copy_(h[-1:])
                self.logits0.copy_(logits[-1:])

    def _first_token(self, prompt, generator) -> tuple[torch.Tensor, tuple]:
        """A one-token prompt [1]: a round needs the newest committed token and, before it, the state of every earlier
        position (a draft re-reads the last two tokens; a head or a block drafter drafts from the target's features
        before the newest token), so the target's pass over the prompt token, the prefill `_begin` would run for a
        two-token prompt, picks the token after it, as a round picks its last token: the argmax, or drawn from the
        warped distribution with one uniform from `generator` (as the engine's first round of an EAGLE head, which
        drafts nothing, draws it). Returns (the prompt and that token [2], the pass's tapped features for `_begin`)."""
        with attention_backends(self.device):
            x, tapped = self._prefill(self.target, prompt, 1, self.taps)
            choice = self._choice(self.target.logits(x[:, -1]))  # [1], or the warped distribution [1, V]
        if self.sampled:
            choice = draw(choice, torch.rand(1, generator=generator, dtype=torch.float64).to(self.device))
        return torch.cat([prompt, choice.view(1)]), tapped

    @torch.no_grad()
    @_compiling
    def prepare(self) -> None:
        """Record (and compile) the round now, on a dummy prompt, so that no timed generation pays for it (on the
        CPU, a compiled round is run once: it compiles for these buffers and this gamma)."""
        if not self.graphs:
            if self.compiled and getattr(self, "_warm", None) != (self.capacity, self.gamma):
                if 8 + self.gamma + self.span + 2 > self.capacity:
                    self._allocate(8 + self.gamma + self.span + 2)
                self._begin(torch.zeros(8, dtype=torch.long, device=self.device))
                self.round_fn()
                self._warm = (self.capacity, self.gamma)
            return
        if self.graph is not None:
            return
        warmups = 3 if self.compiled else 1
        needed = 8 + warmups * (self.gamma + 1) + self.span + 1  # the warm-up rounds advance L from 8, unreset
        if needed > self.capacity:
            self._allocate(needed)
        self._begin(torch.zeros(8, dtype=torch.long, device=self.device))
        with attention_backends(self.device):
            self.graph, _ = self.recorded.record(self.round_fn, warmups=warmups)
        self.recorded["round"] = self.graph

    @torch.no_grad()
    @_compiling
    def generate(self, input_ids, max_new_tokens: int, eos_token_id=None,
                 generator: torch.Generator | None = None) -> GenerationResult:
        """Decode one prompt (`input_ids` [1, P] or [P], P >= 1), greedy or sampled as the loop was built: stops
        after `max_new_tokens` tokens or after an EOS token, like `generate`, whose argument rules it shares
        (`checks.py`). A sampled loop draws its uniforms from `generator` (a CPU `torch.Generator`; None: torch's
        global one). A one-token prompt: the target's pass over it makes the first token (`_first_token`)."""
        if generator is not None and not (isinstance(generator, torch.Generator) and generator.device.type == "cpu"):
            raise ValueError(f"generator must be a torch.Generator on the CPU (the draws are made there and copied in) "
                             f"or None, got {generator!r}")
        ids = torch.as_tensor(input_ids)
        if ids.dim() == 2 and ids.shape[0] != 1:
            raise ValueError(f"the device loop decodes one prompt at a time: input_ids has batch {ids.shape[0]}")
        check_prompt_ids(ids)
        check_count("max_new_tokens", max_new_tokens)
        max_new_tokens = int(max_new_tokens)
        ids = ids.reshape(-1).to(self.device, torch.long)
        eos = as_id_set(eos_token_id)
        needed = ids.shape[0] + max_new_tokens + self.span + 1
        if needed > self.capacity:
            self._allocate(max(needed, 2 * self.capacity))
        self.prepare()
        start = time.perf_counter()
        generator = torch.default_generator if generator is None else generator
        new, rounds = [], []  # rounds: (drafts accepted, tokens the budget left before the round)
        first = ids.shape[0] == 1
        if first:
            ids, tapped = self._first_token(ids, generator)
            append_until_eos(new, ids[1:].tolist(), eos)
            self._begin(ids, tapped)
        else:
            self._begin(ids)
        while not finished(new, max_new_tokens, eos):
            if self.sampled:  # this round's draws, written into the buffer the round reads
                state = generator.get_state() if self.DRAWS_VARY else None  # (to give back the draws not used)
                self.uniforms.copy_(torch.rand(self.uniforms.shape, generator=generator, dtype=torch.float64))
            if self.graph is not None:
                self.graph.replay()
                out = self.out.tolist()  # the round's only read-back
            else:
                out = self.round_fn().tolist()
            n, used, held = out[0], out[-2], out[-1]
            if not held:
                raise RuntimeError(self.BROKEN)
            if self.sampled and self.DRAWS_VARY and used < self.uniforms.shape[0]:  # as many draws on as were used
                generator.set_state(state)
                torch.rand(used, generator=generator, dtype=torch.float64)
            rounds.append((n, max_new_tokens - len(new)))
            append_until_eos(new, out[1:n + 2], eos)
        return self._result(new[:max_new_tokens], rounds, first, time.perf_counter() - start)

    BROKEN = "a check of the device round failed"  # (what a round's `held` = 0 means; a tree says more)

    def _result(self, new: list[int], rounds: list[tuple[int, int]], first: bool, wall_s: float) -> GenerationResult:
        """The engine's result type, counted as `GenerationResult` says. `rounds`: each round's (drafts accepted,
        tokens the budget left before it). One `RoundStats` per round, and one before them for a one-token prompt's
        first pass (`_first_token`: it made the first token and drafted nothing); target passes = rounds + the
        prefill's. Every round drafts `gamma` tokens (a tree: its `nodes`) in `gamma` draft passes (a block drafter:
        one), and `drafted` and `draft_calls` count them all, in the budget's last round too (the engine drafts only
        what fits there); but, as on the engine, a round's `accepted` counts only the drafts it kept before its last
        token (the target's own, after them), and its stop reason is "budget" where fewer than gamma + 1 tokens were
        left (a tree's is "tree", as the engine's tree reports, and "budget" where one token was left). Times per part
        are not measured inside a replayed round (0)."""
        g, tree = self.gamma, isinstance(self, DeviceTreeLoop)
        drafted = self.nodes if tree else g  # a tree verifies its nodes; a chain its gamma drafts
        passes = 1 if self.drafter is not None else g  # a block: one drafter pass a round
        full = "tree" if tree else "gamma" if g else "no draft"
        stats = [RoundStats(g, 0, 0, "no draft", 0, 1, 0.0, 0.0, 0.0)] if first else []
        made, accepted = len(stats), []
        for n, left in rounds:
            kept = min(n + 1, len(new) - made)  # (fewer than n + 1: the budget or an EOS ended the output)
            made += kept
            accepted.append(min(n, left - 1))  # a draft past the budget's last token is not kept: not counted
            stop = full if left > g else "budget" if left == 1 or not tree else full
            stats.append(RoundStats(g, drafted, accepted[-1], stop, passes, kept, 0.0, 0.0, 0.0))
        per_position = [sum(n > i for n in accepted) for i in range(g)]
        return GenerationResult(new, target_calls=len(rounds) + 1, draft_calls=passes * len(rounds),
                                drafted=drafted * len(rounds), accepted=sum(accepted),
                                accepted_per_position=per_position, wall_s=wall_s, rounds=stats, method=self.method)

    @torch.no_grad()
    def _parts(self) -> dict:
        """The parts `anatomy` times on their own: the drafting, and the target's pass over gamma + 1 rows."""
        rows = 7 + self.offsets[:self.gamma + 1]
        ids = torch.zeros(self.gamma + 1, dtype=torch.long, device=self.device)
        parts = {"verify": lambda: self.steps["verify"](ids, rows)}
        if self.gamma:
            parts["draft"] = lambda: self._draft(self.L)
        return parts

    @torch.no_grad()
    @_compiling
    def anatomy(self, repeats: int = 200, parts: bool = True) -> dict:
        """GPU milliseconds of one round and of its parts, each replayed `repeats` times back to back (CUDA events
        around all the replays): the round (the generation's own graph), its drafting and the target's pass (a graph
        each: `_parts`; `parts=False`: the round alone, which with compile="round" spares compiling each part
        again). Before every replay a one-element fill resets L (a dummy prompt of 8 tokens): its kernel is inside
        the timing. The caches are left dirty (the next `generate` resets them)."""
        if not self.graphs:
            raise ValueError("anatomy() times CUDA graphs: it needs graphs=True on a CUDA GPU")
        self.prepare()
        prompt = torch.zeros(8, dtype=torch.long, device=self.device)
        self._begin(prompt)
        graphs = {"round": self.graph}
        with attention_backends(self.device):
            timed = GraphCache()  # the parts' graphs, in a pool of their own
            for name, step in (self._parts() if parts else {}).items():
                if self.compile_mode == "round" and name == "draft":  # fused as it is inside the compiled round
                    step = torch.compile(step, dynamic=False, fullgraph=True)
                graphs[name], _ = timed.record(step, warmups=3 if self.compiled else 1)
        out = {}
        for name, graph in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.L.fill_(8)
            graph.replay()  # warm
            torch.cuda.synchronize()
            start.record()
            for _ in range(repeats):
                self.L.fill_(8)
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            out[f"{name}_ms"] = start.elapsed_time(end) / repeats
        return out


class DeviceTreeLoop(DeviceLoop):
    """EAGLE-2's dynamic tree with the whole round on the device, greedy or sampled, in fixed shapes, so that one
    CUDA graph replays it (the static form of the tree that SGLang records):

    grow    from the head's output for the newest committed entry, the `topk` best tokens are depth 1; then for
            each depth d < `depth`, the `topk` frontier nodes are fed to the head in one step (each attends to the
            committed entries, its ancestors and itself), each proposes its `topk` best children, and the `topk`
            children with the highest path log-probability (over all the frontier's) become the next frontier
    rerank  the `nodes` candidates of highest path log-probability, over every depth, are the tree (a child never
            outranks its parent: it adds a log-probability <= 0, and a tie goes to the earlier candidate, the parent)
    verify  one target pass over the newest committed token (the root, slot L-1) and the nodes (slots L..L+nodes-1,
            positions L-1+depth), each seeing the committed prefix, its ancestors and itself
    accept  greedy: a node is right when its token is the target's argmax at its parent; the deepest node whose
            ancestors are all right gives n, the target's argmax there the token after them (siblings hold distinct
            tokens, so at most one child of a node can be right: the accepted path is unique). Sampled: SpecInfer's
            walk over the target's warped rows (`sampling.accept_tree_sampled`; the head's children are chosen, not
            drawn: one-hot q), nodes + 1 uniforms handed to the round, the number it used read back
    commit  the path's tokens into `tokens`, their keys and values copied to slots L..L+depth-1 (one gather per
            buffer), the head's entries for the path computed from the path's target features, L += n + 1

    Every shape is fixed by (depth, topk, nodes): the frontier is always `topk` wide, the pool of candidates
    topk + (depth - 1) * topk^2, the verified rows nodes + 1."""

    def __init__(self, target, head, depth: int = 6, topk: int = 4, nodes: int = 24, capacity: int = 512,
                 graphs: bool | None = None, compile: bool = False, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, attention: str = "sdpa"):
        for name, value in (("depth", depth), ("topk", topk), ("nodes", nodes)):
            check_count(name, value)
        depth, topk, nodes = int(depth), int(topk), int(nodes)
        if head is None:
            raise ValueError("the device tree is EAGLE's: give an EAGLE head")
        pool = topk + (depth - 1) * topk * topk
        if nodes > pool:
            raise ValueError(f"nodes must be at most the candidates a tree of depth {depth} and topk {topk} grows "
                             f"(topk + (depth - 1) * topk^2 = {pool}), got {nodes}")
        if topk > head.draft_vocab:
            raise ValueError(f"topk must be at most the head's vocabulary ({head.draft_vocab}), got {topk}")
        self.topk, self.nodes, self.pool = topk, nodes, pool
        self.scratch = (depth - 1) * topk  # the frontier entries of depths 1..depth-1, past the positions
        super().__init__(target, head=head, gamma=depth, capacity=capacity, graphs=graphs, compile=compile,
                         temperature=temperature, top_k=top_k, top_p=top_p, attention=attention)
        self.method = "eagle"
        self.steps["verify_tree"] = self._verify_tree
        if self.compiled:
            self.steps["verify_tree"] = torch.compile(self._verify_tree, dynamic=False)

    @property
    def span(self) -> int:
        return max(self.gamma, self.nodes) + 1

    def set_gamma(self, gamma: int) -> None:
        raise ValueError("a device tree's shape is fixed by (depth, topk, nodes): build a new DeviceTreeLoop")

    DRAWS_VARY = True
    BROKEN = ("the device tree's selection is not ancestor-closed: a selected node's parent was not selected, so the "
              "round could not verify it at its parent's row (a child must never outrank its parent)")

    def _draws(self) -> int:
        return self.nodes + 1  # one per node the walk may try, one for the token after

    def _verify_tree(self, ids, positions, slots, mask):
        """The target's pass over a tree: `ids` [n] at `positions` [n], written at `slots` [n], attending where `mask`
        allows (`_target_pass`: [n, capacity], or with attention="triton" the rows' [n, n] block): (its `_choice` at
        every row: the argmax [n] or the warped distribution [n, V]; the EAGLE features [n, F])."""
        x, tapped = self._target_pass(ids, positions, slots, mask)
        return self._choice(self.target.logits(x)[0]), torch.cat(tapped, -1)[0]

    def _grow(self, L):
        """The candidate pool: (draft-vocabulary tokens [pool], path log-probabilities [pool], parents [pool]: a
        pool index or -1, depths [pool])."""
        D, K, C, device = self.gamma, self.topk, self.capacity, self.device
        rows_k = torch.arange(K, device=device)
        score, token = top_k_rows(torch.log_softmax(self.logits0[0].float(), -1), K)
        tokens, scores = [token], [score]
        parents, depths = [torch.full((K,), -1, device=device)], [torch.ones(K, dtype=torch.long, device=device)]
        front, front_score, h = rows_k, score, self.h0.expand(K, -1)
        ancestors = torch.zeros(K, self.scratch, dtype=torch.bool, device=device)  # frontier entries on the path
        committed = self.head_cols[None] <= L - 2  # the head's committed entries (positions 0 .. L-2)
        for d in range(1, D):
            slots = C + (d - 1) * K + rows_k
            mask = committed | torch.cat([torch.zeros(K, C, dtype=torch.bool, device=device), ancestors], -1)
            mask = mask | (self.head_cols[None] == slots[:, None])
            h_next, logits = self.steps["head"](h, self._to_full(token), (L - 2 + d).expand(K), own=True, slots=slots,
                                                mask=mask)
            child_score, child = top_k_rows(torch.log_softmax(logits.float(), -1), K)  # [K, K]
            paths = (front_score[:, None] + child_score).flatten()
            base = K + (d - 1) * K * K
            tokens.append(child.flatten())
            scores.append(paths)
            parents.append(front.repeat_interleave(K))
            depths.append(torch.full((K * K,), d + 1, dtype=torch.long, device=device))
            if d + 1 < D:  # the next frontier: the K best children
                front_score, best = top_k_rows(paths, K)
                row = best // K
                front, token, h = base + best, child.flatten()[best], h_next[row]
                ancestors = ancestors[row].scatter_(1, ((d - 1) * K + row)[:, None], True)
        return torch.cat(tokens), torch.cat(scores), torch.cat(parents), torch.cat(depths)

    def _round(self):
        D, N, L, device = self.gamma, self.nodes, self.L, self.device
        token_p, score_p, parent_p, depth_p = self._grow(L)
        P = self.pool
        # ancestors-or-self in the pool (pointer doubling over the parent matrix)
        # (a scatter into a column per parent, the roots' -1 into a column then dropped: no boolean indexing, whose
        # data-dependent shape a CUDA graph cannot record)
        parent_of = torch.zeros(P, P + 1, device=device).scatter_(1, (parent_p + 1)[:, None], 1.0)[:, 1:]
        anc = torch.eye(P, device=device) + parent_of
        for _ in range(max(1, (D - 1).bit_length())):
            anc = ((anc + anc @ anc) > 0).float()
        # the tree: the N best, ties to the earlier candidate (a parent comes before its children in the pool and a
        # child's score is at most its parent's, so the tree is ancestor-closed; a NaN counts as the worst score)
        sel = torch.sort(torch.nan_to_num(score_p, nan=-float("inf")), descending=True, stable=True).indices[:N]
        anc_sel = anc[sel][:, sel] > 0  # [N, N]: k is j's ancestor or j itself
        depth = depth_p[sel]
        nodes = self._to_full(token_p[sel])
        # the target's pass: the root at slot L-1, node j at slot L + j and position L - 1 + depth
        ids = torch.cat([self.tokens.index_select(0, L - 1), nodes])
        positions = torch.cat([L - 1, L - 1 + depth])
        slots = L - 1 + self.node_offsets
        # the rows' block [N + 1, N + 1]: the root sees itself; node j the root, its ancestors and itself
        mask = tree_allowed(anc_sel, 1, 1)
        if self.attention != "triton":  # over the whole buffer: the prefix before the root, then the block at `slots`
            mask = (self.cols[None] < L - 1).expand(N + 1, -1).clone().index_copy_(1, slots, mask)
        choice, features = self.steps["verify_tree"](ids, positions, slots, mask)
        # accept: the engine's tree walk (`sampling`), each node verified at its parent's row (the argmax finds the
        # parent among the selected nodes; `held` says every non-root parent was there, read back with the round's
        # result: a selection that is not ancestor-closed is an error, not a node verified at node 0's row)
        is_parent = sel[None] == parent_p[sel][:, None]  # [N, N]: node k is node j's parent
        parent_row = torch.where(parent_p[sel] < 0, 0, 1 + is_parent.float().argmax(-1))
        held = (is_parent.any(-1) | (parent_p[sel] < 0)).all()
        used = None
        if self.sampled:  # SpecInfer's walk; the deepest kept node ends the path (any node when none is kept)
            kept, tried, bonus = accept_tree_sampled(nodes, parent_row, None, choice, self.uniforms)
            n, deepest, used = kept.long().sum(), torch.where(kept, depth, 0).argmax(), tried + 1
        else:
            n, deepest, bonus = accept_tree_greedy(nodes, parent_row, anc_sel, depth, choice)
        # the path: the ancestor (or self) of the deepest right node at each depth 1..D (past n: any node, unused)
        on_path = anc_sel.index_select(0, deepest.view(1)) & (depth[None] == self.offsets[1:D + 1, None])
        path = on_path.float().argmax(-1)  # [D]
        self.tokens.index_copy_(0, L + self.offsets[:D], nodes[path])
        self.tokens.index_copy_(0, L + n, bonus)
        for buffer in (self.target.keys, self.target.values):  # the path's keys and values to slots L .. L+D-1
            move_path(buffer, 3, L, path)
        rows = L - 1 + self.offsets[:D + 1]  # the root and the path's nodes, now at positions L - 1 .. L + D - 1
        return self._finish(L, n, rows, features.index_select(0, torch.cat([self.offsets[:1], 1 + path])), used,
                            held)

    def _allocate(self, capacity: int) -> None:
        super()._allocate(capacity)
        self.node_offsets = torch.arange(self.nodes + 1, device=self.device)

    def _parts(self) -> dict:
        """The tree's growth, and the target's pass over nodes + 1 rows (a chain's mask: the cost is the same)."""
        rows = 7 + self.node_offsets
        ids = torch.zeros(self.nodes + 1, dtype=torch.long, device=self.device)
        mask = self.causal[:self.nodes + 1, :self.nodes + 1] if self.attention == "triton" else \
            self.cols[None] <= rows[:, None]
        return {"verify": lambda: self.steps["verify_tree"](ids, rows, rows, mask), "draft": lambda: self._grow(self.L)}


class DeviceExecutor:
    """`generate`'s recorded executor: `generate(target, ids, n, method=..., executor=DeviceExecutor())` runs the
    method's rounds on the device (`DeviceLoop`, `DeviceTreeLoop`: a round recorded as one CUDA graph on a GPU, op by
    op elsewhere) instead of the engine's host loop, with the same acceptance and sampling functions and the same
    result type. Methods whose rounds have one fixed shape run here: `ar`, `draft` (and its names `greedy`,
    `sampling`), `eagle-chain`, `eagle` (no pruning) and `block`; the others (a policy that stops mid-round, a
    hierarchy, Medusa, a draft's tree) are refused in one line. The executor keeps one loop per (method, models,
    shape, sampling settings), so a second call replays what the first recorded; `graphs`, `compile`, `attention`
    and `capacity` are `DeviceLoop`'s options."""

    METHODS = ("ar", "draft", "eagle-chain", "eagle", "block")

    def __init__(self, graphs: bool | None = None, compile: bool | str = False, attention: str = "sdpa",
                 capacity: int = 512):
        self.options = {"graphs": graphs, "compile": compile, "attention": attention, "capacity": capacity}
        self.loops: dict = {}

    def run(self, method: str, name: str, target, draft, head, policy, input_ids, max_new_tokens: int,
            sampler: Sampler, eos_ids: set, generator) -> GenerationResult:
        """Called by `generate` (`method`: the registered name, `name`: the one asked for) with its checked
        arguments, the method's models and its policy."""
        from .block import BlockPolicy  # (the method families; they do not import this module)
        from .eagle import EagleChainPolicy, EaglePolicy
        from .policies import DraftingPolicy
        fixed = {"ar": DraftingPolicy, "draft": DraftingPolicy, "eagle-chain": EagleChainPolicy, "eagle": EaglePolicy,
                 "block": BlockPolicy}
        if method not in self.METHODS or type(policy) is not fixed[method]:
            raise ValueError(f"the device executor runs rounds of one fixed shape: methods {', '.join(self.METHODS)} "
                             f"with their own policy; {name!r} runs on the engine (leave out executor=...)")
        options = dict(self.options)
        if method == "block":
            from .block import BlockDrafter
            if not isinstance(draft, BlockDrafter):
                raise ValueError(f"method 'block' needs draft=... a block drafter (core.block), got "
                                 f"{type(draft).__name__}")
        if method == "eagle":
            if policy.prune != "none":
                raise ValueError("the device executor runs EAGLE's tree unpruned (prune='none'; its shape is fixed); "
                                 "a pruned tree runs on the engine")
            key = (method, target, head, policy.gamma, policy.width, policy.tree_nodes, sampler)
            make = lambda: DeviceTreeLoop(target, head, depth=policy.gamma, topk=policy.width,  # noqa: E731
                                          nodes=policy.tree_nodes, temperature=sampler.temperature,
                                          top_k=sampler.top_k, top_p=sampler.top_p, **options)
        else:
            gamma = 0 if method == "ar" else policy.gamma
            models = {"draft": draft if method == "draft" else None, "head": head if method == "eagle-chain" else None,
                      "drafter": draft if method == "block" else None}
            key = (method, target, models["draft"], models["head"], models["drafter"], gamma, sampler)
            make = lambda: DeviceLoop(target, gamma=gamma, temperature=sampler.temperature,  # noqa: E731
                                      top_k=sampler.top_k, top_p=sampler.top_p, **models, **options)
        loop = self.loops.get(key)
        if loop is None:
            loop = self.loops[key] = make()
        result = loop.generate(input_ids, max_new_tokens, eos_token_id=eos_ids, generator=generator)
        result.method = name
        return result
