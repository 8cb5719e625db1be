"""Tests of the package's shape: no import cycle among the modules of specdec_utils and the lab (specdec_lab), the
learner's package never importing the lab, a light `import specdec_utils`, a `generate` that imports only the method
it runs, the old bench path's one-line pointer to the lab, and a plain (non-editable) wheel that holds every
subpackage."""
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
LAB = REPO_ROOT / "specdec_lab"  # the lab beside it: imports specdec_utils, never imported by it

# Edges (importer, imported) left in a cycle on purpose, each with its reason. Keep it empty.
KNOWN_CYCLE_EDGES: dict[tuple[str, str], str] = {}


def module_name(path: Path, root: Path = REPO_ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (never run, so no edge)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped |= {id(n) for n in ast.walk(child)}
    return skipped


def imported_names(tree: ast.AST, name: str, is_package: bool):
    """(node, absolute dotted name) for every import in `tree`, the source of module `name`: module level or inside a
    function, relative ones resolved; `from X import a, b` gives X.a and X.b (each a module or a name of X)."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                yield node, f"{base}.{alias.name}"


def import_graph(packages=(PACKAGE, LAB)) -> dict[str, set[str]]:
    """importer -> the modules of `packages` it imports, at module level or inside a function, relative or absolute.
    `from X import name` points at X.name when that is a module, else at X."""
    files = {module_name(p): p for package in packages for p in sorted(package.rglob("*.py"))}
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
        for node, dotted in imported_names(tree, name, path.name == "__init__.py"):
            if id(node) in skipped:
                continue
            target = dotted if dotted in files else known(dotted if isinstance(node, ast.Import)
                                                          else dotted.rpartition(".")[0])
            if target is not None and target != name:
                graph[name].add(target)
    return graph


def lab_imports(package: Path = PACKAGE, root: Path = REPO_ROOT) -> list[str]:
    """"file:line name" for every import of specdec_lab in `package` (any depth, any level, inside functions and
    under TYPE_CHECKING too, and `importlib.import_module` / `__import__` of a literal name)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        names = [(node, dotted) for node, dotted in imported_names(tree, module_name(path, root),
                                                                    path.name == "__init__.py")]
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and ast.unparse(node.func) in ("importlib.import_module", "import_module",
                                                                          "__import__")
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                names.append((node, node.args[0].value))
        found += [f"{path.relative_to(root)}:{node.lineno} {dotted}" for node, dotted in names
                  if dotted == "specdec_lab" or dotted.startswith("specdec_lab.")]
    return found


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
    assert "specdec_utils.core.stop_head" in graph["specdec_utils.core.policies"]      # inside a function
    assert "specdec_utils.core.methods" in graph["specdec_lab.bench"]  # from specdec_utils.core import methods as ...
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_the_package_modules():
    graph = import_graph()
    for (importer, imported), reason in KNOWN_CYCLE_EDGES.items():
        assert imported in graph[importer], f"stale entry in KNOWN_CYCLE_EDGES ({reason}): {importer} -> {imported}"
        graph[importer].discard(imported)
    found = cycles(graph)
    detail = "; ".join(" <-> ".join(c) + " (" + ", ".join(f"{a}->{b}" for a in c for b in sorted(graph[a]) if b in c)
                       + ")" for c in found)
    assert not found, f"import cycles among the modules of specdec_utils and specdec_lab: {detail}"
    assert any(name.startswith("specdec_lab.") for name in graph)  # the lab is in the graph


def test_the_learners_package_never_imports_the_lab():
    """specdec_lab imports specdec_utils; no module of specdec_utils imports specdec_lab, at any depth or level."""
    found = lab_imports()
    assert not found, f"specdec_utils imports the lab: {'; '.join(found)}"
    graph = import_graph()
    users = [name for name in graph if name.startswith("specdec_lab.")
             and any(t.startswith("specdec_utils.") for t in graph[name])]
    assert LAB.is_dir() and len(users) > 5, f"specdec_lab should import specdec_utils, found {users}"


def test_the_lab_import_check_sees_every_form(tmp_path):
    package = tmp_path / "specdec_utils"
    (package / "core").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "core" / "__init__.py").write_text("")
    (package / "core" / "a.py").write_text("import os\nfrom . import b\n\n\ndef f():\n    import specdec_lab.bench\n")
    (package / "core" / "b.py").write_text("def g():\n    from specdec_lab import bench\n")
    (package / "c.py").write_text("import importlib\nimportlib.import_module('specdec_lab.leaderboard')\n")
    assert lab_imports(package, tmp_path) == ["specdec_utils/c.py:2 specdec_lab.leaderboard",
                                              "specdec_utils/core/a.py:6 specdec_lab.bench",
                                              "specdec_utils/core/b.py:2 specdec_lab.bench"]


def test_tree_is_pure_structure():
    """tree.py builds and masks trees; running a model on one (runner) or editing a cache (kv_cache) lives elsewhere."""
    assert not {"specdec_utils.core.runner", "specdec_utils.core.tree_attention", "specdec_utils.core.kv_cache",
                "specdec_utils.core.static_cache"} & import_graph()["specdec_utils.core.tree"]


HEAVY = ("torch", "transformers", "triton", "matplotlib", "sklearn", "specdec_utils.core", "specdec_lab")


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


