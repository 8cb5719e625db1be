"""Tests of the package's shape: no import cycle among its modules, a light `import specdec_utils`, and a plain
(non-editable) wheel that holds every subpackage."""
import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import specdec_utils

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE = REPO_ROOT / "specdec_utils"

# Edges (importer, imported) left in a cycle on purpose, each with its reason. Keep it empty.
KNOWN_CYCLE_EDGES: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (never run, so no edge)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped |= {id(n) for n in ast.walk(child)}
    return skipped


def import_graph() -> dict[str, set[str]]:
    """importer -> the package modules it imports, at module level or inside a function, relative or absolute.
    `from X import name` points at X.name when that is a module, else at X."""
    files = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph = {name: set() for name in files}

    def known(dotted: str) -> str | None:  # the longest prefix of `dotted` that is a module of the package
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in files:
                return ".".join(parts[:n])
        return None

    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = _type_checking_only(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets = [known(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [(base + "." + alias.name) if (base + "." + alias.name) in files else known(base)
                           for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert "specdec_utils.core.kv_cache" in graph["specdec_utils.core.runner"]          # from .kv_cache import ...
    assert "specdec_utils.compat" in graph["specdec_utils.core.kv_cache"]               # from ..compat import ...
    assert "specdec_utils.core.tree" in graph["specdec_utils.core.tree_drafting"]       # from . import tree as trees
    assert "specdec_utils.tools.bench" in graph["specdec_utils.bench"]                  # from .tools import bench
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_the_package_modules():
    graph = import_graph()
    for (importer, imported), reason in KNOWN_CYCLE_EDGES.items():
        assert imported in graph[importer], f"stale entry in KNOWN_CYCLE_EDGES ({reason}): {importer} -> {imported}"
        graph[importer].discard(imported)
    found = cycles(graph)
    detail = "; ".join(" <-> ".join(c) + " (" + ", ".join(f"{a}->{b}" for a in c for b in sorted(graph[a]) if b in c)
                       + ")" for c in found)
    assert not found, f"import cycles among specdec_utils modules: {detail}"


def test_tree_is_pure_structure():
    """tree.py builds and masks trees; running a model on one (runner) or editing a cache (kv_cache) lives elsewhere."""
    assert not {"specdec_utils.core.runner", "specdec_utils.core.tree_attention", "specdec_utils.core.kv_cache",
                "specdec_utils.core.static_cache"} & import_graph()["specdec_utils.core.tree"]


HEAVY = ("torch", "transformers", "triton", "matplotlib", "sklearn", "specdec_utils.core", "specdec_utils.tools")


def test_import_specdec_utils_is_light():
    code = "import json, sys; import specdec_utils; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    heavy = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert not heavy, f"`import specdec_utils` imported {heavy}"


def test_every_public_name_resolves():
    assert len(set(specdec_utils.__all__)) == len(specdec_utils.__all__) == 19
    for name in specdec_utils.__all__:
        assert getattr(specdec_utils, name) is not None, name
    assert set(specdec_utils.__all__) <= set(dir(specdec_utils))
    from specdec_utils import generate
    from specdec_utils.core.methods import generate as original
    assert generate is original
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        specdec_utils.not_a_name  # noqa: B018


def test_the_bench_alias_is_the_tools_module():
    from specdec_utils import bench
    from specdec_utils.tools import bench as tools_bench
    assert bench is tools_bench
    out = subprocess.run([sys.executable, "-m", "specdec_utils.bench", "--help"], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr


def test_specdec_repo_points_a_plain_install_at_the_checkout(tmp_path):
    code = "from specdec_utils import utils; print(utils.REPO_ROOT, utils.DATA_DIR)"
    env = {**os.environ, "SPECDEC_REPO": str(tmp_path), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(tmp_path.resolve()), str(tmp_path.resolve() / "data")]


def test_without_data_the_first_use_says_how_to_find_it(monkeypatch, tmp_path):
    from specdec_utils import models, utils
    from specdec_utils.core.medusa import load_heads
    assert utils.require_data() == REPO_ROOT / "data"  # this checkout (an editable install)
    monkeypatch.setattr(utils, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(utils, "DATA_DIR", tmp_path / "data")
    advice = r"data/ folder and found none in .* \(`pip install -e \.`\) or set SPECDEC_REPO"
    for use in (utils.require_data, lambda: models.load_model("draft-s"), lambda: load_heads("medusa-heads", None)):
        with pytest.raises(FileNotFoundError, match=advice) as err:
            use()
        assert "\n" not in str(err.value)


@pytest.mark.slow
def test_a_plain_wheel_holds_every_subpackage(tmp_path):
    """`pip wheel .` (what a plain `pip install .` builds), from a copy of the sources so that the build leaves no
    build/ or egg-info in the checkout; offline: setuptools comes from the environment (--no-build-isolation)."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    shutil.copytree(PACKAGE, source / "specdec_utils", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    wheel, = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in ("specdec_utils/__init__.py", "specdec_utils/core/engine.py", "specdec_utils/tools/bench.py"):
        assert path in names, f"{path} missing from {wheel.name}"
    assert not any(n.startswith(("tests/", "notebooks/", "data/")) for n in names)
