"""A zero-cost draft: next-token counts from the live text (prompt lookup) and from a table of
n-grams counted on text the target wrote (notebook 05's bottom level).

`NgramDraft` answers "what usually comes next?" by looking up the last tokens, longest context
first, and at each length the live text before the corpus: the last 3 tokens in the live text
(prompt lookup decoding, Saxena 2023: copy what followed the same tokens earlier in the prompt or
the output), then in a table counted on target-written text (a 4-gram model), then the last 2
tokens, live text then table (a trigram model; Cascade Speculative Drafting puts a bigram at its bottom level,
arXiv 2312.11462). The answer is a distribution: the counts of the tokens that followed, as logits
(log count; -inf for every other token), so the engine samples from it, measures its entropy and
verifies it exactly like a model's. No match anywhere: `None`, and the level stops drafting.

It costs a dictionary lookup and a short scan of the context (tens of microseconds), no forward
pass. It is built by `python -m specdec_lab.train_draft --names ngram` from the same kind of
target-written corpus as the drafts, and saved as `data/models/ngram/table.safetensors` (shipped lzma-packed as
`table.safetensors.xz`, read through `models.unpacked`).
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

ORDERS = (3, 2)  # tokens of context: a 4-gram table, then a trigram table
TABLE_FILE = "table.safetensors"
LOG_FILE = "training_log.json"


class NgramDraft(nn.Module):
    """Next-token counts for a context: the live text first, then the corpus table.

    `tables[n]` maps an n-token context (a tuple of ids, n in `ORDERS`) to (next ids, counts),
    at most `top` of them, most frequent first. `lookup` says where each answer came from
    (`last_source`), for the notebook's plots. As the bottom level of `hierarchical` it is asked
    through `next_logits`; it also has a causal LM's `forward`, so that any method can use it as
    its draft (where nothing matches, its logits are flat: a token it cannot predict)."""

    def __init__(self, tables: dict[int, dict[tuple, tuple[list[int], list[int]]]], vocab_size: int,
                 use_context: bool = True, use_table: bool = True):
        super().__init__()
        self.tables, self.vocab_size = tables, vocab_size
        self.use_context, self.use_table = use_context, use_table
        self.last_source = None
        self.config = SimpleNamespace(vocab_size=vocab_size)

    # ------------------------------------------------------------------ building, saving, loading
    @classmethod
    def build(cls, sequences: list[tuple[list[int], int]], vocab_size: int, top: int = 4,
              min_count: int = 2) -> NgramDraft:
        """Count, for every position of the target-written part of each sequence (ids, prompt_len),
        the token that followed each 3- and 2-token context. Contexts seen fewer than `min_count`
        times are dropped (a single sighting predicts little and costs memory); `top` next tokens
        are kept per context."""
        counts = {n: defaultdict(Counter) for n in ORDERS}
        for ids, prompt_len in sequences:
            for j in range(max(prompt_len, 1), len(ids)):
                for n in ORDERS:
                    if j >= n:
                        counts[n][tuple(ids[j - n:j])][ids[j]] += 1
        tables = {}
        for n in ORDERS:
            table = {}
            for context, counter in counts[n].items():
                if sum(counter.values()) >= min_count:
                    best = counter.most_common(top)
                    table[context] = ([t for t, _ in best], [c for _, c in best])
            tables[n] = table
        return cls(tables, vocab_size)

    def save(self, folder: Path, log: dict | None = None) -> None:
        from safetensors.torch import save_file
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        top = max((len(nexts) for table in self.tables.values() for nexts, _ in table.values()), default=1)
        tensors = {}
        for n, table in self.tables.items():
            contexts = torch.tensor(list(table), dtype=torch.int32).reshape(len(table), n)
            nexts = torch.full((len(table), top), -1, dtype=torch.int32)
            counts = torch.zeros((len(table), top), dtype=torch.int32)
            for row, (ids, cs) in enumerate(table.values()):
                nexts[row, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
                counts[row, :len(cs)] = torch.tensor(cs, dtype=torch.int32)
            tensors.update({f"contexts_{n}": contexts, f"next_{n}": nexts, f"counts_{n}": counts})
        save_file(tensors, str(folder / TABLE_FILE), metadata={"vocab_size": str(self.vocab_size)})
        if log is not None:
            (folder / LOG_FILE).write_text(json.dumps(log, indent=1))

    @classmethod
    def load(cls, folder: Path) -> NgramDraft:
        """The table saved by `save` in `folder`. A packed folder (the shipped one) is read through
        `models.unpacked(folder)`, as `load_model("ngram")` does (models imports this module, not the reverse)."""
        from safetensors import safe_open
        path = Path(folder) / TABLE_FILE
        if not path.exists():
            if path.with_name(path.name + ".xz").exists():  # models.PACKED
                raise FileNotFoundError(f"the n-gram table at {path} is packed: load it with "
                                        "specdec_utils.models.load_model('ngram') or NgramDraft.load(models.unpacked("
                                        "folder))")
            raise FileNotFoundError(f"no n-gram table at {path}: build it with "
                                    "`python -m specdec_lab.train_draft --names ngram` (see README)")
        tables = {}
        with safe_open(str(path), framework="pt") as f:
            vocab_size = int(f.metadata()["vocab_size"])
            for n in ORDERS:
                contexts = f.get_tensor(f"contexts_{n}").tolist()
                nexts, counts = f.get_tensor(f"next_{n}").tolist(), f.get_tensor(f"counts_{n}").tolist()
                tables[n] = {tuple(c): ([t for t in ids if t >= 0], [k for k, t in zip(cs, ids) if t >= 0])
                             for c, ids, cs in zip(contexts, nexts, counts)}
        return cls(tables, vocab_size)

    @property
    def size(self) -> dict[int, int]:
        """Contexts held per order."""
        return {n: len(table) for n, table in self.tables.items()}

    # ------------------------------------------------------------------ drafting
    def lookup(self, ids: list[int]) -> tuple[list[int], list[int]] | None:
        """(next ids, counts) for the end of `ids`, longest context first; None if nothing matches."""
        for n in ORDERS:
            if len(ids) < n:
                continue
            if self.use_context and len(ids) > n:
                found = _context_counts(ids, n)
                if found:
                    self.last_source = f"context-{n}"
                    return found
            if self.use_table and tuple(ids[-n:]) in self.tables.get(n, {}):
                self.last_source = f"table-{n}"
                return self.tables[n][tuple(ids[-n:])]
        self.last_source = None
        return None

    def next_logits(self, ids: list[int]) -> torch.Tensor | None:
        """Logits [vocab_size] (log count of each token that followed; -inf elsewhere), or None."""
        found = self.lookup(ids)
        if found is None:
            return None
        logits = torch.full((self.vocab_size,), -float("inf"))
        logits[torch.tensor(found[0])] = torch.tensor(found[1], dtype=torch.float32).log()
        return logits


    def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=1, **kwargs):
        """Logits [1, keep, V] for the last `logits_to_keep` positions (flat where nothing matches).
        The "cache" is a legacy tuple holding the ids seen so far, as `exactness.ToyLM` does."""
        seen = past_key_values[0][0][0, 0, :, 0].long().tolist() if past_key_values else []
        ids = seen + input_ids[0].tolist()
        keep = logits_to_keep or len(input_ids[0])
        rows = []
        for end in range(len(ids) - keep + 1, len(ids) + 1):
            logits = self.next_logits(ids[:end])
            rows.append(torch.zeros(self.vocab_size) if logits is None else logits)
        stored = torch.tensor(ids, dtype=torch.float32)[None, None, :, None]
        return SimpleNamespace(logits=torch.stack(rows)[None].to(input_ids.device), past_key_values=((stored, stored),))


def _context_counts(ids: list[int], n: int) -> tuple[list[int], list[int]] | None:
    """Prompt lookup: the tokens that followed earlier occurrences of the last `n` tokens of `ids`,
    with their counts, the most frequent first (ties: the most recent)."""
    suffix = ids[-n:]
    counter: Counter = Counter()
    last_seen = {}
    first = suffix[0]
    for j in range(len(ids) - n - 1, -1, -1):  # an occurrence at j..j+n-1 is followed by ids[j+n]
        if ids[j] == first and ids[j:j + n] == suffix:
            token = ids[j + n]
            counter[token] += 1
            last_seen.setdefault(token, -j)
    if not counter:
        return None
    ranked = sorted(counter, key=lambda t: (-counter[t], last_seen[t]))
    return ranked, [counter[t] for t in ranked]
