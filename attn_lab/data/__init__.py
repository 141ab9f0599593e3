"""Offline data for attn_lab: the task registry, TFDS builders, tokenizers, grain pipelines."""

from typing import Any

from attn_lab.data import tasks
from attn_lab.data.tasks import Task, defaults, load_task, task_kind, validate_task_config
from attn_lab.data.tokenizers import Vocab

__all__ = ["TASKS", "TASK_KINDS", "Task", "Vocab", "defaults", "load_task", "task_kind", "validate_task_config"]


def __getattr__(attr: str) -> Any:
    """TASKS and TASK_KINDS are read from the task registry when asked, so later registrations show."""
    if attr in ("TASKS", "TASK_KINDS"):
        return getattr(tasks, attr)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
