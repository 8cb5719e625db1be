"""report: estimates with spreads, the words chosen from them, the stamp, and README's rendered tables."""
import random
import subprocess
import sys

import pytest

from specdec_lab import readme_tables
from specdec_utils import report


def records(speed: dict, prompts=10, jitter=0.0, seed=0):
    """Bench-like records: method -> tokens/s, each prompt 64 tokens, wall time jittered per prompt."""
    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        slow = 1 + rng.uniform(-jitter, jitter)        # a prompt that is slow for one method is slow for all
        for method, tps in speed.items():
            out.append({"id": f"p{p}", "method": method, "new_tokens": 64, "wall_s": 64 / tps * slow,
                        "target_calls": 64 if method == "ar" else 32})
    return out


def test_estimate_formats_value_and_interval():
    e = report.Estimate(1.4321, 1.38, 1.49)
    assert f"{e:.2f}" == "1.43 (1.38-1.49)"
    assert f"{e:.2fx}" == "1.43x (1.38-1.49)"
    assert f"{report.Estimate(0.25, 0.2, 0.3):.0f%}" == "25% (20-30)"
    assert f"{report.Estimate(-0.12, -0.17, -0.07):.2f}" == "-0.12 (-0.17 to -0.07)"
    assert f"{report.Estimate(0.01, -0.02, 0.05):.2f}" == "0.01 (-0.02 to 0.05)"


def test_verdict_uses_the_whole_interval():
    assert report.verdict(report.Estimate(1.2, 1.05, 1.3)) == "faster"
    assert report.verdict(report.Estimate(0.9, 0.8, 0.95)) == "slower"
    assert report.verdict(report.Estimate(1.2, 0.99, 1.4)) == report.TIE


def test_compare_and_rank_make_ties_of_overlaps():
    a, b, c = report.Estimate(1.5, 1.4, 1.6), report.Estimate(1.45, 1.35, 1.55), report.Estimate(1.1, 1.0, 1.2)
    assert report.compare(a, b) == report.TIE and report.compare(a, c) == "higher" and report.compare(c, a) == "lower"
    assert report.rank({"a": a, "b": b, "c": c}) == [["a", "b"], ["c"]]


def test_ranking_text_says_overlap_between_tiers():
    a, b, c = report.Estimate(1.5, 1.4, 1.6), report.Estimate(1.35, 1.25, 1.45), report.Estimate(1.0, 0.9, 1.1)
    assert report.ranking({"a": a, "b": b, "c": c}) == "`a` = `b` > `c`"
    d = report.Estimate(1.2, 1.1, 1.3)  # below a's interval, overlapping b's
    assert report.ranking({"a": a, "b": b, "d": d}) == "`a` = `b` ≥ `d`"


def test_paired_speedup_is_exact_without_noise_and_tight_with_shared_noise():
    exact = report.speedup(records({"ar": 20.0, "greedy": 30.0}), "greedy")
    assert exact.value == pytest.approx(1.5) and exact.low == pytest.approx(1.5) and exact.high == pytest.approx(1.5)
    shared = report.speedup(records({"ar": 20.0, "greedy": 30.0}, jitter=0.3), "greedy")
    assert shared.low == pytest.approx(1.5) and shared.high == pytest.approx(1.5)   # pairing cancels per-prompt noise
    assert report.tau(records({"ar": 20.0, "greedy": 30.0}), "greedy").value == pytest.approx(2.0)


def test_unpaired_noise_widens_the_interval_and_makes_a_tie():
    rs = records({"ar": 20.0, "greedy": 21.0})
    rng = random.Random(1)
    for r in rs:
        r["wall_s"] *= 1 + rng.uniform(-0.3, 0.3)
    s = report.speedup(rs, "greedy")
    assert s.low < 1.0 < s.high and report.verdict(s) == report.TIE


def test_speedup_names_missing_methods():
    with pytest.raises(ValueError, match="no records of method 'medusa'; methods present: ar, greedy"):
        report.speedup(records({"ar": 20.0, "greedy": 30.0}), "medusa")


