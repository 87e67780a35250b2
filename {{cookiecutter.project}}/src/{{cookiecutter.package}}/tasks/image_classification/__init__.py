from .task import TASK  # noqa: F401
