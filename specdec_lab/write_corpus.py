"""Write a large corpus of target-written text, fast: the training text of the course's drafts.

A draft learns to predict its target on the text it is trained on. With a corpus grown from the
course's 756 training prompts, the drafts' agreement with the target on held-out prompts stayed far
below their agreement on their training text: the starts were too narrow. This tool writes tens of
millions of tokens from varied starts, each batch of one kind:

* chat: the target writes a user question itself (sampled at T=1, top-p 0.95, from the chat
  template's user turn), then answers it; rows whose question did not end within 64 tokens are
  filled with the course's training prompts (raw, or through the chat template);
* train: the course's training prompts, each followed by 0-24 tokens sampled at T=1;
* opening: 1-24 tokens sampled at T=1 after BOS or the first words of a document, then continued;
* code / docs: windows of the Python standard library's source, and of English prose: the
  language reference shipped with Python (`pydoc_data.topics`), the standard library's docstrings
  and, where present, text files under /usr/share/doc.

Continuations are greedy (what greedy speculative decoding must match) or, for `--sampled-fraction`
of the batches, sampled at temperature 0.7 or 1. Rows whose start contains an evaluation prompt
are dropped (and counted), so evaluation stays held out.

Speed: `train_draft.generate_corpus` uses transformers' `generate` (about 35k tokens/s on an H100).
Here a small pure-torch Llama decoder keeps a static KV cache, records a decode step once as a CUDA
graph and replays it (the recipe of gpt-fast, PyTorch's "Accelerating Generative AI" series): one
launch per generated token for the whole batch, sampling included, and no host sync until the batch
ends. Attention reads the cache only up to the current slot, rounded up to 64 slots (one graph per
such window and sampler).

    python -m specdec_lab.write_corpus --tokens 50000000 --out corpus.pt --device cuda \\
        --batch 2048 --new-tokens 256 --seed 0 --time-budget-s 540       # 50M tokens, one H100
    torchrun --nproc_per_node 4 -m specdec_lab.write_corpus --tokens 200000000 --out corpus.pt \
        --batch 2048 --new-tokens 256 --seed 0 --time-budget-s 540       # four GPUs: each writes a quarter
    python -m specdec_lab.write_corpus --tokens 2000 --out /tmp/corpus.pt --device cpu \\
        --batch 8 --new-tokens 32                                        # a CPU smoke run

`load_corpus(path)` reads the result, or an old list-of-dicts corpus of train_draft, as a
`TokenCorpus`. A JSON log (command, device, speed, rows per kind) is written next to `--out`.
"""
from __future__ import annotations

import argparse
import ast
import json
import platform
import random
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec_utils.core.graphs import GraphCache
from specdec_utils.core.plain_llama import PlainLlama
from specdec_utils.core.runner import attention_backends
from specdec_utils.core.sampling import draw, warp_logits
from specdec_utils.models import load_model
from specdec_utils.prompts import build_prompts, format_prompt
from specdec_utils.utils import command_line, default_dtype, get_device

from . import distributed

COPY_SEED_STRIDE = 1000  # under torchrun, copy r writes from seed + 1000 r (the copies' rows differ)
BATCH_KINDS = {"chat": 0.4, "train": 0.1, "opening": 0.15, "code": 0.2, "docs": 0.15}  # share of batches
KINDS, MODES = tuple(BATCH_KINDS), ("greedy", "sampled")
QUESTION_TOKENS, TOP_P, WINDOW = 64, 0.95, 64
QUESTION_SEEDS = ("", "", "", "How", "What", "Why", "Can you", "Write", "Explain", "I")


def choose_tokens(logits, temperature, opening, kind: str, top_p: float = TOP_P):
    """Each row's next token from `logits` [B, V], through the package's sampler (`core.sampling`): rows are warped
    by `warp_logits` and drawn by `draw` (inverse CDF of one uniform per row, drawn on the device: no host sync,
    so a CUDA graph can record it). kind "greedy": argmax (`warp_logits`' temperature 0). "sample": rows with
    `temperature` > 0 sample at it, the others take the argmax. "nucleus": as "sample", but rows with `opening`
    set sample at T=1 from the top-p nucleus (Holtzman et al. 2020)."""
    greedy = logits.argmax(-1)
    if kind == "greedy":
        return greedy
    temperature = torch.where(opening, 1.0, temperature)
    sample = temperature > 0
    # one temperature per row, where warp_logits takes one for all: divide first, then warp at T=1
    scaled = logits.float() / torch.where(sample, temperature, 1.0)[:, None]
    probs = warp_logits(scaled)
    if kind == "nucleus":
        probs = torch.where(opening[:, None], warp_logits(scaled, top_p=top_p), probs)
    uniforms = torch.rand(probs.shape[0], dtype=torch.float64, device=probs.device)
    return torch.where(sample, draw(probs, uniforms), greedy)