def test_summarize_pools_each_method_once_for_every_renderer():
    """One aggregation path: pooled totals (not means of per-prompt rates), the point speedup, its bootstrap
    interval from `report.speedup`, and None where the records do not say."""
    rs = [{"id": p, "method": m, "category": c, "new_tokens": 10, "wall_s": w, "target_calls": t, "draft_calls": d,
           "drafted": dr, "accepted": a}
          for p, c, m, w, t, d, dr, a in [("p1", "code", "ar", 1.0, 10, 0, 0, 0),
                                          ("p2", "chat", "ar", 3.0, 10, 0, 0, 0),
                                          ("p1", "code", "greedy", 0.5, 4, 12, 12, 6),
                                          ("p2", "chat", "greedy", 1.0, 5, 16, 16, 5),
                                          ("p1", "code", "lookup", 0.5, 5, 0, -1, -1),
                                          ("p2", "chat", "lookup", 2.0, 5, 0, -1, -1)]]
    rows = {row["method"]: row for row in report.summarize(rs)}
    greedy, ar, lookup = rows["greedy"], rows["ar"], rows["lookup"]
    assert greedy["tok_per_s"] == 20 / 1.5 and greedy["speedup"] == (20 / 1.5) / (20 / 4)
    assert greedy["tau"] == 20 / 9 and greedy["acceptance"] == 11 / 28 and greedy["waste"] == 17 / 20
    assert greedy["draft_calls_per_token"] == 28 / 20
    assert greedy["by_category"] == {"code": 2.0, "chat": 3.0}
    assert greedy["speedup_ci"] == report.speedup(rs, "greedy") and greedy["verdict"] == "faster"
    assert (ar["speedup"], ar["verdict"], ar["waste"], ar["acceptance"]) == (1.0, "-", 0.0, None)
    assert lookup["waste"] is None and lookup["acceptance"] is None  # drafted -1: not reported
    assert report.tokens_per_second(report.select(rs, "greedy", "chat")) == 10.0
    quick = report.summarize(rs, intervals=False)
    assert [row["speedup_ci"] for row in quick] == [None] * 3 and quick[1]["speedup"] == greedy["speedup"]
    with pytest.raises(ValueError, match="no records of method 'ar'"):
        report.summarize(report.select(rs, "greedy"))
    assert report.summarize(report.select(rs, "greedy"), intervals=False)[0]["speedup"] is None
    assert report.speedup_rows(rs, methods=["greedy"])[0]["speedup"] == f"{greedy['speedup_ci']:.2fx}"


def test_round_fit_recovers_a_per_round_cost_and_a_fixed_cost():
    records = [{"target_calls": n, "wall_s": (25 + 1.5 * n) / 1e3} for n in (10, 20, 35, 50)]
    per_round, fixed = report.round_fit(records)
    assert abs(per_round - 1.5) < 1e-9 and abs(fixed - 25) < 1e-9
    with pytest.raises(ValueError, match="different numbers of rounds"):
        report.round_fit(records[:1] * 3)


def test_resample_indices_are_the_picks_of_random_choice():
    import random
    for n in (1, 2, 3, 7, 8, 40, 176, 1000):
        rng = random.Random(5)
        expected = [rng.choice(range(n)) for _ in range(3 * n + 50)]
        assert report.resample_indices(n, len(expected), seed=5).tolist() == expected
    with pytest.raises(ValueError, match="at least one item"):
        report.resample_indices(0, 3)


def test_vectorized_bootstraps_equal_the_record_by_record_statistic():
    """speedup and tau bootstrap through numpy; the interval equals the one of the plain statistic."""
    import random
    rng = random.Random(1)
    records = [{"id": p, "method": m, "new_tokens": rng.randint(20, 64), "wall_s": rng.uniform(0.5, 3.0),
                "target_calls": rng.randint(8, 40)} for p in range(30) for m in ("ar", "greedy")]
    fast = report.speedup(records, "greedy")
    mine, base = ({r["id"]: [r] for r in records if r["method"] == m} for m in ("greedy", "ar"))

    def ratio(sample):
        return (report.tokens_per_second([r for p in sample for r in mine[p]])
                / report.tokens_per_second([r for p in sample for r in base[p]]))
    plain = report.bootstrap(list(mine), ratio)
    assert (fast.value, fast.low, fast.high) == (plain.value, plain.low, plain.high)
    tau = report.tau(records, "greedy")
    plain_tau = report.bootstrap(list(mine), lambda s: report.tokens_per_target_call([r for p in s for r in mine[p]]))
    assert (tau.value, tau.low, tau.high) == (plain_tau.value, plain_tau.low, plain_tau.high)


