"""Every notebook opens with the same setup cell: it imports the installed package, falls back to the
repository on the path, and in Colab without a repository URL stops with one line saying what to set.
The cell is executed here outside Colab both ways (installed, and a bare clone) and in Colab without a URL."""
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


def test_setup_cell_outside_colab_uses_the_installed_package(monkeypatch):
    """Installed (`pip install -e .`): the cell imports it and leaves sys.path alone."""
    import specdec_utils
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = list(sys.path)
    namespace = {}
    exec(first_code_cell(NOTEBOOKS[0]), namespace)
    assert namespace["specdec_utils"] is specdec_utils and sys.path == before


def test_setup_cell_outside_colab_without_the_install_puts_the_repository_on_the_path(monkeypatch):
    """A clone without the install, run from notebooks/: the cell puts the folder above (the repository,
    which holds specdec_utils/) first on sys.path, so that the next import finds the package there."""
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setitem(sys.modules, "specdec_utils", None)  # `import specdec_utils` now raises ImportError
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(NOTEBOOKS[0].parent)
    namespace = {}
    exec(first_code_cell(NOTEBOOKS[0]), namespace)
    repository = NOTEBOOKS[0].parent.parent
    assert sys.path[0] == str(repository) and (repository / "specdec_utils" / "__init__.py").is_file()
    assert "specdec_utils" not in namespace


def test_setup_cell_in_colab_without_a_url_says_what_to_set(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    with pytest.raises(SystemExit, match="set REPO_URL at the top of this cell"):
        exec(first_code_cell(NOTEBOOKS[0]), {})
