"""Every notebook opens with the same setup cell: it imports the installed package, falls back to the
repository on the path, and in Colab without a repository URL stops with one line saying what to set."""
import json
import sys
import types
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def first_code_cell(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return next("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")


def test_every_notebook_has_the_same_setup_cell():
    cells = {path.name: first_code_cell(path) for path in NOTEBOOKS}
    assert len(cells) >= 5 and len(set(cells.values())) == 1, sorted(cells)
    assert 'REPO_URL = ""' in next(iter(cells.values()))


def test_setup_cell_outside_colab_makes_the_package_importable():
    namespace = {}
    exec(first_code_cell(NOTEBOOKS[0]), namespace)
    import specdec_utils  # noqa: F401


def test_setup_cell_in_colab_without_a_url_says_what_to_set(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    with pytest.raises(SystemExit, match="set REPO_URL at the top of this cell"):
        exec(first_code_cell(NOTEBOOKS[0]), {})