def test_from_repeats_is_median_and_range():
    e = report.from_repeats([3.0, 1.0, 2.0])
    assert (e.value, e.low, e.high) == (2.0, 1.0, 3.0)


def test_over_repeats_gives_the_repeats_median_ratio_and_the_pooled_bootstrap():
    runs = [dict(r, repeat=k) for k, speed in enumerate(({"ar": 20.0, "greedy": 30.0}, {"ar": 10.0, "greedy": 20.0},
                                                         {"ar": 20.0, "greedy": 25.0}))
            for r in records(speed)]
    rates = report.rates_by_repeat(runs)
    assert rates[("greedy", 1)] == pytest.approx(20.0) and rates[("ar", 2)] == pytest.approx(20.0)
    by_repeats, by_prompts = report.over_repeats(runs, "greedy", "ar")
    assert (by_repeats.value, by_repeats.low, by_repeats.high) == pytest.approx((1.5, 1.25, 2.0))
    assert by_prompts.value == pytest.approx(report.speedup(runs, "greedy", "ar").value)
    assert report.over_repeats(runs, "greedy", "ar", rates)[0] == by_repeats
    # a word only when both intervals clear 1
    assert report.verdict_both((report.Estimate(1.1, 1.05, 1.2), report.Estimate(1.1, 1.02, 1.2))) == "faster"
    assert report.verdict_both((report.Estimate(1.1, 0.98, 1.2), report.Estimate(1.1, 1.02, 1.2))) == report.TIE
    assert report.verdict_both((report.Estimate(0.9, 0.8, 0.95), report.Estimate(0.9, 0.85, 0.99))) == "slower"


