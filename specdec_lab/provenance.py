"""Which weights measured a committed board, in words: the drafts and the EAGLE head keep their names when
their weights are replaced, and their training logs (`replaced`) name the weights they replaced and the committed
paired measurement of both. The lab pages and README tables use these to mark rows measured with earlier weights;
each board's JSON records the weights it used (`weights_sha256`, written by `models.weights_facts`)."""
from __future__ import annotations

import json
from pathlib import Path

from specdec_utils.core.eagle import EAGLE_NAME
from specdec_utils.models import MODELS_DIR
from specdec_utils.utils import REPO_ROOT


def replaced_draft(name: str = "draft-m", folder=None) -> tuple[dict, dict] | None:
    """The draft that the one shipped as `name` (or saved in `folder`) replaced: its training log's `replaced` entry
    (the earlier weights' hash, until when they shipped, the committed paired measurement that compares both) and
    that measurement (`drafts`, `paired`). None when it replaced none."""
    folder = Path(folder) if folder is not None else MODELS_DIR / name
    log = folder / "training_log.json"
    before = json.loads(log.read_text()).get("replaced") if log.is_file() else None
    if not before:
        return None
    where = before["measured"]
    return before, json.loads((REPO_ROOT / where["file"]).read_text())[where["entry"]]


def recorded_weights(records, key: str = "draft_weights") -> dict | None:
    """The weights a committed run recorded (`weights_facts`, under `key`): from a board's own field when it is one
    dict, else from the first of its records that carries one; None when none does (a run from before the field)."""
    if isinstance(records, dict):
        return records.get(key)
    return next((r[key] for r in records if r.get(key)), None)


def _replaced_if_used(used: dict | None, name: str, folder) -> tuple[dict, dict] | None:
    """`replaced_draft(name, folder)` when runs that recorded `used` (or nothing) ran on those replaced weights."""
    found = replaced_draft(name, folder)
    recorded = (used or {}).get("weights_sha256")
    return None if found is None or (recorded is not None and recorded != found[0]["weights_sha256"]) else found


def used_earlier_draft(used: dict | None = None, name: str = "draft-m", folder=None) -> bool:
    """Whether runs that recorded the weights `used` (None: they predate the field) ran on the draft that the shipped
    `name` replaced: exactly when `earlier_draft_note` has something to say."""
    return _replaced_if_used(used, name, folder) is not None


def earlier_draft_note(runs: str, used: dict | None = None, name: str = "draft-m", folder=None) -> str:
    """One sentence for committed runs made with the draft that the shipped `name` replaced (the draft keeps its
    name; its weights changed): `runs` names them (e.g. "These H100 runs"). Empty when the shipped draft replaced
    none, or when the runs recorded the weights they used (`used`, as `weights_facts` writes it) and those are not
    the replaced ones; runs that recorded none (`used` None or without a hash) predate the field and are taken to
    have used the replaced draft."""
    found = _replaced_if_used(used, name, folder)
    if found is None:
        return ""
    before, measured = found
    where = before["measured"]
    old, new = (measured["drafts"][where[k]] for k in ("before", "now"))
    diff, low, high = measured["paired"][f"{where['now']} - {where['before']}, tau"]
    return (f"{runs} used the `{name}` shipped until {before['until']}; every row drafting with it there had a "
            f"draft that accepts fewer tokens: {old['tau']:.3f} tokens per drafting round against today's "
            f"{new['tau']:.3f} ({diff:+.3f}, 95% interval {low:+.3f} to {high:+.3f}; paired on a CPU, {new['dtype']}, "
            f"γ = {new['gamma']}, the {new['prompts']} held-out prompts, not a board's).")


def replaced_head(path=None) -> tuple[dict, dict] | None:
    """The head that the one at `path` (default: the shipped one) replaced: its config's `replaced` entry (training
    steps, weights' hash, until when it shipped) and the committed paired measurement of both heads that the entry
    names (`heads`, `paired`). None when it replaced none."""
    folder = Path(path) if path is not None else MODELS_DIR / EAGLE_NAME
    before = json.loads((folder / "config.json").read_text()).get("replaced")
    if not before:
        return None
    where = before["measured"]
    return before, json.loads((REPO_ROOT / where["file"]).read_text())[where["entry"]]


def earlier_head_note(runs: str, path=None, used: dict | None = None) -> str:
    """One sentence for committed runs made before the shipped head's current weights: `runs` (their name, e.g.
    "These H100 runs") used the head it replaced. The facts come from the head's config (`replaced`: that head's
    training steps, until when it shipped, and the committed paired measurement of both heads on the held-out
    prompts). Empty when the head at `path` (default: the shipped one) replaced none, or when the runs recorded
    the head they used (`used`, as `head_facts` writes it) and it is not the replaced one; runs that recorded none
    (`used` None or without a hash) predate the field and are taken to have used the replaced head."""
    folder = Path(path) if path is not None else MODELS_DIR / EAGLE_NAME
    found = replaced_head(folder)
    recorded = (used or {}).get("weights_sha256")
    if found is None or (recorded is not None and recorded != found[0].get("weights_sha256")):
        return ""
    before, measured = found
    where = before["measured"]
    config = json.loads((folder / "config.json").read_text())
    old, new = (measured["heads"][where[k]]["tau_gamma6"] for k in ("before", "now"))
    diff, low, high = measured["paired"][f"{where['now']} - {where['before']}, tau_gamma6"]
    return (f"{runs} used the EAGLE head the course shipped until {before['until']} ({before['trained_steps']:,} "
            f"training steps). The head shipped now was trained "
            f"{config.get('trained_steps', 0) - before['trained_steps']:,} steps further, with the acceptance-aware "
            f"objective (kl+lk), and keeps {new:.2f} tokens per drafting round at γ = 6 on the "
            f"{measured['heads'][where['now']]['prompts']} held-out prompts against the earlier head's {old:.2f} "
            f"({diff:+.2f}, 95% interval {low:+.2f} to {high:+.2f}, paired by prompt, float32): these runs' EAGLE rows "
            f"come from a head that accepted fewer tokens.")
