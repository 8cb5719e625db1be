"""Small helpers every notebook uses: device choice, seeding, timing, plotting, progress."""
from __future__ import annotations

import os
import random
import shlex
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch


def _repo_root() -> Path:
    """The course checkout whose data/ the package reads: $SPECDEC_REPO if set (a plain, non-editable install),
    else the folder above the package (an editable install, or a clone on Python's path)."""
    override = os.environ.get("SPECDEC_REPO")
    return Path(override).expanduser().resolve() if override else Path(__file__).resolve().parent.parent


REPO_ROOT = _repo_root()
DATA_DIR = REPO_ROOT / "data"
FIGURES_DIR = REPO_ROOT / "figures"


def require_data() -> Path:
    """`DATA_DIR` (models, prompts, benchmarks), or one line saying how to point the package at it."""
    if not DATA_DIR.is_dir():
        where = "SPECDEC_REPO" if os.environ.get("SPECDEC_REPO") else "the folder above the installed package"
        raise FileNotFoundError(f"specdec_utils needs the course checkout's data/ folder and found none in {REPO_ROOT} "
                                f"({where}): install the package editable from the checkout (`pip install -e .`) "
                                "or set SPECDEC_REPO to the checkout's root")
    return DATA_DIR


def quick_mode() -> bool:
    """The course's one CI switch: SPECDEC_QUICK=1 (set by `make test`) shrinks every benchmark."""
    return os.environ.get("SPECDEC_QUICK", "0").lower() not in ("", "0", "false", "no")


def get_device(prefer: str | None = None) -> torch.device:
    """cuda if available, then mps, then cpu; `prefer` (or env SPECDEC_DEVICE) forces one."""
    prefer = prefer or os.environ.get("SPECDEC_DEVICE")
    if prefer:
        allowed = ("cpu", "cuda", "mps")
        if prefer.split(":")[0] not in allowed:
            raise ValueError(f"unknown device {prefer!r}; allowed: {', '.join(allowed)}")
        return torch.device(prefer)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _forced_dtype() -> torch.dtype | None:
    """SPECDEC_DTYPE (float32, bfloat16 or float16): the dtype every model loads in, and the low-precision dtype the
    notebooks compare with float32 (set it to float16 on a GPU with bfloat16 to stand in for a T4)."""
    name = os.environ.get("SPECDEC_DTYPE", "")
    if name and name not in DTYPES:
        raise ValueError(f"SPECDEC_DTYPE={name!r} is not a dtype the course runs; allowed: {', '.join(DTYPES)}")
    return DTYPES.get(name)


