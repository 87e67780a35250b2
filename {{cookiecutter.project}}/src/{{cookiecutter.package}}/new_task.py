"""Adds a working task to this project (`make new-task NAME=... [FROM=task]`).

    python -m {{ cookiecutter.package }}.new_task NAME [--from TASK]

Writes src/{{ cookiecutter.package }}/tasks/NAME/, configs/NAME/ and tests/test_task_NAME.py.
Without --from, from tasks/_skeleton/: every contract method, documented, with a toy regression on
generated CSV rows, and a README.md that is the checklist of what to replace. With --from TASK, a copy
of a task this project has (its package, its tests, and its configs with NAME's own data and run
folders): the starting point for a variant of it (another objective on the same data, say), renamed
throughout so that the two train side by side; configs/NAME/base.yaml holds only what differs from
TASK's base config, so a change there reaches both. Either passes the contract tests as written.
Nothing else in the project changes: tasks are found by folder.
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from pathlib import Path
from typing import Sequence

import yaml

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


# The config keys that name where a task's files go: a copied task gets its own (NAME inserted), so
# that its data and runs never overwrite the task it was copied from.
PATH_KEYS = {"data": ("raw", "dir"), "runtime": ("output_dir",)}


def check_source(source: str, name: str) -> None:
    if source == name or source not in tasks.available():
        raise UserError(
            f"FROM={source} is not a task of this project to copy; the tasks here are "
            f"{', '.join(tasks.available())} (a shipped task this project was not generated with comes with a "
            "project generated for it: cookiecutter ... task=<task>)"
        )


def source_configs(source: str, project: Path) -> tuple[dict[str, Path], bool]:
    """({file name: path} of the source task's configs, whether they are the project's own at configs/
    (the task it was generated with) rather than in configs/<source>/)."""
    folder = project / "configs" / source
    if folder.is_dir():
        return {path.name: path for path in sorted(folder.glob("*.yaml"))}, False
    return {path.name: path for path in sorted((project / "configs").glob("*.yaml"))}, True


def own_path(value: str, name: str) -> str:
    """`value` (a folder of data or runs) with `name` inserted before its last part: runs/local ->
    runs/NAME/local, gs://bucket/tfrecords -> gs://bucket/NAME/tfrecords; a value with a part named
    `name` already (data/NAME/raw) as it is."""
    if name in value.split("/"):
        return value
    head, _, last = value.rstrip("/").rpartition("/")
    if not head or head.endswith(":/"):  # a bare folder name, or gs://bucket itself
        return f"{value.rstrip('/')}/{name}" if head else f"{name}/{last}"
    return f"{head}/{name}/{last}"


def with_own_paths(text: str, name: str) -> str:
    """A config file's text with the values of PATH_KEYS given NAME's own folders (`own_path`); its
    comments and every other line as they were."""
    lines, section = [], None
    for line in text.splitlines(keepends=True):
        top = re.match(r"([a-z_]+):", line)
        if top:
            section = top.group(1)
        key = re.match(r"(\s+)([a-z_]+):(\s*)([^\s#]+)(.*)", line, re.DOTALL)
        if key and not top and key.group(2) in PATH_KEYS.get(section, ()):
            indent, field, space, value, rest = key.groups()
            line = f"{indent}{field}:{space}{own_path(value, name)}{rest}"
        lines.append(line)
    return "".join(lines)


def renamed(text: str, source: str, name: str) -> str:
    """`text` with the task's name as a whole word (a module path, its `name`) made NAME."""
    return re.sub(rf"(?<![A-Za-z0-9_]){re.escape(source)}(?![A-Za-z0-9_])", name, text)


def copy_plan(name: str, source: str, project: Path = PROJECT) -> dict[Path, str]:
    """Destination -> text of every file a copy of `source` under `name` gets (see the module)."""
    files: dict[Path, str] = {}
    package = PACKAGE_DIR / "tasks" / source
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            text = path.read_text()
            files[PACKAGE_DIR / "tasks" / name / path.relative_to(package)] = renamed(text, source, name)
    test = project / "tests" / f"test_task_{source}.py"
    if test.is_file():
        files[project / "tests" / f"test_task_{name}.py"] = renamed(test.read_text(), source, name)
    configs, own = source_configs(source, project)
    for file_name, path in configs.items():
        text = path.read_text()
        if own and file_name == "base.yaml":
            text = base_delta(text, source, name)
        else:
            text = with_own_paths(text if own else renamed(text, source, name), name)
        files[project / "configs" / name / file_name] = text
    return files


def base_delta(base: str, source: str, name: str) -> str:
    """configs/NAME/base.yaml for a copy of the project's own task: the project's base config with
    only the task and its folders changed."""
    lines = [
        f"# {name}: a copy of {source} (`make new-task NAME={name} FROM={source}`), with its own data and runs.",
        "# Every other key is the base config's: a change there reaches both tasks.",
        "extends: ../base.yaml",
        f"task: {name}",
    ]
    keys = yaml.safe_load(base)
    for section, names in PATH_KEYS.items():
        values = [(key, value) for key, value in (keys.get(section) or {}).items() if key in names and value]
        if values:
            lines += [f"{section}:", *(f"  {key}: {own_path(str(value), name)}" for key, value in values)]
    return "\n".join(lines) + "\n"


def create_from(name: str, source: str, project: Path = PROJECT) -> list[Path]:
    check_name(name)
    check_source(source, name)
    files = copy_plan(name, source, project)
    existing = [destination for destination in files if destination.exists()]
    if existing:
        raise UserError(f"{existing[0]} exists already; remove it or pick another NAME")
    for destination, text in files.items():
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(text)
    return sorted(files)


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
    parser.add_argument("--from", dest="source", default="", help="a task of this project to copy, not the skeleton")
    args = parser.parse_args(argv)
    if not args.name:
        raise UserError("no task name given; run `make new-task NAME=<name>`, e.g. NAME=tabular_regression")
    written = create_from(args.name, args.source) if args.source else create(args.name)
    for path in written:
        print(f"wrote {path.relative_to(PROJECT)}")
    what = (
        f"then change what is to differ from {args.source}"
        if args.source
        else f"then replace its TOY parts (src/{PACKAGE_DIR.name}/tasks/{args.name}/README.md is the checklist)"
    )
    print(f"task {args.name} added. Try it: make data preprocess train CONFIG=configs/{args.name}/local.yaml; {what}")
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