def test_stamp_names_cpu_kind_versions_and_mode(capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_QUICK", "1")
    stamp = report.stamp("cpu")
    out = capsys.readouterr().out
    assert out.startswith("run stamp") and "CPU kind: " + stamp.cpu["kind"] in out
    assert stamp.cpu["kind"] in report.CPU_KINDS and "torch" in out and "transformers" in out
    assert "mode         quick" in out
    report.finish()
    assert "minutes (quick mode)" in capsys.readouterr().out


def test_readme_blocks_match_the_committed_json():
    result = subprocess.run([sys.executable, "-m", "specdec_lab.readme_tables", "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_readme_check_catches_a_hand_edited_number():
    text = readme_tables.README.read_text()
    block = readme_tables.BLOCK.search(text)
    assert block, "README.md has no results block"
    edited = text.replace(block.group("body"), block.group("body").replace("x (", "x [", 1).replace("1", "7", 1), 1)
    assert readme_tables.rewrite(edited) == readme_tables.rewrite(text) != edited


def test_every_block_is_rendered_once_and_known():
    """Every known block sits on exactly one page (README.md's front page or the lab page)."""
    names = [m.group("name") for page in readme_tables.PAGES for m in readme_tables.BLOCK.finditer(page.read_text())]
    assert sorted(names) == sorted(readme_tables.BLOCKS)


def test_the_front_page_is_short():
    """README.md is a front page (what the course is, the commands, the map, one headline table); results live in the
    lab page."""
    text = readme_tables.README.read_text()
    assert [m.group("name") for m in readme_tables.BLOCK.finditer(text)] == ["runtimes", "bench"]
    assert len(text.split()) <= 2500, f"README.md has {len(text.split())} words"


def test_the_stamp_ignores_what_a_run_of_the_course_writes(tmp_path, monkeypatch):
    """Notebooks and the figures they draw do not make the stamp say '+ local changes'; any other tracked file does."""
    import subprocess

    from specdec_utils import report as report_module

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)
    git("init", "-q")
    for name in ("notebooks/a.ipynb", "figures/a.png", "specdec_utils/x.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("1")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    monkeypatch.setattr(report_module, "REPO_ROOT", tmp_path)
    (tmp_path / "notebooks/a.ipynb").write_text("2")
    (tmp_path / "figures/a.png").write_text("2")
    assert not report_module.git_commit().endswith("local changes")
    (tmp_path / "specdec_utils/x.py").write_text("2")
    assert report_module.git_commit().endswith(" + local changes")


def test_paired_difference_sees_a_small_shared_gain_that_separate_intervals_call_a_tie():
    """Two drafters on the same prompts: prompts differ a lot in difficulty, the second drafter is slightly better
    on every prompt. Each side's interval overlaps the other's, the paired difference excludes 0; the same runs
    unpaired (shuffled) do not; unequal lengths fail in one line."""
    import random
    rng = random.Random(0)
    hard = [rng.uniform(1.3, 3.5) for _ in range(150)]
    a = [(round(50 * h), 50) for h in hard]
    b = [(round(50 * h) + 4, 50) for h in hard]
    ia, ib = report.ratio_interval(a), report.ratio_interval(b)
    assert ia.high > ib.low  # separately: overlapping intervals
    d = report.paired_difference(b, a)
    assert abs(d.value - (ib.value - ia.value)) < 1e-12 and d.low > 0
    shuffled = b[:]
    rng.shuffle(shuffled)
    assert report.paired_difference(shuffled, a).low < 0 < report.paired_difference(shuffled, a).high
    with pytest.raises(ValueError, match="same items"):
        report.paired_difference(a, b[:-1])


def test_tables_mark_the_rows_of_the_draft_m_it_replaced():
    """A README row measured with the `draft-m` the shipped one replaced (its records carry that hash, or none: they
    predate the field) is marked, and the table says which draft that was; a row of today's weights is not."""
    from specdec_lab.provenance import replaced_draft
    from specdec_utils.models import weights_facts
    before, _ = replaced_draft("draft-m")
    rows = [{"method": "ar"}, {"method": "greedy"}]
    assert readme_tables._earlier(rows) == readme_tables.EARLIER  # no record of the weights: the earlier draft
    old = [{"method": "greedy", "draft_weights": {"from": "draft-m", "weights_sha256": before["weights_sha256"]}}]
    assert readme_tables._earlier(old) == readme_tables.EARLIER
    assert readme_tables._earlier([{"method": "greedy", "draft_weights": weights_facts("draft-m")}]) == ""
    footer = readme_tables._earlier_footer([f"| a run{readme_tables.EARLIER} |", "| another |"])
    assert footer.startswith("\n\nThe runs marked") and before["until"] in footer
    assert readme_tables._earlier_footer(["| a run |"]) == ""


def test_the_headline_says_why_hf_drafted_worse(monkeypatch):
    """Greedy in float32 HF's loop runs our algorithm, so a run where its tau is below ours gets the sentence on the
    draft-class fault under the table; a run where both agree does not."""
    from specdec_utils.models import weights_facts
    today = weights_facts("draft-m")

    def run(calls_hf):
        rows = [{"id": str(i), "method": m, "new_tokens": 60, "target_calls": c, "wall_s": 1.0, "temperature": 0.0,
                 "draft_weights": today}
                for i in range(3) for m, c in (("ar", 60), ("greedy", 25), ("hf-assisted", calls_hf))]
        monkeypatch.setattr(readme_tables, "_load", lambda name: rows)
        monkeypatch.setattr(readme_tables, "BENCH_FILES", [("x.json", "a CPU")])
        return readme_tables.bench_table()
    assert run(30).endswith(readme_tables.HF_FAULT)
    assert readme_tables.HF_FAULT not in run(25)


def test_say_shows_nothing_for_an_empty_sentence(capsys, monkeypatch):
    """A note with nothing to say (an empty string) leaves no blank output behind; any other sentence is shown."""
    monkeypatch.setattr(report, "_in_notebook", lambda: False)
    report.say("")
    assert capsys.readouterr().out == ""
    report.say("tau 2.50")
    assert capsys.readouterr().out == "tau 2.50\n"
