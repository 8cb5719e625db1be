"""The course's text against its outputs: numbers in prose are cited or constant, never typed
measurements; every notebook opens with its stamp; committed CPU outputs share one CPU kind; a full run
fits the course's time; no internal words."""
import datetime
import json
import re
from pathlib import Path

import pytest
from prose_check import CONSTANTS, code_comments, quoted_numbers, scan, units

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MAX_QUOTED = 150          # quoted numbers (decimal point, %, x, thousands) in the whole course's markdown
FULL_RUN_MINUTES = 10     # a full run of one notebook on the course CPU
LESSON_WORDS = 4500       # what a learner reads in one lesson (markdown and rendered text): about 45 minutes
COURSE_WORDS = 50000      # the whole course


def load(path):
    return json.loads(path.read_text())


def outputs_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        for kind, value in out.get("data", {}).items():
            if kind.startswith("text/"):
                parts.append("".join(value))
    return "\n".join(parts)


# --------------------------------------------------------------------------- the scanner itself
def test_scanner_finds_numbers_wherever_they_hide():
    text = ("speedup 1.43x; `1.2` in code; $\\tau = 2.43$ in math; <!-- 3.5 ms --> in a comment; 12% waste; "
            "28,806 sequences; 4x faster; 3 layers and gamma 4 are plain integers")
    assert [n for n, _ in quoted_numbers(text)] == ["1.43x", "1.2", "2.43", "3.5", "12%", "28,806", "4x"]


def test_scanner_skips_references_versions_and_urls():
    text = ("Table 2, Section 3.4 and Eq. 1.5 of the paper (https://arxiv.org/abs/2211.17192), "
            "torch 2.13 and transformers 5.23, arXiv:2302.01318")
    assert list(quoted_numbers(text)) == []


def test_citation_covers_its_sentence_or_table_only():
    cell = ("EAGLE-2 reaches 4.34 <cite>Spec-Bench, Table 1</cite>. Ours reached 2.43 here.\n\n"
            "From the paper <cite>Leviathan et al. 2023, Table 2</cite>:\n\n"
            "| model | speedup |\n|---|---|\n| T5 | 3.4x |")
    cited = {n: c for text, c in units(cell) for n, _ in quoted_numbers(text)}
    assert cited == {"4.34": True, "2.43": False, "3.4x": True}


