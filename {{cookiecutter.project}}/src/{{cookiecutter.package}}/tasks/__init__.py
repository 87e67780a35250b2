"""The tasks of this project, and the one this process trains: the shared core reaches it only
through `current()`.

A task is a package here whose `TASK` implements the contract in ../task.py; `make new-task
NAME=...` adds one. A config names the task it trains (its `task:` key) and loading it selects
that task; without a config, the task this project was generated with.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

DEFAULT = "{{ cookiecutter.task }}"
_selected = DEFAULT


def available() -> list[str]:
    """The names of the task packages in this project (folders here with a task.py)."""
    here = Path(__file__).parent
    return sorted(
        folder.name
        for folder in here.iterdir()
        if folder.is_dir() and (folder / "task.py").is_file() and not folder.name.startswith(("_", "."))
    )


def select(name: str, where: str = "") -> None:
    """Makes `name` the current task; a name that is not a task here is a one-line UserError."""
    from ..errors import UserError

    global _selected
    if name not in available():
        raise UserError(
            f"task '{name}'{f' {where}' if where else ''} is not a task of this project; the tasks here are "
            f"{', '.join(available())} (packages under src/{__package__.split('.')[0]}/tasks/; "
            "`make new-task NAME=...` adds one)"
        )
    _selected = name


def current():
    """The `Task` object of the selected task."""
    return load(_selected)


@functools.lru_cache(maxsize=None)
def load(name: str):
    """The `Task` object of the task package `name`."""
    return importlib.import_module(f"{__name__}.{name}").TASK