def test_the_old_bench_path_names_the_lab():
    """specdec_utils.bench moved to specdec_lab.bench: importing the old path raises ImportError naming the new one
    (importing no lab module), and `python -m specdec_utils.bench ...` prints one line naming
    `python -m specdec_lab.bench` (with the arguments given) and exits 2."""
    code = ("import sys\n"
            "for form in ('import specdec_utils.bench', 'from specdec_utils import bench'):\n"
            "    try:\n"
            "        exec(form)\n"
            "    except ImportError as err:\n"
            "        print(type(err).__name__, err)\n"
            "    else:\n"
            "        print('imported')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'specdec_lab'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    *errors, lab = out.stdout.splitlines()
    assert len(errors) == 2 and all(e.startswith("ImportError ") and "specdec_lab.bench" in e for e in errors), errors
    assert lab == "[]", f"the old bench path imported the lab: {lab}"
    out = subprocess.run([sys.executable, "-m", "specdec_utils.bench", "--methods", "ar"], capture_output=True,
                         text=True, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 2 and out.stdout == "", (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "python -m specdec_lab.bench --methods ar" in lines[0], out.stderr


# What `generate` with the draft model must leave unimported: the other method families, the Triton kernels, the lab
NOT_FOR_DRAFT = ("specdec_utils.core.eagle", "specdec_utils.core.block", "specdec_utils.core.medusa",
                 "specdec_utils.core.hierarchy", "specdec_utils.core.tree_drafting", "specdec_utils.core.ngram",
                 "specdec_utils.core.tree_attention", "specdec_utils.core.plain_llama",
                 "specdec_utils.core.device_loop", "specdec_lab")

# Run in a fresh interpreter. Triton itself is in sys.modules whatever this package does (transformers imports
# torch._dynamo, which probes it), so the script records every `import triton...` statement and who ran it: none of
# them may come from specdec_utils. The last step imports the kernels' module, which must show up (the recorder
# works), as must EAGLE once an `eagle` run asks for it.
IMPORTS_OF_A_DRAFT_RUN = r"""
import builtins, json, sys
asked = []
_import = builtins.__import__
def recording_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and name.split(".")[0] == "triton":
        asked.append((globals or {}).get("__name__"))
    return _import(name, globals, locals, fromlist, level)
builtins.__import__ = recording_import

def ours():
    return sorted(m for m in sys.modules if m.split(".")[0] in ("specdec_utils", "specdec_lab"))

def triton_askers():
    return sorted({str(m) for m in asked if str(m).split(".")[0] in ("specdec_utils", "specdec_lab")})

import torch
from specdec_utils import generate
report = {"import": ours()}
from specdec_utils.models import tiny_model
target = tiny_model("tiny-llama", vocab_size=64, seed=0).eval()
draft = tiny_model("tiny-llama", vocab_size=64, seed=1).eval()
ids = torch.tensor([[5, 6, 7, 8]])
result = generate(target, ids, 6, method="draft", draft=draft)
reference = generate(target, ids, 6, method="ar")
report.update(draft=ours(), draft_triton=triton_askers(), same_as_ar=result.new_token_ids == reference.new_token_ids,
              drafted=result.drafted)
try:
    generate(target, ids, 6, method="eagle", eagle=object())
except ValueError as err:
    report["eagle_error"] = str(err)
report["eagle"] = ours()
from specdec_utils.core.eagle import eagle_head_for
result = generate(target, ids, 6, method="eagle", eagle=eagle_head_for(target, seed=0))
report["eagle_same_as_ar"] = result.new_token_ids == reference.new_token_ids
import specdec_utils.core.tree_attention
report["kernels_triton"] = triton_askers()
print(json.dumps(report))
"""


def test_generate_with_the_draft_model_imports_no_other_method():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", IMPORTS_OF_A_DRAFT_RUN], capture_output=True, text=True,
                         cwd=REPO_ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.splitlines()[-1])

    def loaded(stage):
        return [m for m in report[stage] if any(m == n or m.startswith(n + ".") for n in NOT_FOR_DRAFT)]

    assert not loaded("import"), f"`from specdec_utils import generate` imported {loaded('import')}"
    assert not loaded("draft"), f"generate(method='draft') imported {loaded('draft')}; all: {report['draft']}"
    assert report["draft_triton"] == [], f"modules of specdec_utils imported triton: {report['draft_triton']}"
    assert report["same_as_ar"] and report["drafted"] > 0
    # not vacuous: an eagle run imports EAGLE (and runs), the kernels' module imports triton (and is seen doing it)
    assert "needs eagle=... an EAGLE head" in report["eagle_error"]
    assert "specdec_utils.core.eagle" in report["eagle"] and "specdec_utils.core.block" not in report["eagle"]
    assert report["eagle_same_as_ar"]
    assert "specdec_utils.core.tree_attention" in report["kernels_triton"], report["kernels_triton"]


def test_the_triton_backends_come_with_their_module():
    """Importing tree_attention registers its transformers backends: a model can switch to one at once."""
    code = ("from specdec_utils.core import tree_attention as ta\n"
            "from specdec_utils.models import tiny_model\n"
            "model = tiny_model('tiny-llama', vocab_size=64)\n"
            "assert ta.AVAILABLE, ta.WHY\n"
            "for name in ta.BACKENDS:\n"
            "    model.set_attn_implementation(name)\n"
            "    print(model.config._attn_implementation)\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["tree_triton", "tree_triton_masked"]


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
    for package in (PACKAGE, LAB):
        shutil.copytree(package, source / package.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    wheel, = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in ("specdec_utils/__init__.py", "specdec_utils/core/engine.py", "specdec_lab/bench.py"):
        assert path in names, f"{path} missing from {wheel.name}"
    assert not any(n.startswith(("tests/", "notebooks/", "data/")) for n in names)