def test_code_comments_are_prose_too(tmp_path):
    nb = {"cells": [{"cell_type": "code", "source": ["x = 1.5  # parameter, not prose\n", "# we measured 1.43x here\n"],
                     "metadata": {}, "outputs": []},
                    {"cell_type": "markdown", "source": ["Vocabulary of 49,152 tokens; tau 2.43."], "metadata": {}}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    assert code_comments("".join(nb["cells"][0]["source"])).strip().endswith("we measured 1.43x here")
    status = {(f["where"], f["number"]): f["status"] for f in scan(path)}
    assert status == {("code comment", "1.43x"): "unsourced", ("markdown", "49,152"): "constant",
                      ("markdown", "2.43"): "unsourced"}


def test_every_constant_says_why():
    assert all(isinstance(why, str) and len(why) > 10 for why in CONSTANTS.values())


# --------------------------------------------------------------------------- the course
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_unsourced_number_in_prose(path):
    bad = [f for f in scan(path) if f["status"] == "unsourced"]
    assert not bad, (f"{path.name}: {len(bad)} numbers typed into prose (render them from the measurement, or cite "
                     "the source in <cite>...</cite>): "
                     + "; ".join(f"cell {f['cell']}: {f['number']}" for f in bad[:12]))


def test_course_quotes_few_numbers():
    total = sum(1 for path in NOTEBOOKS for f in scan(path) if f["where"] == "markdown")
    assert total <= MAX_QUOTED, f"the course's markdown quotes {total} numbers (at most {MAX_QUOTED})"


STAMP = re.compile(r"run stamp\s+(\d{4}-\d\d-\d\d \d\d:\d\d), commit (\S+).*?CPU kind: ([^(\n]+?) \(.*?mode\s+(\w+)",
                   re.DOTALL)


def stamp_of(nb):
    first = next((c for c in nb["cells"] if c["cell_type"] == "code" and c.get("outputs")), None)
    match = STAMP.search(outputs_text(first)) if first else None
    return match.groups() if match else None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_first_output_is_the_stamp(path):
    nb = load(path)
    assert stamp_of(nb), f"{path.name}: the first output must be report.stamp()'s (date, commit, CPU kind, mode)"
    assert stamp_of(nb)[3] == "full", f"{path.name}: committed outputs must come from a full run, not quick mode"


def test_committed_cpu_outputs_share_one_cpu_kind():
    kinds = {path.name: stamp_of(load(path))[2] for path in NOTEBOOKS if stamp_of(load(path))}
    assert len(set(kinds.values())) == 1, f"committed notebooks come from different CPU kinds: {kinds}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_full_run_fits_the_course_time(path):
    times = [c["metadata"]["execution"] for c in load(path)["cells"]
             if c["cell_type"] == "code" and "execution" in c.get("metadata", {})]
    assert times, f"{path.name}: no execution times recorded (execute it with nbconvert)"

    def at(stamp):
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    minutes = (at(times[-1]["shell.execute_reply"]) - at(times[0]["iopub.execute_input"])).total_seconds() / 60
    assert minutes <= FULL_RUN_MINUTES, f"{path.name}: the committed full run took {minutes:.1f} min"


def rendered_text(cell) -> str:
    """What a learner sees of a code cell's outputs: printed text, and of each displayed object one rendering
    (its markdown, else its plain text; a figure's plain text is its repr, not read)."""
    parts = []
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if "text" in out:
            parts.append("".join(out["text"]))
        elif "text/markdown" in data:
            parts.append("".join(data["text/markdown"]))
        elif "text/plain" in data and "image/png" not in data:
            parts.append("".join(data["text/plain"]))
    return "\n".join(parts)


def words_read(nb) -> int:
    """Words a learner reads: markdown cells and the text the code cells render (tables, sentences, prints)."""
    return sum(len("".join(c["source"]).split()) if c["cell_type"] == "markdown" else len(rendered_text(c).split())
               for c in nb["cells"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_lesson_is_short_enough_to_finish(path):
    words = words_read(load(path))
    assert words <= LESSON_WORDS, (f"{path.name}: a learner reads {words:,} words (at most {LESSON_WORDS:,}); move "
                                   "boards, tunings and profiles to its lab notebook in notebooks/lab/")


def test_the_course_is_short_enough_to_finish():
    words = {path.stem: words_read(load(path)) for path in NOTEBOOKS}
    assert sum(words.values()) <= COURSE_WORDS, f"the course asks {sum(words.values()):,} words: {words}"


VERDICTS = re.compile(r"(?-i:\bMISSED\b)|\bgoals?\b|\b(?:is|are|was|not) met\b|\bset itself\b|\blease[sd]?\b",
                      re.IGNORECASE)


@pytest.mark.parametrize("path", [*NOTEBOOKS, *sorted((ROOT / "notebooks" / "lab").glob("*.ipynb")),
                                  ROOT / "README.md", ROOT / "notebooks" / "lab" / "README.md"], ids=lambda p: p.name)
def test_the_course_never_grades_itself(path):
    """Targets are the team's: a learner reads what was measured, against `ar` and cited results, never a verdict
    against a goal the course set itself."""
    if path.suffix == ".ipynb":
        nb = load(path)
        text = "\n".join("".join(c["source"]) + "\n" + outputs_text(c) for c in nb["cells"])
    else:
        text = path.read_text()
    found = sorted(set(m.group(0) for m in VERDICTS.finditer(text)))
    assert not found, f"{path.name} grades the course against its own targets or uses lab words: {found}"


INTERNAL = re.compile(r"\bseed \d{3}\b|\bthe issue\b|\bGorgon\b|shared/GPU\.md|\.\./shared|\bissue \d+\b",
                      re.IGNORECASE)


@pytest.mark.parametrize("path", [*NOTEBOOKS, ROOT / "README.md",
                                  *sorted((ROOT / "notebooks" / "solutions").glob("*.py"))], ids=lambda p: p.name)
def test_no_internal_words(path):
    text = path.read_text()
    if path.suffix == ".ipynb":
        text = "\n".join("".join(c["source"]) for c in load(path)["cells"])
    found = sorted(set(m.group(0) for m in INTERNAL.finditer(text)))
    assert not found, f"{path.name} uses words a learner cannot look up: {found}"


@pytest.mark.parametrize("path", [*NOTEBOOKS, *sorted((ROOT / "notebooks" / "lab").glob("*.ipynb"))],
                         ids=lambda p: p.name)
def test_test_plumbing_is_invisible(path):
    """nbval's markers live in the cells' metadata tags (`nbval-ignore-output`), not in what a learner reads."""
    found = [i for i, c in enumerate(load(path)["cells"]) if "NBVAL" in "".join(c["source"])]
    assert not found, f"{path.name}: cells {found} show nbval's markers; put them in the cell's tags instead"
