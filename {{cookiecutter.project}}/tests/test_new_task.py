"""`make new-task NAME=...` (new_task.py) on a copy of this project: the files it writes from
tasks/_skeleton/, the task they make (found by folder, its configs loading, its sample data
written), and the names it refuses, in one line and without writing anything."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PROJECT

PACKAGE = "{{ cookiecutter.package }}"
NAME = "tabular_demo"


def run(copy: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True, timeout=300)


def files_under(root: Path) -> set[str]:
    return {
        str(path.relative_to(root)) for path in root.rglob("*") if path.is_file() and "__pycache__" not in path.parts
    }


@pytest.fixture
def copy(tmp_path) -> Path:
    """This project's sources, configs and tests, copied: new_task writes into the copy's package."""
    for part in ("src", "configs", "tests"):
        shutil.copytree(PROJECT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_new_task_writes_the_skeleton_under_its_name_and_the_task_loads(copy):
    skeleton = copy / "src" / PACKAGE / "tasks" / "_skeleton"
    before = files_under(copy)
    done = run(copy, "-m", f"{PACKAGE}.new_task", NAME)
    assert done.returncode == 0, done.stderr
    written = files_under(copy) - before
    expected = {f"configs/{NAME}/{name}.yaml" for name in ("base", "local", "tpu", "pod")}
    expected |= {f"tests/test_task_{NAME}.py"}
    expected |= {
        f"src/{PACKAGE}/tasks/{NAME}/{path}"
        for path in files_under(skeleton)
        if not path.startswith("configs/") and path != "test_task.py"
    }
    assert written == expected, written ^ expected
    assert files_under(copy) - written == before  # nothing else changed or went
    for path in written:
        text = (copy / path).read_text()
        assert "__task__" not in text, path
    assert f"from {PACKAGE}.tasks.{NAME} import TASK" in (copy / f"tests/test_task_{NAME}.py").read_text()
    assert [line for line in done.stdout.splitlines() if line.startswith("wrote ")] == [
        f"wrote {path}" for path in sorted(written)
    ]
    assert f"task {NAME} added" in done.stdout and f"CONFIG=configs/{NAME}/local.yaml" in done.stdout

    # Found by folder: its config names it, and its sample data is written from it.
    probe = (
        f"from {PACKAGE} import tasks; from {PACKAGE}.core import config; "
        f"print(sorted(tasks.available())); cfg = config.load('configs/{NAME}/local.yaml', registry=tasks); "
        "print(tasks.load(cfg.task).name, cfg.data.raw)"
    )
    loaded = run(copy, "-c", probe)
    assert loaded.returncode == 0, loaded.stderr
    available, named = loaded.stdout.splitlines()
    assert NAME in available and named.split()[0] == NAME, loaded.stdout
    sample = run(
        copy,
        "-m",
        f"{PACKAGE}.sample_data",
        "--config",
        f"configs/{NAME}/local.yaml",
        "--output",
        str(copy / "raw"),
        "--small",
    )
    assert sample.returncode == 0 and files_under(copy / "raw"), sample.stderr

    again = run(copy, "-m", f"{PACKAGE}.new_task", NAME)
    assert again.returncode == 2 and again.stderr.startswith(f"error: NAME={NAME} is taken"), again.stderr
    assert len(again.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "error: no task name given"),
        (("Tabular",), "error: NAME='Tabular' is not a valid task name"),
        (("class",), "error: NAME='class' is not a valid task name"),
        (("9lives",), "is not a valid task name"),
        (("{{ cookiecutter.task }}",), "error: NAME={{ cookiecutter.task }} is taken"),
    ],
)
def test_new_task_refuses_a_bad_or_taken_name_in_one_line_writing_nothing(copy, args, message):
    before = files_under(copy)
    refused = run(copy, "-m", f"{PACKAGE}.new_task", *args)
    assert refused.returncode == 2 and message in refused.stderr and len(refused.stderr.splitlines()) == 1, refused
    assert files_under(copy) == before
