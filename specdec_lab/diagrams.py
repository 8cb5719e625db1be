"""The course's diagrams (pictures of moving parts, no measurements): drawn with matplotlib, saved under
figures/diagrams/, and embedded in the lessons' markdown cells as attachments, so that they show in Jupyter and
Colab without the repository's files.

    python -m specdec_lab.diagrams            # draw every diagram into figures/diagrams/
    python -m specdec_lab.diagrams --embed    # and (re)embed each in the cell that names it

A markdown cell shows a diagram with `![what it shows](attachment:<name>.png)`; `--embed` fills that cell's
attachment from the PNG, so a redrawn diagram reaches the notebook without touching its text."""
import argparse
import base64
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

from specdec_utils.utils import FIGURES_DIR, REPO_ROOT  # noqa: E402

OUT = FIGURES_DIR / "diagrams"
COLORS = {"committed": "#9ecae1", "round": "#fdae6b", "stale": "#d9d9d9", "empty": "white", "host": "#c7e9c0",
          "gpu": "#fdd0a2", "graph": "#dadaeb"}


def _box(ax, x, y, w, h, text, color="white", size=9, **kw):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="black", lw=0.8, **kw))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)


def _arrow(ax, a, b, text="", style="-|>", color="black", offset=(0, 0.12)):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=12, lw=1, color=color))
    if text:
        ax.text((a[0] + b[0]) / 2 + offset[0], (a[1] + b[1]) / 2 + offset[1], text, ha="center", fontsize=8)


def static_cache():
    """A static KV buffer through one round: written, rolled back by the pointer, and the whole-buffer mask."""
    capacity, L, fed, kept = 16, 7, 5, 2
    fig, axes = plt.subplots(3, 1, figsize=(9, 6.2), gridspec_kw={"height_ratios": [1, 1, 2.8]})
    for ax, (title, length, stale) in zip(axes[:2], [
            (f"a round writes {fed} positions at slots L .. L+{fed - 1}, then length = L+{fed}", L + fed, 0),
            (f"{kept} drafts rejected: rollback sets length = L+{kept}; the other slots are stale, overwritten "
             "next round", L + kept, fed - kept)]):
        for s in range(capacity):
            color = (COLORS["committed"] if s < L else COLORS["round"] if s < length else
                     COLORS["stale"] if s < length + stale else COLORS["empty"])
            _box(ax, s, 0, 1, 1, str(s), color, size=8)
        _arrow(ax, (length, 1.9), (length, 1.05), "length", offset=(0.9, 0.1))
        ax.set_title(title, fontsize=9, loc="left")
        ax.set(xlim=(-0.2, capacity + 0.2), ylim=(-0.1, 2.2))
        ax.axis("off")
    ax = axes[2]
    rows = list(range(L, L + 3))
    for i, q in enumerate(rows):
        for s in range(capacity):
            seen = s <= q
            _box(ax, s, len(rows) - 1 - i, 1, 1, "", COLORS["committed"] if seen else COLORS["empty"])
        ax.text(-0.3, len(rows) - 0.5 - i, f"query at position {q}", ha="right", va="center", fontsize=8)
    ax.text(-4.5, len(rows) + 0.35, "graphed: every step attends over the whole buffer under the mask key position "
            "<= query position (shaded = seen);\nunwritten and stale slots lie past the query, so they are never read",
            fontsize=9, va="bottom")
    ax.set(xlim=(-4.5, capacity + 0.2), ylim=(-0.2, len(rows) + 1.3))
    ax.axis("off")
    return fig


