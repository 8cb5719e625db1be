"""`make archive`: the course as one zip a learner uploads where there is no clone (Colab's Files panel, a laptop
without git). It holds every tracked file of this checkout, as it is on disk (the models in data/models included),
under one folder, specdec-course/, which every lesson's first cell looks for and unpacks.

    python -m specdec_lab.archive [--out specdec-course.zip]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

from specdec_utils.utils import REPO_ROOT

FOLDER = "specdec-course"  # the name the setup cell unpacks to and looks for


def tracked_files(root: Path = REPO_ROOT) -> list[str]:
    """The checkout's tracked files (git ls-files), those deleted on disk left out."""
    listing = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, text=True)
    if listing.returncode:
        raise SystemExit(f"archive: {root} is not a git checkout ({listing.stderr.strip()})")
    return [name for name in listing.stdout.split("\0") if name and (root / name).is_file()]


def build(out: Path, root: Path = REPO_ROOT) -> Path:
    """Write the zip (to a temporary name, then renamed: an interrupted run leaves no half archive)."""
    out = Path(out).resolve()
    partial = out.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in tracked_files(root):
            archive.write(root / name, f"{FOLDER}/{name}")
    partial.replace(out)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO_ROOT / f"{FOLDER}.zip"), help="where to write the zip")
    out = build(Path(parser.parse_args(argv).out))
    print(f"{out} ({out.stat().st_size / 2**20:.1f} MiB): upload it next to a lesson, whose first cell unpacks it")


if __name__ == "__main__":
    sys.exit(main())
