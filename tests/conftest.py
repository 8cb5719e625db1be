"""Fixtures and helpers shared by the test modules."""
import copy
import json
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # Triton's CPU interpreter for the kernel tests: chosen before Triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from transformers import PreTrainedModel  # noqa: E402 (after the interpreter switch)

from specdec_utils import models as zoo  # noqa: E402
from specdec_utils.models import tiny_model  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
TEACHING_MARKER = "# teaching implementation"
TINY_VOCAB = 256


# --- the real target loads only in tests marked `slow` ---------------------------------------------
# `make test-fast` (-m "not slow") promises to skip the real 135M target. Outside tests marked `slow`,
# transformers' `from_pretrained` refuses the target's weights (its safetensors cache, its GGUF, or
# the hub copy), whatever route a test takes (`load_model`, a fixture, a folder path), so a test that
# loads the target without the marker fails loudly instead of slowing the fast run.
# (`test_models.py::test_the_real_target_cannot_load_outside_slow_tests` checks the guard.)
# Subprocesses are not guarded: the tests that start one (bench, leaderboard, engine_bench, readme
# tables, tree attention) load no target, and the one that does is marked slow.
_original_from_pretrained = PreTrainedModel.__dict__["from_pretrained"].__func__
_target_allowed = True  # set per test by pytest_runtest_protocol below


class RealTargetOutsideSlowTest(pytest.fail.Exception):
    """A BaseException (like pytest.fail's), so that no `except Exception` in the code swallows it."""


def is_real_target(name, gguf_file=None) -> bool:
    """Whether `from_pretrained(name, gguf_file=...)` would load the 135M target's weights."""
    # the GGUF; the safetensors cache (a folder named after the target); the hub id SmolLM2-135M-Instruct
    return gguf_file == zoo.GGUF_FILE or zoo.TARGET_NAME in str(name).lower()


def _guarded_from_pretrained(cls, name, *args, **kwargs):
    if not _target_allowed and is_real_target(name, kwargs.get("gguf_file")):
        raise RealTargetOutsideSlowTest(
            f"this test loads the real target ({name}) but is not marked slow: add @pytest.mark.slow "
            "(`make test-fast` must not load it)", pytrace=False)
    return _original_from_pretrained(cls, name, *args, **kwargs)


def pytest_report_header(config):
    """The machine the tests ran on, at the top of every run's log (`make test-gpu` commits its log)."""
    import platform

    import transformers
    gpu = (f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s))"
           if torch.cuda.is_available() else "none")
    return [f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores; GPU: {gpu}",
            f"torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}"]


def pytest_configure(config):
    PreTrainedModel.from_pretrained = classmethod(_guarded_from_pretrained)


def pytest_unconfigure(config):
    PreTrainedModel.from_pretrained = classmethod(_original_from_pretrained)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The guard's switch, set for each test before its fixtures (module fixtures included) are built."""
    global _target_allowed
    _target_allowed = item.get_closest_marker("slow") is not None
    yield
    _target_allowed = True


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


def random_eagle_head(target, seed: int, **options):
    """An untrained EAGLE head for `target` (`options`: `eagle_head_for`'s) with its weights moved off their initial
    values (a head fresh from `eagle_head_for` drafts almost nothing a random target accepts)."""
    from specdec_utils.core import eagle
    head = eagle.eagle_head_for(target, seed=seed, **options)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
    return head.eval()


def random_prompt(length: int, seed: int, vocab: int = TINY_VOCAB) -> torch.Tensor:
    """[1, length] random token ids, avoiding the tiny models' special ids 0-2."""
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def tiny():
    """A tiny Llama target, another as its draft, and 3 Medusa heads with random (not zero) blocks:
    the token-tree tests' models (notebooks 06 and 08)."""
    from specdec_utils.core.medusa import MedusaHeads
    target = tiny_model("tiny-llama", vocab_size=64, seed=1).eval()
    draft = tiny_model("tiny-llama", vocab_size=64, seed=2).eval()
    heads = MedusaHeads(target, 3)
    with torch.no_grad():
        for block in heads.blocks:
            torch.nn.init.normal_(block.weight, std=0.3)
    return target, draft, heads
