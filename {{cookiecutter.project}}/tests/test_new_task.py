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


COPY = "copied_demo"


def test_new_task_from_a_task_copies_it_renamed_with_its_own_folders_and_the_copy_loads(copy):
    """FROM=<this project's task>: its package and tests under the new name (nothing else changed in
    them), its configs with the new task's own data and run folders, a base config that holds only what
    differs; the copy loads as its own task and writes its sample data to its own folder."""
    source = "{{ cookiecutter.task }}"
    package = copy / "src" / PACKAGE / "tasks"
    before = files_under(copy)
    done = run(copy, "-m", f"{PACKAGE}.new_task", COPY, "--from", source)
    assert done.returncode == 0, done.stderr
    written = files_under(copy) - before
    configs = {path.name for path in (copy / "configs").glob("*.yaml")}
    expected = {f"configs/{COPY}/{name}" for name in configs} | {f"tests/test_task_{COPY}.py"}
    expected |= {f"src/{PACKAGE}/tasks/{COPY}/{path}" for path in files_under(package / source)}
    assert written == expected, written ^ expected
    assert files_under(copy) - written == before
    for path in files_under(package / source):
        original, copied = (package / source / path).read_text(), (package / COPY / path).read_text()
        assert copied == original.replace(source, COPY), path  # the name, and nothing else, changed
    test = (copy / f"tests/test_task_{COPY}.py").read_text()
    assert test == (copy / f"tests/test_task_{source}.py").read_text().replace(source, COPY)
    assert f"task {COPY} added" in done.stdout and f"differ from {source}" in done.stdout

    probe = (
        f"import dataclasses; from {PACKAGE} import tasks; from {PACKAGE}.core import config\n"
        f"for which in {sorted(name[:-5] for name in configs)!r}:\n"
        f"    cfg = config.load('configs/{COPY}/' + which + '.yaml', registry=tasks)\n"
        "    own = config.load('configs/' + which + '.yaml', registry=tasks)\n"
        "    print(which, tasks.load(cfg.task).name, cfg.data.raw, cfg.data.dir, cfg.runtime.output_dir, "
        "cfg.train == own.train, dataclasses.asdict(cfg.model) == dataclasses.asdict(own.model), own.data.dir, "
        "own.runtime.output_dir)"
    )
    loaded = run(copy, "-c", probe)
    assert loaded.returncode == 0, loaded.stderr
    for line in loaded.stdout.splitlines():
        which, name, raw, data, output, same_train, same_model, own_data, own_output = line.split()
        assert name == COPY and same_train == same_model == "True", line
        # Its own folders: the source's with the name inserted before the last part.
        assert data == own_data.rsplit("/", 1)[0] + f"/{COPY}/" + own_data.rsplit("/", 1)[1], line
        assert output == own_output.rsplit("/", 1)[0] + f"/{COPY}/" + own_output.rsplit("/", 1)[1], line
        assert raw.split("/")[-2] == COPY, line
    base = (copy / f"configs/{COPY}/base.yaml").read_text()
    assert "extends: ../base.yaml" in base and f"task: {COPY}" in base and "train:" not in base


def test_new_task_from_an_added_task_copies_its_configs_folder_renamed(copy):
    """FROM=<a task added with new-task>: its configs/<task>/ copied with the name changed throughout
    (task key, folders), so the copy loads as itself with its own data and runs."""
    assert run(copy, "-m", f"{PACKAGE}.new_task", NAME).returncode == 0
    done = run(copy, "-m", f"{PACKAGE}.new_task", COPY, "--from", NAME)
    assert done.returncode == 0, done.stderr
    names = sorted(path.name for path in (copy / "configs" / NAME).glob("*.yaml"))
    assert sorted(path.name for path in (copy / "configs" / COPY).glob("*.yaml")) == names
    for name in names:
        original = (copy / "configs" / NAME / name).read_text()
        assert (copy / "configs" / COPY / name).read_text() == original.replace(NAME, COPY), name
    probe = (
        f"from {PACKAGE} import tasks; from {PACKAGE}.core import config; "
        f"cfg = config.load('configs/{COPY}/tpu.yaml', registry=tasks); "
        "print(tasks.load(cfg.task).name, cfg.data.raw, cfg.data.dir, cfg.runtime.output_dir)"
    )
    loaded = run(copy, "-c", probe)
    assert loaded.returncode == 0, loaded.stderr
    name, raw, data, output = loaded.stdout.split()
    assert name == COPY and all(f"/{COPY}/" in path and NAME not in path for path in (raw, data, output)), loaded.stdout


def test_own_path_inserts_the_name_before_the_last_part():
    from {{ cookiecutter.package }}.new_task import own_path

    assert own_path("runs/local", "x") == "runs/x/local"
    assert own_path("gs://bucket/tfrecords", "x") == "gs://bucket/x/tfrecords"
    assert own_path("gs://bucket/runs/tpu/", "x") == "gs://bucket/runs/x/tpu"
    assert own_path("gs://bucket", "x") == "gs://bucket/x"
    assert own_path("tfrecords", "x") == "x/tfrecords"
    assert own_path("data/x/raw", "x") == "data/x/raw"  # its own already


@pytest.mark.parametrize(
    "source, message",
    [
        ("no_such_task", "error: FROM=no_such_task is not a task of this project to copy"),
        ("_skeleton", "error: FROM=_skeleton is not a task of this project to copy"),
        (COPY, f"error: FROM={COPY} is not a task of this project to copy"),
    ],
)
def test_new_task_from_refuses_what_is_not_a_task_here_in_one_line_writing_nothing(copy, source, message):
    before = files_under(copy)
    refused = run(copy, "-m", f"{PACKAGE}.new_task", COPY, "--from", source)
    assert refused.returncode == 2 and refused.stderr.startswith(message), refused.stderr
    assert len(refused.stderr.splitlines()) == 1 and files_under(copy) == before
