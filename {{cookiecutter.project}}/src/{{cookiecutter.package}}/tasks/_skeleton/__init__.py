"""__task__: a new task, from `make new-task` (start from README.md's checklist)."""

from .task import TASK

__all__ = ["TASK"]
