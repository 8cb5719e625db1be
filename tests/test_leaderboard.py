"""The leaderboard (notebook 10): the learner's reader (`specdec_utils.leaderboard`) and the lab's command line
(`specdec_lab.leaderboard`), on the committed results and on hand-made records: no GPU, no model."""
import copy
import json
import subprocess
import sys

import pytest

from specdec_lab import leaderboard as cli
from specdec_utils import leaderboard as lb
from specdec_utils.utils import REPO_ROOT


def record(method, prompt, category, tokens, wall, calls, drafted=-1, accepted=-1, ids=None, temperature=0.0):
    return {"id": prompt, "method": method, "category": category, "new_tokens": tokens, "wall_s": wall,
            "target_calls": calls, "drafted": drafted, "accepted": accepted, "temperature": temperature,
            "new_token_ids": ids if ids is not None else list(range(tokens)), "dtype": "bfloat16",
            "device_name": "some CPU | torch 2.13", "versions": {"torch": "2.13"}, "date": "2026-11-23",
            "cuda_graphs": False}


@pytest.fixture
def run():
    return [record("ar", "p1", "code", 10, 1.0, 10), record("ar", "p2", "chat", 10, 2.0, 10),
            record("greedy", "p1", "code", 10, 0.5, 4, drafted=12, accepted=6),
            record("greedy", "p2", "chat", 10, 1.0, 5, drafted=16, accepted=5, ids=[9] * 10)]


def test_summary_numbers(run):
    rows = {r["method"]: r for r in lb.summarize(run)}
    assert rows["ar"]["speedup"] == 1 and rows["ar"]["tau"] == 1
    assert rows["greedy"]["tok_per_s"] == 20 / 1.5 and rows["greedy"]["speedup"] == (20 / 1.5) / (20 / 3)
    assert rows["greedy"]["tau"] == 20 / 9 and rows["greedy"]["waste"] == (12 - 6 + 16 - 5) / 20
    assert rows["greedy"]["same_as_ar"] == (1, 2)  # p2's greedy output departs from ar's: a flip, reported
    assert rows["greedy"]["by_category"] == {"code": 2.0, "chat": 2.0}
    # both prompts are 2x faster: every bootstrap resample gives 2x, so the interval is a point and the word "faster"
    assert (rows["greedy"]["speedup_ci"].low, rows["greedy"]["speedup_ci"].high) == (2.0, 2.0)
    assert rows["greedy"]["verdict"] == "faster" and rows["ar"]["verdict"] == "-"
    text = cli.markdown([run])
    assert "| `greedy` | 13.3 | **2.00x** (2.00-2.00) | faster | 2.22 | 0.85 | 1/2 | 2.00x | 2.00x |" in text
    assert "| `ar` | 6.7 | **1.00x** (baseline) | - | 1.00 |" in text
    assert "some CPU, bfloat16, eager, greedy (torch 2.13; 2026-11-23)" in text


def test_speedup_intervals_and_verdicts(run):
    """The verdict word follows the interval: a method faster on one prompt and slower on another is a tie."""
    run += [record("mixed", "p1", "code", 10, 0.5, 5), record("mixed", "p2", "chat", 10, 4.0, 5),
            record("slow", "p1", "code", 10, 2.0, 10), record("slow", "p2", "chat", 10, 4.0, 10)]
    rows = {r["method"]: r for r in lb.summarize(run)}
    mixed, slow = rows["mixed"]["speedup_ci"], rows["slow"]["speedup_ci"]
    assert mixed.low < 1 < mixed.high and rows["mixed"]["verdict"] == "a tie within the spread"
    assert slow.high < 1 and rows["slow"]["verdict"] == "slower"
    assert mixed.value == pytest.approx(rows["mixed"]["speedup"])
    text = cli.markdown([run])
    assert f"| `slow` | 3.3 | **0.50x** ({slow.low:.2f}-{slow.high:.2f}) | slower |" in text


def test_sampled_runs_do_not_compare_tokens(run):
    for r in run:
        r["temperature"] = 1.0 if r["method"] != "greedy" else 0.0
    rows = {r["method"]: r for r in lb.summarize(run)}
    assert rows["greedy"]["same_as_ar"] is None and "sampled at T = 1.0" in lb.setting(run)


@pytest.mark.parametrize("change,message", [
    (lambda rs: [{k: v for k, v in r.items() if k != "date"} for r in rs],
     "lacks date: re-run it with the current bench CLI"),
    (lambda rs: [r for r in rs if r["method"] != "ar"], "has no `ar` records"),
    (lambda rs: {"records": rs}, "must hold a non-empty list of bench records"),
])
def test_bad_files_give_one_line(tmp_path, capsys, run, change, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(change(copy.deepcopy(run))))
    assert cli.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("leaderboard: error: ") and message in err and err.count("\n") == 1
    assert cli.main([str(tmp_path / "none.json")]) == 2
    assert "no such results file" in capsys.readouterr().err


def test_the_committed_board_renders(tmp_path):
    files = lb.committed_files()
    assert files, "no committed leaderboard_*.json"
    runs = lb.load(files)
    for records in runs:
        assert {"device_name", "dtype", "versions", "date"} <= records[0].keys()
    out = subprocess.run([sys.executable, "-m", "specdec_lab.leaderboard", "--out-dir", str(tmp_path)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("### ") == len(files) and "| `ar` |" in out.stdout
    assert (tmp_path / "leaderboard.md").read_text().strip() == out.stdout.strip()
    assert (tmp_path / "leaderboard.png").stat().st_size > 10_000


def test_result_name_slugs_the_whole_device_name(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert cli.result_name(torch.device("cuda"), "bfloat16", True, False) == \
        "leaderboard_gpu_nvidia_h100_80gb_hbm3_bfloat16_graphed.json"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")  # one word after the vendor
    assert cli.result_name(torch.device("cuda"), "float32", False, True) == \
        "leaderboard_gpu_tesla_t4_float32_sampled.json"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert cli.result_name(torch.device("cpu"), "float32", False, False) == "leaderboard_cpu_avx512_float32.json"
    assert cli.slug("  Radeon (TM) 7900 XTX ") == "radeon_tm_7900_xtx" and cli.slug("") == "unknown"


def test_the_lab_uses_the_learner_reader_and_a_lesson_needs_no_lab():
    for name in ("load", "committed_files", "setting", "summarize", "plot", "LeaderboardError", "BENCH_DIR"):
        assert getattr(cli, name) is getattr(lb, name), name
    code = "import sys, specdec_utils.leaderboard; print(sorted(m for m in sys.modules if m.startswith('specdec_lab')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
