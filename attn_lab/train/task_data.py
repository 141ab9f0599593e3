"""A run's task data: loaded (prepared the first time) and checked against what the run asks of it, or one line."""

from __future__ import annotations

from typing import Any

from attn_lab.checks import RunError, describe
from attn_lab.data import load_task
from attn_lab.train.parallel import main_process_first

CUT_REFUSED = 0.95  # share of cut training targets at which a generation task cannot learn where to stop


class TaskError(RunError):
    """The task's data cannot be loaded, or its training split is smaller than one batch."""


def load_run_task(config: Any) -> Any:
    """The task's data (prepared the first time), checked against the batch size -- for tasks whose training split
    is only known once loaded (bible, sentiment without a limit, tfds:) -- or a one-line :class:`TaskError`."""
    name = config.task.name
    try:
        task = main_process_first(lambda: load_task(config.task, config.task.data_dir), "attn_lab_data")
    except ValueError as e:  # the data modules' own one-line errors (offline, no such dataset, ...)
        raise TaskError(str(e)) from e
    except Exception as e:  # noqa: BLE001 (preparation fails in many ways: network, disk, a bad source)
        raise TaskError(f"task '{name}': its data could not be loaded ({describe(e)})") from e
    batch, examples = config.train.batch_size, task.num_examples("train")
    if batch > examples:
        raise TaskError(f"train.batch_size={batch} exceeds the training split of task '{name}' ({examples} "
                        "examples); lower it")
    check_targets(task)
    return task


def check_targets(task: Any) -> None:
    """A generation (translation) task whose target limit cuts all or nearly all (>= :data:`CUT_REFUSED`) of its
    training targets is refused in one line: trained on cut targets it never sees an end, so no output can be
    right. A smaller share stays a note at the run's start (:func:`attn_lab.train.announce.cut_notes`)."""
    if task.kind != "translation":
        return
    cut, seen, longest = task.overlong("train").get("max_target_length", (0, 0, 0))
    if seen and cut >= CUT_REFUSED * seen:
        raise TaskError(f"task.max_target_length={task.max_target_length} cuts {cut} of the first {seen} training "
                        f"targets (the longest: {longest} tokens, end of sequence included), so the model could never "
                        f"produce a whole output; raise it to {longest} or more")