def cpu_has_native_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX-512 BF16 or AMX, as torch reports it). Without it
    (AVX2-only servers, most laptops, Colab's CPU runtime) torch emulates bfloat16, and the emulation is slower
    than float32."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def low_precision_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """The 16-bit dtype `device` computes in natively, or float32 where it has none: bfloat16 on a GPU that has it
    (compute capability 8.0 on, e.g. A100, H100) and on a CPU with native bfloat16 (`cpu_has_native_bfloat16`);
    float16 on an older GPU (a T4, Colab's free GPU); float32 on a CPU without native bfloat16 (timing emulated
    bfloat16 there would measure the emulation). SPECDEC_DTYPE=float16 or bfloat16 forces it."""
    forced = _forced_dtype()
    if forced is not None and forced != torch.float32:
        return forced
    device = torch.device(device) if device is not None else get_device()
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.get_device_capability(device)[0] >= 8 else torch.float16
    if device.type == "cpu":
        return torch.bfloat16 if cpu_has_native_bfloat16() else torch.float32
    return torch.float16  # Apple's GPU (mps): float16 is its native half type


def default_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """The dtype `load_model` uses unless told: float32 on a CPU (exact comparisons; bfloat16 is measured beside
    it where a notebook says so), the device's `low_precision_dtype` on a GPU or Apple GPU; SPECDEC_DTYPE wins."""
    forced = _forced_dtype()
    if forced is not None:
        return forced
    device = torch.device(device) if device is not None else get_device()
    return torch.float32 if device.type == "cpu" else low_precision_dtype(device)


def seed_everything(seed: int = 0) -> torch.Generator:
    """Seed Python and torch (all devices); return a CPU generator seeded the same way."""
    random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def synchronize(device=None) -> None:
    """Wait for queued kernels so a wall-clock reading covers the work, not just its launch."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type == "cuda":
        if torch.cuda.is_available():
            torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _public_path(word: str) -> str:
    """`word`, or the path it names written without this machine's folders (see `command_line`)."""
    if not word.startswith("/"):
        return word
    path = Path(word).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else (path.name or word)


def command_line(module: str, argv: list[str] | None = None, world: int | None = None) -> str:
    """The shell command that reruns a tool, for its JSON record: `python -m MODULE ARGS` (ARGS: `argv`, or this
    process's own when None), or `torchrun --nproc_per_node WORLD -m MODULE ARGS` for a copy of a `world`-GPU run.
    Arguments are shell-quoted, so a note with spaces pastes back as one argument; an absolute path is written
    relative to the repository when it lies inside it, else by its name alone (this machine's folders stay private)."""
    words = [_public_path(w) for w in (sys.argv[1:] if argv is None else argv)]
    launcher = "python" if world is None else f"torchrun --nproc_per_node {world}"
    return f"{launcher} -m {module} {shlex.join(words)}".rstrip()


@contextmanager
def timer(device=None):
    """`with timer(dev) as t: ...` then `t.seconds`; synchronizes the device at both ends."""
    class Elapsed:
        seconds = float("nan")
    elapsed = Elapsed()
    synchronize(device)
    start = time.perf_counter()
    try:
        yield elapsed
    finally:
        synchronize(device)
        elapsed.seconds = time.perf_counter() - start


# untimed calls before timing on a GPU: its first passes pay one-time costs (lazy initialisation, kernel selection,
# the clock ramping up; about 40 ms against 25 ms later for the 135M target's forward on an H100)
GPU_WARMUP = 10


def time_fn(fn, *, repeats: int = 10, warmup: int | None = None, device=None) -> dict:
    """Median, min and all wall-clock seconds of `fn()` over `repeats` runs after `warmup` runs (default: 2, or
    `GPU_WARMUP` when `device` is a GPU).

    Each run is timed alone (`timer`: the device synchronized at both ends), and exactly `warmup + repeats`
    calls are made. `torch.utils.benchmark.Timer` cannot promise either: `timeit(number)` adds
    max(number // 100, 2) untimed calls to every measurement and returns one mean, `blocked_autorange`
    runs for a time budget and returns per-block means (a single block for calls longer than its
    budget), and both default to one CPU thread. The notebooks time seconds-long decodes a few times
    (`times` of 3 runs) as well as millisecond forwards, so this loop stays."""
    if warmup is None:
        warmup = 2 if device is None or torch.device(device).type == "cpu" else GPU_WARMUP
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        with timer(device) as t:
            fn()
        times.append(t.seconds)
    return {"median": statistics.median(times), "min": min(times), "times": times}


def progress(iterable, desc: str | None = None, total: int | None = None, **kwargs):
    """tqdm progress bar that keeps notebook outputs clean (text mode, cleared when done)."""
    from tqdm.auto import tqdm
    kwargs.setdefault("leave", False)
    kwargs.setdefault("disable", os.environ.get("SPECDEC_NO_PROGRESS") == "1")
    return tqdm(iterable, desc=desc, total=total, **kwargs)


def device_summary(device=None) -> str:
    """One line naming the hardware and library versions, for figure titles and notebooks."""
    import platform

    import transformers
    device = torch.device(device) if device is not None else get_device()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores"
    return f"{name} | torch {torch.__version__} | transformers {transformers.__version__}"


def set_plot_style() -> None:
    """One consistent matplotlib style for every figure of the course."""
    import matplotlib
    import matplotlib.pyplot as plt
    if not os.environ.get("MPLBACKEND") and "ipykernel" not in __import__("sys").modules:
        matplotlib.use("Agg")
    plt.rcParams.update({"figure.figsize": (7, 4), "figure.dpi": 100, "savefig.dpi": 120,
                         "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
                         "axes.spines.right": False, "font.size": 10, "axes.titlesize": 11,
                         "legend.frameon": False, "figure.constrained_layout.use": True})


def save_figure(fig, name: str, directory: Path | None = None) -> Path:
    """Save `fig` as `figures/<name>.png` (name says what it shows) and return the path.

    In quick mode (the test suite) the default folder is a temporary one instead, so a test run
    never overwrites the committed figures with numbers from a shortened run."""
    if not name or "/" in name or name.endswith(".png"):
        raise ValueError(f"figure name must be a bare name like '00_forward_latency', got {name!r}")
    if directory is None and quick_mode():
        directory = Path(tempfile.gettempdir()) / "specdec_quick_figures"
    directory = Path(directory or FIGURES_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    fig.savefig(path, bbox_inches="tight")
    return path


@torch.no_grad()
def forward_ms(model, num_new: int, cached: int = 48, repeats: int = 10, vocab_size: int | None = None) -> float:
    """Median milliseconds of one forward pass of `model` over `num_new` tokens on top of a KV cache of
    `cached` positions (rolled back after every pass). Token values do not matter for timing, so
    they are random; `vocab_size` bounds them (default: the model's input embedding size)."""
    from .core.kv_cache import trim_cache
    device = next(model.parameters()).device
    vocab_size = vocab_size or model.get_input_embeddings().num_embeddings
    ids = torch.randint(vocab_size, (1, cached + num_new), generator=torch.Generator().manual_seed(0)).to(device)
    cache = model(input_ids=ids[:, :cached], use_cache=True).past_key_values

    def step():
        model(input_ids=ids[:, cached:], past_key_values=cache, use_cache=True)
        trim_cache(cache, cached)

    return time_fn(step, repeats=repeats, device=device)["median"] * 1e3
