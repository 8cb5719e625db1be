"""The lab's provenance sentences: which weights measured a committed board, from the training logs' `replaced`
entries and the paired measurements they name."""
import json

from specdec_lab import provenance
from specdec_utils import models
from specdec_utils.core import eagle
from specdec_utils.utils import REPO_ROOT


def test_earlier_draft_note_names_runs_of_the_replaced_weights(tmp_path, monkeypatch):
    """A retrained draft keeps its name: `earlier_draft_note` says when committed runs used the weights it replaced
    (recorded by hash, or recorded nothing because they predate the field), with the paired measurement of both, and
    says nothing for runs of today's weights or when the draft replaced none."""
    folder = tmp_path / "draft-m"
    folder.mkdir()
    (folder / "training_log.json").write_text(json.dumps({"eval": {}}))
    assert provenance.earlier_draft_note("These runs", folder=folder) == ""  # replaced none
    measured = {"drafts": {"a": {"tau": 2.38, "gamma": 4, "prompts": 176, "dtype": "float32"},
                           "b": {"tau": 2.56, "gamma": 4, "prompts": 176, "dtype": "float32"}},
                "paired": {"b - a, tau": [0.18, 0.14, 0.23]}}
    (tmp_path / "m.json").write_text(json.dumps({"entry": measured}))
    monkeypatch.setattr(provenance, "REPO_ROOT", tmp_path)
    (folder / "training_log.json").write_text(json.dumps({"replaced": {
        "weights_sha256": "0123456789abcdef", "until": "2026-11-29",
        "measured": {"file": "m.json", "entry": "entry", "before": "a", "now": "b"}}}))
    note = provenance.earlier_draft_note("These H100 runs", folder=folder)
    assert note.startswith("These H100 runs used the `draft-m` shipped until 2026-11-29;")
    assert "2.380 tokens per drafting round against today's 2.560" in note
    assert "+0.180, 95% interval +0.140 to +0.230" in note
    old = {"from": "draft-m", "weights_sha256": "0123456789abcdef"}
    assert provenance.earlier_draft_note("These H100 runs", used=old, folder=folder) == note
    assert provenance.earlier_draft_note("These H100 runs", used={"from": "draft-m"}, folder=folder) == note  # no hash
    today = {"from": "draft-m", "weights_sha256": "fedcba9876543210"}
    assert provenance.earlier_draft_note("These runs", used=today, folder=folder) == ""


def test_the_shipped_draft_m_names_the_draft_it_replaced():
    """The shipped `draft-m`'s log names the weights it replaced, and the committed paired measurement it points to
    exists; the runs measured since record today's weights, which are not those."""
    before, measured = provenance.replaced_draft("draft-m")
    assert before["weights_sha256"] != models.weights_facts("draft-m")["weights_sha256"]
    now, earlier = (measured["drafts"][before["measured"][k]] for k in ("now", "before"))
    assert now["prompts"] == earlier["prompts"] == 176 and now["tau"] > earlier["tau"]
    assert provenance.earlier_draft_note("x", used=models.weights_facts("draft-m")) == ""



def test_earlier_head_note_renders_the_shipped_heads_recorded_comparison(tmp_path):
    """The sentence under committed runs that predate the shipped head: its facts are the config's `replaced` entry and
    the paired measurement it names (recomputed here from that file), and a head that replaced none gets no note."""
    shipped = eagle.MODELS_DIR / eagle.EAGLE_NAME
    config = json.loads((shipped / "config.json").read_text())
    before = config["replaced"]
    where = before["measured"]
    measured = json.loads((REPO_ROOT / where["file"]).read_text())[where["entry"]]
    note = provenance.earlier_head_note("These runs")
    assert note.startswith(f"These runs used the EAGLE head the course shipped until {before['until']}")
    assert f"({before['trained_steps']:,} training steps)" in note
    assert f"{config['trained_steps'] - before['trained_steps']:,} steps further" in note
    assert f"keeps {measured['heads'][where['now']]['tau_gamma6']:.2f} tokens per drafting round" in note
    assert f"earlier head's {measured['heads'][where['before']]['tau_gamma6']:.2f}" in note
    diff, low, high = measured["paired"][f"{where['now']} - {where['before']}, tau_gamma6"]
    assert f"({diff:+.2f}, 95% interval {low:+.2f} to {high:+.2f}, paired by prompt" in note and low <= diff <= high
    assert measured["heads"][where["now"]]["tau_gamma6"] > measured["heads"][where["before"]]["tau_gamma6"]
    # runs that recorded their head: the note only when it was the replaced one
    assert provenance.earlier_head_note("These runs", used={"weights_sha256": before["weights_sha256"]}) == note
    assert provenance.earlier_head_note("These runs", used={"weights_sha256": "0" * 16}) == ""
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "replaced"}))
    assert provenance.earlier_head_note("These runs", tmp_path) == ""
