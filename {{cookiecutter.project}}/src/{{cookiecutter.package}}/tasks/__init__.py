"""The tasks of this project, by name: a command loads the one its config names (`load(cfg.task)`)
and hands it to the shared core, which takes the task as an argument and imports nothing from here.

A task is a package here whose `TASK` implements the contract in ../core/task.py; `make new-task
NAME=...` adds one. A config names the task it trains (its `task:` key); without one, the task this
project was generated with (`DEFAULT`). Config loading reads the task's keys through this module,
which the command passes to it (core/config.py's `registry`).
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

DEFAULT = "{{ cookiecutter.task }}"


def available() -> list[str]:
    """The names of the task packages in this project (folders here with a task.py)."""
    return sorted(
        {
            folder.name
            for here in __path__
            for folder in Path(here).iterdir()
            if folder.is_dir() and (folder / "task.py").is_file() and not folder.name.startswith(("_", "."))
        }
    )


def load(name: str, where: str = ""):
    """The `Task` object of the task package `name`. A name that is not a task here is a one-line
    UserError (`where` says where it was named, e.g. `in configs/local.yaml`); so is a package that
    does not fulfil the contract (a required member left out, no `TASK`), naming what it lacks and
    where, at load: not minutes later, when the core first calls what is missing; and so is one that
    defines a member the core no longer calls (a name of the contract's first edition), saying what it
    became, or a member without a parameter the core passes it (parse_batch's `seed`)."""
    if name not in available():
        from ..core.errors import UserError

        raise UserError(
            f"task '{name}'{f' {where}' if where else ''} is not a task of this project; the tasks here are "
            f"{', '.join(available())} (packages under src/{__package__.split('.')[0]}/tasks/; "
            "`make new-task NAME=...` adds one)"
        )
    return _load(name)


@functools.lru_cache(maxsize=None)
def _load(name: str):
    """The `Task` object of the task package `name` (one of `available()`), loaded once."""
    from ..core.errors import UserError
    from ..core.task import IncompleteTask, Task

    contract = f"see Task in {_shown(Path(__file__).parent.parent / 'core' / 'task.py')}"
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except IncompleteTask as error:  # a member left out, or one the core no longer calls (OutdatedTask)
        raise UserError(
            f"task '{name}' ({_shown(error.task_file)}) {error.problem}; {contract} for what each must return"
        ) from None
    except ModuleNotFoundError as error:
        if error.name is None or error.name == f"{__name__}.{name}":
            raise
        package = __name__.split(".")[0]
        if error.name.split(".")[0] == package:  # a module of this project that this bake does not have
            raise UserError(
                f"task '{name}' imports {error.name}, which this project does not have (its shared task code "
                f"is under src/{package}/tasks/: text/ and classification.py); check the import's spelling, "
                f"or add the module at src/{error.name.replace('.', '/')}.py"
            ) from None
        raise UserError(
            f"task '{name}' imports {error.name}, which is not installed; add its distribution to "
            "requirements.txt and run `make setup`"
        ) from None
    task = getattr(module, "TASK", None)
    if not isinstance(task, Task):
        raise UserError(
            f"task '{name}' ({_shown(module.__file__)}) has no TASK: its package must set TASK to an "
            f"instance of its Task subclass (e.g. `from .task import TASK`); {contract}"
        )
    return task


def _shown(path: Path | str) -> str:
    """`path` as a user finds it: relative to the project when it lies inside it."""
    project = Path(__file__).resolve().parents[3]  # <project>/src/<package>/tasks/__init__.py
    try:
        return str(Path(path).resolve().relative_to(project))
    except ValueError:
        return str(path)
