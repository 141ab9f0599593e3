"""Offline data for attn_lab: TFDS builders, tokenizers, grain pipelines."""

from attn_lab.data.tasks import TASK_KINDS, TASKS, Task, load_task, task_kind, validate_task_config
from attn_lab.data.tokenizers import Vocab

__all__ = ["TASKS", "TASK_KINDS", "Task", "Vocab", "load_task", "task_kind", "validate_task_config"]
