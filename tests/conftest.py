"""Fixtures and helpers shared by the test modules."""
import copy
import json
from pathlib import Path

import pytest
import torch

from specdec_utils.models import tiny_model

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
TEACHING_MARKER = "# teaching implementation"
TINY_VOCAB = 256


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


def random_model(family: str, seed: int, vocab: int = TINY_VOCAB) -> torch.nn.Module:
    """A tiny random model with an untied random output head. (With the head tied to the
    embeddings, a random model mostly repeats its last token, which makes tests trivial.)"""
    model = tiny_model(family, vocab_size=vocab, seed=seed)
    hidden = model.get_input_embeddings().weight.shape[1]
    generator = torch.Generator().manual_seed(seed)
    model.lm_head.weight = torch.nn.Parameter(torch.randn(vocab, hidden, generator=generator) / 8)
    return model.eval()


def noisy_copy(model: torch.nn.Module, noise: float, seed: int) -> torch.nn.Module:
    """A draft that agrees with `model` often but not always: its head plus Gaussian noise."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head = draft.lm_head.weight
        draft.lm_head.weight = torch.nn.Parameter(head + noise * torch.randn(head.shape, generator=generator))
    return draft


def random_prompt(length: int, seed: int, vocab: int = TINY_VOCAB) -> torch.Tensor:
    """[1, length] random token ids, avoiding the tiny models' special ids 0-2."""
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def tiny():
    """A tiny Llama target, another as its draft, and 3 Medusa heads with random (not zero) blocks:
    the token-tree tests' models (notebooks 06 and 07)."""
    from specdec_utils.core.medusa import MedusaHeads
    target = tiny_model("tiny-llama", vocab_size=64, seed=1).eval()
    draft = tiny_model("tiny-llama", vocab_size=64, seed=2).eval()
    heads = MedusaHeads(target, 3)
    with torch.no_grad():
        for block in heads.blocks:
            torch.nn.init.normal_(block.weight, std=0.3)
    return target, draft, heads
