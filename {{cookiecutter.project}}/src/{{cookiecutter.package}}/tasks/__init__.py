"""The task this project trains, chosen by name: the shared core reaches it only through `current()`.

A task is a package here whose `TASK` implements the contract in ../task.py. To add one, copy the
existing task's package under a new name, change what differs, and point TASK_NAME at it.
"""

from __future__ import annotations

import functools
import importlib

TASK_NAME = "{{ cookiecutter.task }}"


@functools.lru_cache(maxsize=None)
def current():
    """The `Task` object of TASK_NAME."""
    return importlib.import_module(f"{__name__}.{TASK_NAME}").TASK
