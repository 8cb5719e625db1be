"""Fixtures and helpers shared by the test modules."""
import json
from pathlib import Path

import pytest
import torch

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
TEACHING_MARKER = "# teaching implementation"


@pytest.fixture(scope="module")
def single_thread():
    """Tiny models are dominated by per-op overhead; one thread is fastest and steadiest.
    Modules opt in with `pytestmark = pytest.mark.usefixtures("single_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def teaching_namespace(notebook_name: str, namespace: dict, min_cells: int = 1) -> dict:
    """Execute the code cells of a notebook that start with `# teaching implementation` (and nothing
    else) in `namespace`, which supplies the names those cells use, and return it."""
    path = NOTEBOOKS / notebook_name
    cells = json.loads(path.read_text())["cells"]
    teaching = ["".join(cell["source"]) for cell in cells
                if cell["cell_type"] == "code" and "".join(cell["source"]).startswith(TEACHING_MARKER)]
    assert len(teaching) >= min_cells, (
        f"expected at least {min_cells} code cell(s) of {path.name} starting with {TEACHING_MARKER!r}, "
        f"found {len(teaching)}")
    for source in teaching:
        exec(compile(source, str(path), "exec"), namespace)
    return namespace
