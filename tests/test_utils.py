"""Tests of the small helpers: device choice, seeding, timing, progress, figures, quick mode."""
import time

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specdec_utils import utils  # noqa: E402


def test_device_order(monkeypatch):
    monkeypatch.delenv("SPECDEC_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert utils.get_device().type == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert utils.get_device().type == "mps"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert utils.get_device().type == "cpu"


def test_device_override_and_bad_name(monkeypatch):
    monkeypatch.setenv("SPECDEC_DEVICE", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert utils.get_device().type == "cpu"
    with pytest.raises(ValueError, match="allowed: cpu, cuda, mps"):
        utils.get_device("tpu")


def test_the_dtype_follows_the_hardware(monkeypatch):
    """float32 on a CPU, with bfloat16 beside it only where the CPU computes it natively (AVX-512 BF16 or AMX; an
    AVX2-only CPU keeps float32 for both), bfloat16 on a GPU of compute capability 8.0 on, float16 on an older one
    (a T4: 7.5), and SPECDEC_DTYPE forces one or fails in one line."""
    monkeypatch.delenv("SPECDEC_DTYPE", raising=False)
    for native, low in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(utils, "cpu_has_native_bfloat16", lambda native=native: native)
        assert utils.default_dtype("cpu") == torch.float32 and utils.low_precision_dtype("cpu") == low, native
    for capability, dtype in (((9, 0), torch.bfloat16), ((8, 0), torch.bfloat16), ((7, 5), torch.float16)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert utils.default_dtype("cuda") == utils.low_precision_dtype("cuda") == dtype, capability
    monkeypatch.setenv("SPECDEC_DTYPE", "float16")
    assert utils.default_dtype("cpu") == utils.low_precision_dtype("cuda") == torch.float16
    monkeypatch.setenv("SPECDEC_DTYPE", "float32")  # every model in float32; the comparison dtype still follows
    assert utils.default_dtype("cuda") == torch.float32 and utils.low_precision_dtype("cuda") == torch.float16
    monkeypatch.setenv("SPECDEC_DTYPE", "bfloat16")  # forced: also on a CPU without native bfloat16
    assert utils.low_precision_dtype("cpu") == torch.bfloat16
    monkeypatch.setenv("SPECDEC_DTYPE", "fp8")
    with pytest.raises(ValueError, match="allowed: float32, bfloat16, float16"):
        utils.default_dtype("cpu")


def test_native_bfloat16_is_what_torch_reports(monkeypatch):
    """The CPU check reads torch's own flags (AVX-512 BF16, AMX tiles); either one is enough."""
    for bf16, amx, expected in ((True, False, True), (False, True, True), (False, False, False)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=bf16: v, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v, raising=False)
        assert utils.cpu_has_native_bfloat16() is expected


def test_seed_everything_is_reproducible():
    g1 = utils.seed_everything(7)
    a = torch.rand(3), torch.rand(3, generator=g1)
    g2 = utils.seed_everything(7)
    b = torch.rand(3), torch.rand(3, generator=g2)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_timer_synchronizes_the_device(monkeypatch):
    calls = []
    monkeypatch.setattr(utils, "synchronize", lambda device=None: calls.append(device))
    with utils.timer("cuda") as t:
        time.sleep(0.01)
    assert calls == ["cuda", "cuda"]  # before starting the clock and before reading it
    assert 0.009 < t.seconds < 1


def test_time_fn_counts_runs_and_rejects_bad_counts():
    runs = []
    out = utils.time_fn(lambda: runs.append(1), repeats=5, warmup=2)
    assert len(runs) == 7 and len(out["times"]) == 5 and out["min"] <= out["median"]
    with pytest.raises(ValueError, match="repeats >= 1"):
        utils.time_fn(lambda: None, repeats=0)


def test_time_fn_warms_a_gpu_up_longer(monkeypatch):
    """A GPU's first passes pay one-time costs: by default 10 untimed calls there, 2 on a CPU."""
    monkeypatch.setattr(utils, "synchronize", lambda device=None: None)
    for device, calls in (("cpu", 2 + 3), (None, 2 + 3), ("cuda", utils.GPU_WARMUP + 3)):
        runs = []
        utils.time_fn(lambda: runs.append(1), repeats=3, device=device)
        assert len(runs) == calls, device


def test_progress_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("SPECDEC_NO_PROGRESS", "1")
    bar = utils.progress(range(3), desc="x")
    assert bar.disable and list(bar) == [0, 1, 2]


@pytest.mark.parametrize("value, expected", [("1", True), ("0", False), ("", False), ("false", False)])
def test_quick_mode(monkeypatch, value, expected):
    monkeypatch.setenv("SPECDEC_QUICK", value)
    assert utils.quick_mode() is expected


def test_save_figure(tmp_path, monkeypatch):
    utils.set_plot_style()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = utils.save_figure(fig, "99_test_plot", directory=tmp_path)
    assert path == tmp_path / "99_test_plot.png" and path.stat().st_size > 1000
    for bad in ("", "a/b", "plot.png"):
        with pytest.raises(ValueError, match="bare name"):
            utils.save_figure(fig, bad, directory=tmp_path)
    # quick mode (the test suite) never overwrites the committed figures
    monkeypatch.setenv("SPECDEC_QUICK", "1")
    quick_path = utils.save_figure(fig, "99_test_plot")
    assert utils.FIGURES_DIR not in quick_path.parents
    plt.close(fig)


def test_command_line_pastes_back_as_the_same_arguments(monkeypatch):
    """A tool's recorded command reruns it: the arguments given (or the process's own), shell-quoted so that one
    with spaces stays one; a copy of a torchrun job records the torchrun launch."""
    import shlex

    from specdec_utils.utils import command_line
    argv = ["--note", "two H200 runs, merged", "--out", "x.json"]
    line = command_line("specdec_lab.tree_graph_bench", argv)
    assert shlex.split(line) == ["python", "-m", "specdec_lab.tree_graph_bench", *argv]
    assert shlex.split(command_line("m", argv, world=4)) == ["torchrun", "--nproc_per_node", "4", "-m", "m", *argv]
    monkeypatch.setattr("sys.argv", ["x.py", "--steps", "3"])
    assert command_line("m") == "python -m m --steps 3"
    assert command_line("m", []) == "python -m m"  # no arguments given: none recorded, not the process's own
    # paths: inside the repository relative to it, elsewhere by name alone
    inside, outside = str(utils.REPO_ROOT / "data" / "bench" / "x.json"), "/home/someone/ferry/corpus.pt"
    assert shlex.split(command_line("m", ["--out", inside, "--corpus", outside, "--n", "3"]))[3:] == [
        "--out", "data/bench/x.json", "--corpus", "corpus.pt", "--n", "3"]
