"""Adds a working skeleton task to this project (`make new-task NAME=...`).

    python -m {{ cookiecutter.package }}.new_task NAME

Writes src/{{ cookiecutter.package }}/tasks/NAME/ (every contract method, documented, with a toy
regression on generated CSV rows), configs/NAME/{base,local,tpu,pod}.yaml and tests/test_task_NAME.py,
from tasks/_skeleton/. The new task passes the contract tests as written; its README.md is the
checklist of what to replace. Nothing else in the project changes: tasks are found by folder.
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from pathlib import Path
from typing import Sequence

from . import tasks
from .core.errors import UserError, run_cli

PLACEHOLDER = "__task__"
PACKAGE_DIR = Path(__file__).resolve().parent
SKELETON = PACKAGE_DIR / "tasks" / "_skeleton"
PROJECT = PACKAGE_DIR.parents[1]


def check_name(name: str) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise UserError(
            f"NAME={name!r} is not a valid task name: use lowercase letters, digits and underscores, starting "
            "with a letter (it becomes a Python package), e.g. NAME=tabular_regression"
        )
    taken = [path for path in (PACKAGE_DIR / "tasks" / name, PACKAGE_DIR / "tasks" / f"{name}.py") if path.exists()]
    if taken or name in tasks.available():
        raise UserError(
            f"NAME={name} is taken ({taken[0] if taken else 'a task'}); the tasks here are "
            f"{', '.join(tasks.available())}: pick another name"
        )


def plan(name: str, project: Path = PROJECT) -> dict[Path, Path]:
    """Destination -> skeleton source of every file the new task gets."""
    files = {}
    for source in sorted(SKELETON.rglob("*")):
        if not source.is_file() or "__pycache__" in source.parts:
            continue
        relative = source.relative_to(SKELETON)
        if relative.parts[0] == "configs":
            destination = project / "configs" / name / relative.name
        elif relative.name == "test_task.py":
            destination = project / "tests" / f"test_task_{name}.py"
        else:
            destination = PACKAGE_DIR / "tasks" / name / relative
        files[destination] = source
    return files


def create(name: str, project: Path = PROJECT) -> list[Path]:
    check_name(name)
    files = plan(name, project)
    existing = [destination for destination in files if destination.exists()]
    if existing:
        raise UserError(f"{existing[0]} exists already; remove it or pick another NAME")
    for destination, source in files.items():
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(source.read_text().replace(PLACEHOLDER, name))
    return sorted(files)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", nargs="?", help="the new task's name, e.g. tabular_regression")
    args = parser.parse_args(argv)
    if not args.name:
        raise UserError("no task name given; run `make new-task NAME=<name>`, e.g. NAME=tabular_regression")
    written = create(args.name)
    for path in written:
        print(f"wrote {path.relative_to(PROJECT)}")
    print(
        f"task {args.name} added. Try it: make data preprocess train CONFIG=configs/{args.name}/local.yaml; "
        f"then replace its TOY parts (src/{PACKAGE_DIR.name}/tasks/{args.name}/README.md is the checklist)"
    )
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