class StaticDecoder:
    """Batched generation with a Llama model's weights (RMSNorm, rotary positions, grouped-query
    attention, SwiGLU MLP, as transformers' `LlamaForCausalLM` computes them), in plain torch so that
    a decode step has fixed shapes and addresses and can be recorded as a CUDA graph.

    The cache holds keys and values [layers, batch, kv_heads, max_len, head_dim]. Starts are
    left-padded to the longest, P tokens: row b's pads fill slots 0..pads[b]-1, its tokens sit at
    rotary position slot - pads[b], and a query at slot t sees the keys at slots pads[b]..t.
    Generated tokens go to slots P, P+1, ... of every row.
    """

    def __init__(self, model, batch: int, max_len: int, graphs: bool = True):
        self.core = core = PlainLlama(model, batch, max_len)  # the weights, the cache and the layers' arithmetic
        self.device, self.dtype, self.batch, self.max_len = core.device, core.dtype, batch, max_len
        self.heads, self.kv_heads, self.head_dim = core.heads, core.kv_heads, core.head_dim
        long = dict(dtype=torch.long, device=self.device)
        self.seq = torch.zeros(batch, max_len, **long)  # starts, then generated tokens
        self.pads = torch.zeros(batch, **long)
        self.temperature = torch.zeros(batch, device=self.device)  # 0: greedy
        self.opening_end = torch.zeros(batch, **long)  # tokens at slots below it are sampled openings
        self.slot = torch.zeros(1, **long)  # the slot of the token the next decode step reads
        self.graphs = GraphCache() if graphs and self.device.type == "cuda" else None  # one pool for all its graphs

    def forward(self, ids, slots, window: int):
        """Feed `ids` [batch, T] at cache slots `slots` [T] (a device tensor), writing their keys and
        values there and attending over slots 0..window-1; return the last position's logits."""
        positions = (slots[None] - self.pads[:, None]).clamp_min(0)
        keys = torch.arange(window, device=ids.device)
        mask = ((keys >= self.pads[:, None, None]) & (keys <= slots[:, None])) | (keys == slots[:, None])
        # a pad query sees itself only (finite, never seen by real rows)
        x, _ = self.core.body(ids, positions, slots, mask, window)
        return self.core.logits(x[:, -1])

    def prefill(self, starts: list[list[int]]) -> tuple[torch.Tensor, int]:
        """Left-pad `starts` (`batch` rows) to the longest, P tokens, write them at slots 0..P-1 and
        return (logits [batch, vocab] of each row's last token, P)."""
        P = max(map(len, starts))
        if len(starts) != self.batch or min(map(len, starts)) < 1 or P > self.max_len:
            raise ValueError(f"need {self.batch} starts of 1..{self.max_len} tokens")
        self.seq[:, :P] = torch.tensor([[0] * (P - len(s)) + s for s in starts])
        self.pads.copy_(torch.tensor([P - len(s) for s in starts]))
        return self.forward(self.seq[:, :P], torch.arange(P, device=self.device), P), P

    @torch.no_grad()
    def generate(self, starts, steps: int, temperature=0.0, opening=0):
        """Continue up to `batch` starts by `steps` tokens each. `temperature` (one per row, or one for
        all; 0 = greedy); `opening` (idem): that many first tokens are sampled at T=1, top-p 0.95,
        whatever the temperature. Returns (tokens [rows, P + steps]: left-padded starts, then the
        generated tokens; pads [rows]), on the CPU. Rows go on after EOS; callers cut them."""
        n = len(starts)
        temperature = temperature if isinstance(temperature, list) else [temperature] * n
        opening = opening if isinstance(opening, list) else [opening] * n
        if not 0 < n <= self.batch or max(map(len, starts)) + steps > self.max_len:
            raise ValueError(f"need 1..{self.batch} starts and start + steps <= {self.max_len} tokens")
        fill = self.batch - n  # missing rows repeat the first, and are discarded
        self.temperature.copy_(torch.tensor(temperature + temperature[:1] * fill))
        with attention_backends(self.device):  # on CUDA, not cuDNN's: it would plan again for every new P
            logits, P = self.prefill(starts + starts[:1] * fill)
            self.opening_end.copy_(P + torch.tensor(opening + opening[:1] * fill))
            last_opening, sampled = P + max(opening), max(temperature) > 0

            def kind(slot):  # the sampler the token at `slot` needs (the host knows: no sync)
                return "nucleus" if slot < last_opening else "sample" if sampled else "greedy"
            self.seq[:, P] = choose_tokens(logits, self.temperature, P < self.opening_end, kind(P))
            self.slot.fill_(P)
            for slot in range(P, P + steps - 1):
                self._decode(kind(slot + 1), min(self.max_len, -(-(slot + 1) // WINDOW) * WINDOW), slot)
        return self.seq[:n, :P + steps].cpu(), self.pads[:n].cpu()

    def _step(self, kind: str, window: int):
        """Read the token at `self.slot`, write the next one after it, advance `self.slot`."""
        following = self.slot + 1
        logits = self.forward(self.seq.index_select(1, self.slot), self.slot, window)
        token = choose_tokens(logits, self.temperature, following < self.opening_end, kind)
        self.seq.index_copy_(1, following, token[:, None])
        self.slot.add_(1)

    def _decode(self, kind: str, window: int, slot: int):
        """`_step`, on CUDA through a graph recorded once per (sampler, window) and shared by all batches, by the
        package's recorder (`GraphCache.record`: one warm-up on a side stream, then the capture, into the cache's one
        memory pool: the graphs never run at once, and keep no output: each step writes into the decoder's own
        tensors). The warm-up advanced `self.slot` (the capture ran nothing): it is reset to `slot` before replaying."""
        if self.graphs is None:
            return self._step(kind, window)
        graph = self.graphs.get((kind, window))
        if graph is None:
            graph, _ = self.graphs.record(lambda: self._step(kind, window))
            self.graphs[kind, window] = graph
            self.slot.fill_(slot)
        graph.replay()


# ----------------------------------------------------------------------------- starts
def _share_doc_texts(limit: int = 400) -> list[str]:
    """Plain-text files under /usr/share/doc (READMEs and the like), where the machine has them."""
    out = []
    for path in sorted(Path("/usr/share/doc").glob("*/*")):
        if len(out) >= limit:
            break
        if path.suffix not in ("", ".txt", ".md", ".rst") or path.name == "copyright":
            continue
        try:
            if path.is_file() and 1000 < path.stat().st_size < 200_000:
                out.append(path.read_text())
        except (OSError, UnicodeDecodeError):
            continue
    return out


class Starts:
    """The starts (token ids) of each batch: see the module docstring for the kinds."""

    def __init__(self, tokenizer, rng: random.Random):
        from pydoc_data.topics import topics
        self.tok, self.rng, self.train = tokenizer, rng, build_prompts("train")
        files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
        self.code = [t for t in (f.read_text(errors="ignore") for f in files) if len(t) >= 200]
        docstrings = []
        for source in self.code:
            try:
                nodes = ast.walk(ast.parse(source))
            except SyntaxError:
                continue
            docstrings += [ast.get_docstring(node) or "" for node in nodes if isinstance(
                node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        self.docs = [t for t in [*topics.values(), *docstrings, *_share_doc_texts()] if len(t) >= 200]

    def make(self, kind: str, n: int, decoder: StaticDecoder) -> tuple[list[list[int]], list[str], list[int]]:
        """(starts, kind of each row, sampled opening tokens of each row) for a batch of `kind`."""
        if kind == "chat":
            return self.chat(n, decoder)
        if kind == "train":
            return self.train_prompts(n)
        if kind == "opening":
            docs = self.tok.batch_decode(self.windows(self.docs, n))
            words = [" ".join(t.split()[:self.rng.randint(1, 3)]) for t in docs]
            texts = [self.tok.bos_token if self.rng.random() < 0.3 and self.tok.bos_token else w for w in words]
            # at least one sampled token: from a bare BOS, greedy decoding would write the same text every time
            return self._ids(texts), [kind] * n, [self.rng.randint(1, 24) for _ in range(n)]
        return self.windows(self.code if kind == "code" else self.docs, n), [kind] * n, [0] * n

    def _ids(self, texts):
        return [ids or [self.tok.eos_token_id] for ids in self.tok(texts, add_special_tokens=False).input_ids]

    def windows(self, pool: list[str], n: int, shortest: int = 16, longest: int = 96) -> list[list[int]]:
        """`n` windows of 16..96 tokens at random places of `pool`'s texts (drawn by length)."""
        pieces = []
        for text in self.rng.choices(pool, weights=[len(t) for t in pool], k=n):
            at = self.rng.randrange(max(1, len(text) - 6 * longest))
            pieces.append(text[at:at + 6 * longest])
        # the first token may be a cut word: skip it
        return [ids[1:1 + self.rng.randint(shortest, longest)] or ids for ids in self._ids(pieces)]

    def train_prompts(self, n: int):
        rows = [dict(self.rng.choice(self.train)) for _ in range(n)]
        for row in rows:
            row["chat"] = row["chat"] or self.rng.random() < 0.2
        return (self._ids([format_prompt(self.tok, r) for r in rows]), ["train"] * n,
                [self.rng.randint(0, 24) for _ in range(n)])

    def chat(self, n: int, decoder: StaticDecoder):
        """The target writes a user question after the chat template's user-turn opening (plus a
        seed word, or none); the question, cut at its end of turn, then goes through the template."""
        if not getattr(self.tok, "chat_template", None):
            return self.train_prompts(n)
        marker = "@@QUESTION@@"
        head = self.tok.apply_chat_template([{"role": "user", "content": marker}], tokenize=False).split(marker)[0]
        seeds = [self.rng.choice(QUESTION_SEEDS) for _ in range(n)]
        starts = self._ids([head + s for s in seeds])
        steps = min(QUESTION_TOKENS, decoder.max_len - max(map(len, starts)))
        written = decoder.generate(starts, steps, opening=steps)[0][:, -steps:].tolist()
        eos, fill = self.tok.eos_token_id, self.train_prompts(n)
        ended = [eos in q and q.index(eos) >= 2 for q in written]
        questions = self.tok.batch_decode([q[:q.index(eos)] for q, e in zip(written, ended) if e])
        texts = [format_prompt(self.tok, {"prompt": (seed + q).strip(), "chat": True})
                 for seed, q in zip([s for s, e in zip(seeds, ended) if e], questions)]
        asked = iter(self._ids(texts) if texts else [])
        return ([next(asked) if e else ids for e, ids in zip(ended, fill[0])],
                ["chat" if e else kind for e, kind in zip(ended, fill[1])],
                [0 if e else o for e, o in zip(ended, fill[2])])


# ----------------------------------------------------------------------------- corpus
def write_batch(decoder: StaticDecoder, tokenizer, starts, kinds, opening, temperature, steps: int,
                eval_prompts: list[str]) -> dict:
    """Generate from `starts` and keep each row as start + continuation, cut after the first EOS of
    the continuation (kept). Sampled opening tokens count as start. Dropped: rows with an EOS in the
    opening, with fewer than 2 continuation tokens, or whose start contains an evaluation prompt."""
    seq, pads = decoder.generate(starts, steps, temperature, opening)
    width = seq.shape[1]
    cols, P = torch.arange(width), width - steps
    cont_from = P + torch.tensor(opening)
    is_eos = seq == tokenizer.eos_token_id
    after = cols[None] >= cont_from[:, None]
    end = torch.where(is_eos & after, cols + 1, width).min(1).values
    prompt_len, lengths = cont_from - pads, end - pads
    texts = tokenizer.batch_decode([row[p:p + n].tolist() for row, p, n in zip(seq, pads, prompt_len)])
    leaked = torch.tensor([any(e in t for e in eval_prompts) for t in texts])
    keep = ~leaked & (end - cont_from >= 2) & ~(is_eos & (cols[None] >= P) & ~after).any(1)
    rows = seq.gather(1, (cols[None] + pads[:, None]).clamp(max=width - 1))
    rows[cols[None] >= lengths[:, None]] = -1
    return {"tokens": rows[keep].int(), "lengths": lengths[keep].int(), "prompt_len": prompt_len[keep].int(),
            "kind": torch.tensor([KINDS.index(k) for k in kinds], dtype=torch.int8)[keep],
            "mode": (torch.tensor(temperature) > 0).to(torch.int8)[keep], "dropped_for_eval": int(leaked.sum())}


class TokenCorpus:
    """A target-written corpus as tensors: `tokens` int32 [N, L] (start + continuation, right-padded
    with -1), `lengths`, `prompt_len` int32 [N], `kind`/`mode` int8 codes into `kind_names`/`mode_names`.
    Behaves like train_draft's list of dicts: `len(c)`, `c[i]` -> {"ids", "prompt_len", "kind", "mode"}."""

    def __init__(self, tokens, lengths, prompt_len, kind, mode, kind_names=KINDS, mode_names=MODES, meta=None):
        self.tokens, self.lengths, self.prompt_len, self.kind, self.mode = tokens, lengths, prompt_len, kind, mode
        self.kind_names, self.mode_names, self.meta = list(kind_names), list(mode_names), dict(meta or {})

    @classmethod
    def from_rows(cls, rows: list[dict], meta=None) -> TokenCorpus:
        """Wrap an old corpus (a list of dicts {"ids", "prompt_len", "kind", "mode"})."""
        kinds = sorted({r.get("kind", "") for r in rows})
        tokens = torch.full((len(rows), max((len(r["ids"]) for r in rows), default=0)), -1, dtype=torch.int32)
        for i, r in enumerate(rows):
            tokens[i, :len(r["ids"])] = torch.tensor(r["ids"], dtype=torch.int32)
        kind = torch.tensor([kinds.index(r.get("kind", "")) for r in rows], dtype=torch.int8)
        mode = torch.tensor([MODES.index(r.get("mode", "greedy")) for r in rows], dtype=torch.int8)
        return cls(tokens, torch.tensor([len(r["ids"]) for r in rows], dtype=torch.int32),
                   torch.tensor([r["prompt_len"] for r in rows], dtype=torch.int32), kind, mode, kinds, MODES, meta)

    @classmethod
    def join(cls, parts: list, meta=None) -> TokenCorpus:
        """One corpus of the rows of `parts` (dicts of the TokenCorpus fields, or corpora), in order, padded to the
        widest with -1."""
        get = lambda p, key: p[key] if isinstance(p, dict) else getattr(p, key)  # noqa: E731
        width = max(get(p, "tokens").shape[1] for p in parts)
        cat = lambda key: torch.cat([get(p, key) for p in parts])  # noqa: E731
        tokens = torch.cat([F.pad(get(p, "tokens"), (0, width - get(p, "tokens").shape[1]), value=-1) for p in parts])
        return cls(tokens, cat("lengths"), cat("prompt_len"), cat("kind"), cat("mode"), meta=meta)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict:
        return {"ids": self.tokens[i, :self.lengths[i]].tolist(), "prompt_len": int(self.prompt_len[i]),
                "kind": self.kind_names[self.kind[i]], "mode": self.mode_names[self.mode[i]]}

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def continuation_tokens(self) -> torch.Tensor:
        """All continuation tokens, row after row, as one 1-D tensor."""
        cols = torch.arange(self.tokens.shape[1])
        return self.tokens[(cols >= self.prompt_len[:, None]) & (cols < self.lengths[:, None])]

    def batch(self, idx, max_len: int | None, device) -> tuple[torch.Tensor, torch.Tensor]:
        """As train_draft.batch: (ids, mask) long [len(idx), longest], rows cut to `max_len`, 0-padded."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        lengths = self.lengths[idx].long().clamp(max=max_len or self.tokens.shape[1])
        longest = int(lengths.max())
        mask = torch.arange(longest)[None] < lengths[:, None]
        return (self.tokens[idx, :longest].long() * mask).to(device), mask.long().to(device)

    def save(self, path) -> None:
        torch.save({"tokens": self.tokens, "lengths": self.lengths, "prompt_len": self.prompt_len,
                    "kind": self.kind, "kind_names": self.kind_names, "mode": self.mode,
                    "mode_names": self.mode_names, "meta": self.meta}, path)


def load_corpus(path) -> TokenCorpus:
    """A corpus written by this tool, or an old list-of-dicts corpus of train_draft."""
    data = torch.load(path)
    return TokenCorpus.from_rows(data) if isinstance(data, list) else TokenCorpus(**data)


def mix_problem(mix: dict) -> str | None:
    """What is wrong with a batch mix {kind: share}, or None."""
    if set(mix) - set(KINDS) or not sum(mix.values()) > 0 or min(mix.values()) < 0:
        return f"shares >= 0 (not all 0) of the kinds {', '.join(KINDS)}; got {mix}"
    return None


@torch.no_grad()
def write_corpus(model, tokenizer, tokens: int, batch: int, new_tokens: int, seed: int = 0,
                 sampled_fraction: float = 0.3, time_budget_s: float = float("inf"), graphs: bool = True,
                 max_start: int = 128, mix: dict | None = None) -> TokenCorpus:
    """Batches until `tokens` continuation tokens are kept or the next batch would pass the budget.
    `mix`: the share of batches of each kind (default `BATCH_KINDS`)."""
    mix = dict(BATCH_KINDS if mix is None else mix)
    if mix_problem(mix):
        raise ValueError(f"mix: {mix_problem(mix)}")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    decoder = StaticDecoder(model, batch, -(-(max_start + new_tokens) // WINDOW) * WINDOW, graphs)
    starts, eval_prompts = Starts(tokenizer, rng), [r["prompt"] for r in build_prompts("eval")]
    parts, written, dropped, started, last = [], 0, 0, time.time(), 0.0
    spent = {"starts": 0.0, "generate": 0.0}  # where the time goes: making starts (chat questions included), the rest
    while written < tokens and time.time() - started + last < time_budget_s:
        t0 = time.time()
        kind = rng.choices(KINDS, weights=[mix.get(k, 0) for k in KINDS])[0]
        ids, kinds, opening = starts.make(kind, batch, decoder)
        spent["starts"] += time.time() - t0
        opening = [min(n, new_tokens // 2) for n in opening]  # short runs: leave room for a continuation
        temperature = [rng.choice((0.7, 1.0)) for _ in ids] if rng.random() < sampled_fraction else [0.0] * len(ids)
        part = write_batch(decoder, tokenizer, [s[-max_start:] for s in ids], kinds, opening, temperature,
                           new_tokens, eval_prompts)
        parts.append(part)
        written += int((part["lengths"] - part["prompt_len"]).sum())
        dropped += part["dropped_for_eval"]
        last, elapsed = time.time() - t0, time.time() - started
        spent["generate"] = elapsed - spent["starts"]
        print(f"{elapsed:7.1f}s  {written:,} tokens written, {written / elapsed:,.0f} tokens/s "
              f"({kind}, {MODES[temperature[0] > 0]}; {last:.2f}s; starts {spent['starts']:.0f}s, "
              f"continuations {spent['generate']:.0f}s so far)", flush=True)
    return TokenCorpus.join(parts, meta={"dropped_for_eval": dropped, "continuation_tokens": written, "seed": seed,
                                         "graphs": decoder.graphs is not None, "max_len": decoder.max_len,
                                         "mix": mix, "seconds_per_phase": {k: round(v, 1) for k, v in spent.items()}})


def join_copies(corpus: TokenCorpus, out: Path) -> TokenCorpus | None:
    """Under torchrun: every copy saves the rows it wrote next to `out`; the first copy joins them in rank order
    (the counts summed, the copies' seeds listed) and deletes the parts; the others get None."""
    world, rank = distributed.world_size(), distributed.rank()
    part = out.with_name(f"{out.stem}.part{rank}.pt")
    out.parent.mkdir(parents=True, exist_ok=True)
    corpus.save(part)
    distributed.barrier()
    if rank:
        return None
    paths = [out.with_name(f"{out.stem}.part{r}.pt") for r in range(world)]
    parts = [load_corpus(p) for p in paths]
    meta = dict(parts[0].meta, copies=world, seed=[p.meta["seed"] for p in parts],
                dropped_for_eval=sum(p.meta["dropped_for_eval"] for p in parts),
                continuation_tokens=sum(p.meta["continuation_tokens"] for p in parts))
    joined = TokenCorpus.join(parts, meta=meta)
    for p in paths:
        p.unlink()
    return joined


# ----------------------------------------------------------------------------- CLI
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=50_000_000, help="stop after this many continuation tokens")
    ap.add_argument("--out", type=Path, default=Path("corpus.pt"))
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--device", default=None, help="default: cuda, then mps, then cpu")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="auto: bfloat16 on accelerators, float32 on the CPU")
    ap.add_argument("--batch", type=int, default=1024, help="rows generated together")
    ap.add_argument("--new-tokens", type=int, default=256,
                    help="generated tokens per row (sampled openings included), before the EOS cut")
    ap.add_argument("--max-start", type=int, default=128, help="longer starts keep their last tokens")
    ap.add_argument("--sampled-fraction", type=float, default=0.3, help="share of sampled (not greedy) batches")
    ap.add_argument("--time-budget-s", type=float, default=float("inf"), help="stop before passing it")
    ap.add_argument("--mix", default=",".join(f"{k}={v}" for k, v in BATCH_KINDS.items()),
                    help="share of batches of each kind, e.g. train=0.5,chat=0.3,opening=0.2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-graphs", action="store_true", help="on CUDA, run decode steps eagerly")
    args = ap.parse_args(argv)
    for arg in ("tokens", "batch", "max_start"):
        if getattr(args, arg) < 1:
            ap.error(f"--{arg.replace('_', '-')} must be >= 1, got {getattr(args, arg)}")
    if args.new_tokens < 2:
        ap.error(f"--new-tokens must be >= 2 (rows keep at least 2 continuation tokens), got {args.new_tokens}")
    if not 0 <= args.sampled_fraction <= 1:
        ap.error(f"--sampled-fraction must be in [0, 1], got {args.sampled_fraction}")
    try:
        args.mix = {k.strip(): float(v) for k, v in (item.split("=") for item in args.mix.split(","))}
    except ValueError:
        ap.error(f"--mix: comma-separated kind=share pairs, kinds from {', '.join(KINDS)}; got {args.mix!r}")
    if mix_problem(args.mix):
        ap.error(f"--mix: {mix_problem(args.mix)}")
    if not args.time_budget_s > 0:
        ap.error(f"--time-budget-s must be > 0, got {args.time_budget_s}")
    if args.device and args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available here")
    return args


def main(argv=None):
    args = parse_args(argv)
    command = command_line("specdec_lab.write_corpus", argv)
    copy_device = distributed.setup()  # under torchrun: this copy's GPU; each copy writes its share, seeded apart
    world, rank = distributed.world_size(), distributed.rank()
    if copy_device is not None:
        args.device = str(copy_device)
        command = command_line("specdec_lab.write_corpus", argv, world)
    device = torch.device(args.device) if args.device else get_device()
    dtype = default_dtype(device) if args.dtype == "auto" else getattr(torch, args.dtype)
    model, tokenizer = load_model(args.target, device=device, dtype=dtype)
    started = time.time()
    corpus = write_corpus(model, tokenizer, -(-args.tokens // world), args.batch, args.new_tokens,
                          args.seed + COPY_SEED_STRIDE * rank, args.sampled_fraction, args.time_budget_s,
                          not args.no_graphs, args.max_start, args.mix)
    if world > 1:
        corpus = join_copies(corpus, args.out)
        if corpus is None:
            distributed.finish()
            return 0
    seconds = time.time() - started
    written = corpus.meta["continuation_tokens"]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or device.type
    log = {"command": command, "device": name, "copies": world,
           "dtype": str(dtype).replace("torch.", ""), "target": args.target, "batch": args.batch,
           "new_tokens": args.new_tokens, "rows": len(corpus), "continuation_tokens": written,
           "all_tokens": corpus.num_tokens, "seconds": round(seconds, 1), "tokens_per_s": round(written / seconds),
           "rows_per_kind": {k: int((corpus.kind == i).sum()) for i, k in enumerate(corpus.kind_names)},
           "modes": {m: int((corpus.mode == i).sum()) for i, m in enumerate(corpus.mode_names)},
           **{k: corpus.meta[k] for k in ("dropped_for_eval", "graphs", "max_len", "seed", "mix", "seconds_per_phase")}}
    corpus.meta.update(log)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    corpus.save(args.out)
    args.out.with_suffix(".json").write_text(json.dumps(log, indent=1))
    print(f"wrote {args.out}: {len(corpus):,} rows, {written:,} continuation tokens in {seconds:.0f}s "
          f"({log['tokens_per_s']:,} tokens/s); {log['dropped_for_eval']} rows dropped for containing "
          f"an evaluation prompt", flush=True)
    distributed.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