def capture_replay():
    """Eager launches against one graph replay, on a host lane and a GPU lane."""
    fig, axes = plt.subplots(2, 1, figsize=(9, 3.6))
    kernels = 8
    ax = axes[0]
    for k in range(kernels):
        x = k * 1.1
        _box(ax, x, 1, 0.8, 0.6, "launch", COLORS["host"], size=7)
        _box(ax, x + 0.8, 0, 0.25, 0.6, "", COLORS["gpu"])
    ax.text(-0.3, 1.3, "host", ha="right", va="center", fontsize=9)
    ax.text(-0.3, 0.3, "GPU", ha="right", va="center", fontsize=9)
    ax.set_title("eager: the host launches each kernel; the GPU waits between them (launch-bound)", fontsize=9,
                 loc="left")
    ax.set(xlim=(-1.5, kernels * 1.1 + 0.5), ylim=(-0.2, 1.8))
    ax.axis("off")
    ax = axes[1]
    _box(ax, 0, 1, 1.4, 0.6, "copy inputs", COLORS["host"], size=7)
    _box(ax, 1.4, 1, 1.0, 0.6, "replay", COLORS["host"], size=7)
    for k in range(kernels):
        _box(ax, 2.4 + k * 0.28, 0, 0.25, 0.6, "", COLORS["gpu"])
    _box(ax, 2.4 + kernels * 0.28 + 0.2, 1, 1.6, 0.6, "read output", COLORS["host"], size=7)
    ax.text(-0.3, 1.3, "host", ha="right", va="center", fontsize=9)
    ax.text(-0.3, 0.3, "GPU", ha="right", va="center", fontsize=9)
    ax.set_title("graphed: recorded once (fixed shapes and addresses), then one launch replays every kernel back to "
                 "back", fontsize=9, loc="left")
    ax.set(xlim=(-1.5, kernels * 1.1 + 0.5), ylim=(-0.2, 1.8))
    ax.axis("off")
    return fig


def device_round():
    """One round of the device loop: state on the GPU, one graph per round, one read back."""
    fig, ax = plt.subplots(figsize=(10, 3.4))
    ax.add_patch(Rectangle((2.05, 0.75), 11.0, 2.05, facecolor=COLORS["graph"], edgecolor="black", lw=0.8, ls="--"))
    ax.text(2.15, 2.6, "one CUDA graph, replayed once per round", fontsize=8, va="center")
    boxes = [("state on the GPU:\ntokens, L,\ncaches", COLORS["committed"]),
             ("draft: γ steps,\neach token fed\nto the next", COLORS["round"]),
             ("verify: one\ntarget pass\nover γ + 1 rows", COLORS["round"]),
             ("accept: n kept\n(greedy, or\nu·q < p), and\nthe token after", COLORS["round"]),
             ("write tokens,\nL += n + 1", COLORS["round"]),
             ("the host reads\nn and the tokens\n(one copy)", COLORS["host"])]
    width, gap = 1.95, 0.55
    for i, (text, color) in enumerate(boxes):
        _box(ax, i * (width + gap), 1.0, width, 1.2, text, color, size=7.5)
        if i:
            _arrow(ax, (i * (width + gap) - gap, 1.6), (i * (width + gap), 1.6))
    right = 5 * (width + gap) + width / 2
    ax.plot([right, right, width / 2], [1.0, 0.35, 0.35], color="black", lw=1)
    _arrow(ax, (width / 2, 0.35), (width / 2, 1.0), "", offset=(0, 0))
    ax.text(right / 2 + width / 4, 0.12, "next round (no rollback: positions index every cache)", ha="center",
            fontsize=8)
    ax.set(xlim=(-0.2, 6 * (width + gap)), ylim=(0, 3.0))
    ax.axis("off")
    return fig


DIAGRAMS = {"09_static_cache": static_cache, "09_capture_replay": capture_replay, "09_device_round": device_round}


def draw_all() -> list[Path]:
    OUT.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, draw in DIAGRAMS.items():
        fig = draw()
        path = OUT / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths


def embed(notebook: Path) -> int:
    """Fill the attachment of every markdown cell of `notebook` that shows `attachment:<diagram>.png`."""
    nb = json.loads(notebook.read_text())
    filled = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        for name in DIAGRAMS:
            if f"attachment:{name}.png" in text:
                data = base64.b64encode((OUT / f"{name}.png").read_bytes()).decode()
                cell.setdefault("attachments", {})[f"{name}.png"] = {"image/png": data}
                filled += 1
    if filled:
        notebook.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return filled


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embed", action="store_true", help="embed the diagrams in the notebooks that show them")
    args = parser.parse_args(argv)
    for path in draw_all():
        print("drew", path.relative_to(REPO_ROOT))
    if args.embed:
        for notebook in sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
            if (n := embed(notebook)):
                print(f"embedded {n} diagram(s) in {notebook.name}")


if __name__ == "__main__":
    main()
