"""Numbers typed into the course's prose, and whether each one is allowed there.

A measured value (a time, a speedup, tau, an acceptance, a count that depends on the run) is printed by
the code that measured it, never typed. This scanner reads every markdown cell of a notebook in full
(math, inline code and HTML comments included: hiding a number there does not hide it) and the comments
of its code cells, and finds each *quoted number*: one with a decimal point, a percent sign, an "x"
(times) or a thousands separator. Each must be one of:

- a **citation**: the sentence, list item or table row that holds it names its source in
  `<cite>...</cite>` (a table is cited as a whole by a `<cite>` in the paragraph right above it);
- a **constant** listed in CONSTANTS below with the reason it cannot drift (vocabulary size, ...);
- a **reference** to a part of a paper or a version (Table 2, Section 3.4, Eq. 1, torch 2.13).

Plain integers (layer counts, gamma = 4, prompt counts) are not quoted numbers here.

    python tests/prose_check.py notebooks/*.ipynb        # list every quoted number and its status
"""
from __future__ import annotations

import io
import json
import re
import sys
import tokenize
from pathlib import Path

# value as written (thousands separators kept) -> why it is a constant of the course, not a measurement
CONSTANTS = {
    "49,152": "the target's vocabulary size (SmolLM2 tokenizer)",
    "8,192": "the drafts' reduced vocabulary (a design choice)",
    "8,193": "the drafts' reduced vocabulary plus the 'any other token' slot",
    "0.5": "a probability used as an illustration (one half)",
    # notebook 00
    # notebook 01
    "0.125": "bfloat16's spacing between neighbouring values at a logit of 16 (2^4 x 2^-7, an 8-bit mantissa)",
    "0.016": "float16's spacing between neighbouring values at a logit of 16 (2^4 x 2^-10 = 0.015625, rounded)",
    # notebook 02
    "40,960": "notebook 02: the target tokens outside the drafts' vocabulary, 49,152 - 8,192",
    "95%": "notebook 02: the level of the bootstrap intervals (report.bootstrap's default)",
    # notebook 03
    # (its "0.8" and "0.3", the dual-signal rule's acceptance thresholds, are listed under notebook 05)
    # notebook 04
    # notebook 05
    "0.3": "notebook 05: the cost c2 of the illustrative 7B-like middle on the right-hand map (a chosen parameter)",
    "0.8": ("notebook 05: the acceptance a2p of the illustrative 7B-like middle on the right-hand map "
            "(a chosen parameter)"),
    "10%": "notebook 05: exercise 3's asked-for gain over the M2 pair (a chosen target, 1.1x)",
    # notebook 06
    # notebook 07
    # notebook 08
    # notebook 09
    # notebook 10
}

NUMBER = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+\.\d+|\d+)(\s?%|\s?×|x\b|\s?\\times)?")
REFERENCE = re.compile(r"(?:\b(?:Table|Tables|Section|Sections|Sec\.|§|Eq\.|Eqs\.|Equation|Figure|Fig\.|Algorithm|"
                       r"Appendix|Theorem|Lemma|Definition|Chapter|arXiv:?|Python|torch|transformers|triton|"
                       r"Triton|PyTorch|CUDA|vLLM|SGLang|version|v)\s?)$", re.IGNORECASE)
URL = re.compile(r"\(?https?://[^\s)]+\)?")
CITE = re.compile(r"<cite>\s*\S.{1,}?</cite>", re.DOTALL)


def quoted_numbers(text: str):
    """Yield (number as written, start offset) for every quoted number in `text`, URLs skipped."""
    text = URL.sub(lambda m: " " * len(m.group(0)), text)
    for m in NUMBER.finditer(text):
        value, suffix = m.group(1), m.group(2)
        if not (suffix or "." in value or "," in value):
            continue
        if REFERENCE.search(text[max(0, m.start() - 16):m.start()]):
            continue
        yield value + (suffix.strip() if suffix else ""), m.start()


def units(markdown: str) -> list[tuple[str, bool]]:
    """Split a markdown cell into units (sentences, list items, table rows), each with whether it is cited."""
    out = []
    blocks = re.split(r"\n\s*\n", markdown)
    previous_cited = False
    for block in blocks:
        lines = block.split("\n")
        if all(line.strip().startswith("|") for line in lines if line.strip()) and block.strip():
            table_cited = previous_cited or bool(CITE.search(block))
            out += [(line, table_cited or bool(CITE.search(line))) for line in lines]
            previous_cited = False
            continue
        items = re.split(r"\n(?=\s*(?:[-*+]|\d+\.)\s)", block)
        for item in items:
            # sentences end at . ! ? followed by a space and a capital, a backtick, a $ or a bracket
            for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z(`$*\[])", item):
                out.append((sentence, bool(CITE.search(sentence))))
        previous_cited = bool(CITE.search(block))
    return out


def code_comments(source: str) -> str:
    """The comments of a code cell (what a learner reads as prose inside code)."""
    try:
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        return "\n".join(t.string for t in tokens if t.type == tokenize.COMMENT)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return "\n".join(line.split("#", 1)[1] for line in source.splitlines() if "#" in line)


def scan(path) -> list[dict]:
    """Every quoted number of a notebook: cell index, where (markdown/comment), the number, the unit of text,
    and its status ('cited', 'constant' or 'unsourced')."""
    nb = json.loads(Path(path).read_text())
    found = []
    for index, cell in enumerate(nb["cells"]):
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            pieces = [("markdown", text, cited) for text, cited in units(source)]
        elif cell["cell_type"] == "code":
            pieces = [("code comment", line, False) for line in code_comments(source).splitlines()]
        else:
            continue
        for where, text, cited in pieces:
            for number, _ in quoted_numbers(text):
                status = "constant" if number in CONSTANTS else "cited" if cited else "unsourced"
                found.append({"cell": index, "where": where, "number": number, "status": status,
                              "text": " ".join(text.split())[:160]})
    return found


def main(paths) -> int:
    total = unsourced = 0
    for path in paths:
        found = scan(path)
        bad = [f for f in found if f["status"] == "unsourced"]
        total += len(found)
        unsourced += len(bad)
        print(f"{path}: {len(found)} quoted numbers, {len(bad)} unsourced")
        for f in bad:
            print(f"   cell {f['cell']} ({f['where']}): {f['number']}  <- {f['text']}")
    print(f"total: {total} quoted numbers, {unsourced} unsourced")
    return 1 if unsourced else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
