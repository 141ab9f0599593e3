"""Checkpointing of training state with Orbax, and the restore policy of a resumed run (:func:`restore_common`).

Typed PRNG keys (``jax.random.key``) are not supported well by Orbax; callers
store the raw ``uint32`` key data instead and rebuild the key on restore::

    state = {"params": ..., "step": 10, "rng": jax.random.key_data(key)}
    ...
    key = jax.random.wrap_key_data(restored["rng"])
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import sys
import time
from typing import Any, Iterator

import jax
import orbax.checkpoint as ocp

from attn_lab.checks import RunError, describe

CORRUPT = ".corrupt-"  # '<step>.corrupt-<time>': a step set aside; orbax lists only integer names, so it is ignored


def _abandoned_read(error: BaseException | None, obj: Any) -> bool:
    """Whether an unraisable error (or an unretrieved future's) is a read a failed restore left behind: its
    callback hit orbax's closed event loop, or orbax's array-read coroutine failed after nobody awaited it."""
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
        return True
    code = getattr(obj, "cr_code", None)
    return (code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename) or (
        error is not None and str(error).startswith("Encountered error while reading array index"))


class _AbandonedReads(logging.Filter):
    """asyncio's 'exception was never retrieved' log records of abandoned reads (see :func:`_abandoned_read`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else getattr(record, "exception", None)
        future = record.args.get("future") if isinstance(record.args, dict) else None
        if error is None and future is not None and future.done() and not future.cancelled():
            error = future.exception()
        return not ("never retrieved" in str(record.msg) and _abandoned_read(error, None))


def _drop_abandoned_reads() -> None:
    """A failed restore leaves TensorStore reads in flight; when they complete, Python prints each as an unraisable
    traceback (their callbacks hit orbax's closed event loop, or the read coroutine fails with nobody waiting) and
    asyncio logs their futures' exceptions -- thousands of lines, up to a second after the one-line report. From the
    first restore attempt on, those and only those are dropped; every other unraisable error still goes to the
    previous hook, every other log record to its handlers."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_abandoned_reads", False):
        return

    def hook(unraisable: Any) -> None:
        if not _abandoned_read(unraisable.exc_value, unraisable.object):
            previous(unraisable)

    hook.drops_abandoned_reads = True
    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(_AbandonedReads())


class CheckpointError(RunError):
    """No checkpoint a run could resume from is intact."""


class ResumeError(RunError):
    """The seeds' checkpoints share no step to resume from (their folders were edited by hand)."""


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Orbax and its async readers log every failed array of an unreadable checkpoint (hundreds of lines); the
    caller reports the failure in one line instead, so their loggers are muted for the attempt."""
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio", "orbax", "jax")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class Checkpointer:
    """Orbax ``CheckpointManager`` wrapper: synchronous atomic saves, keep the last N.

    Atomicity: Orbax writes each step into a temporary directory and renames
    it to its final name only once every file is written, and only finalised
    steps are listed. A crash mid-save therefore leaves the previous
    checkpoint restorable; the stray temp dir is removed the next time a
    ``Checkpointer`` is opened on the directory.
    """

    def __init__(self, directory: str, max_to_keep: int = 2) -> None:
        """Open (or create) a checkpoint directory.

        Args:
            directory: Where step subdirectories (``<directory>/<step>``) live;
                made absolute because Orbax requires absolute paths.
            max_to_keep: Number of most recent steps kept on disk; older ones
                are deleted after each successful save to bound disk usage.
        """
        self._manager = ocp.CheckpointManager(
            pathlib.Path(directory).absolute(),
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                create=True,
                # Saves block so that a later crash cannot catch one half-written.
                enable_async_checkpointing=False,
                # Remove temp dirs left behind by a save that was interrupted.
                cleanup_tmp_directories=True,
            ),
        )

    @property
    def directory(self) -> str:
        return str(self._manager.directory)

    def reload(self) -> None:
        """Lists the steps on disk again (another process set one aside)."""
        self._manager.reload()

    def latest_step(self) -> int | None:
        """Return the newest fully written step, or None if there is none (fresh run)."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Return all fully written steps on disk, ascending."""
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any) -> None:
        """Write ``state`` as checkpoint ``step`` and block until it is on disk.

        Args:
            step: Training step; names the checkpoint subdirectory.
            state: Pytree (nested dicts) of jax/numpy arrays and Python
                scalars. PRNG keys must be raw ``jax.random.key_data``.
        """
        self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self._manager.wait_until_finished()

    def restore(self, state_like: Any, step: int | None = None) -> Any:
        """Read a checkpoint into the structure of ``state_like``.

        Args:
            state_like: Pytree with the same structure as the saved state;
                its leaves (concrete arrays or ``jax.ShapeDtypeStruct``) give
                the shapes/dtypes (and shardings) to restore into.
            step: Step to restore; defaults to the latest one.

        Returns:
            A pytree with the structure of ``state_like`` holding the saved values.

        Raises:
            FileNotFoundError: If there is no checkpoint to restore.
        """
        if step is None:
            step = self.latest_step()
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self._manager.directory}")
        return self._manager.restore(step, args=ocp.args.StandardRestore(state_like))

    def try_restore(self, state_like: Any, step: int) -> tuple[Any, str | None]:
        """:meth:`restore` that reports a checkpoint it cannot read instead of raising.

        Returns:
            ``(state, None)``, or ``(None, reason)`` with ``reason`` = ``'<ExceptionName>: <first line>'`` when the
            step is unreadable (a truncated or missing file, a torn metadata file, a shape mismatch).
        """
        _drop_abandoned_reads()
        try:
            with _quiet():
                return self.restore(state_like, step), None
        except Exception as e:  # noqa: BLE001 (orbax and tensorstore raise many kinds; all mean 'unreadable')
            while e.__cause__ is not None:  # orbax wraps the reader's error ("see full TensorStore details")
                e = e.__cause__
            return None, describe(e)

    def set_aside(self, step: int) -> str:
        """Renames step ``step`` to ``<step>.corrupt-<time>`` and forgets it: never deleted, no longer listed, and
        a later save of the same step does not collide with it. Returns the new folder's name."""
        folder = pathlib.Path(self._manager.directory) / str(step)
        name = f"{step}{CORRUPT}{time.strftime('%Y%m%d-%H%M%S')}"
        os.rename(folder, folder.with_name(name))
        self._manager.reload()
        return name

    def close(self) -> None:
        """Wait for pending work and release Orbax resources (threads)."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def restore_common(ckpts: list[Checkpointer], states: list[dict], main: bool,
                   set_aside: bool = True) -> tuple[list[dict], int]:
    """Each seed's state at the newest step every seed has an intact checkpoint of (seeds save together), or fresh.

    A step some seed cannot read (a truncated or missing file) is set aside as ``<step>.corrupt-<time>`` -- kept,
    never deleted -- with one line saying so, and the run resumes from the next older common step. When no common
    step can be read (all damaged, or a changed config: then every step fails) the run stops with one line and
    nothing is renamed. ``set_aside=False`` (a reader such as the head analysis, which renames nothing in a run
    folder): the unreadable steps stay as they are, named in a ``note:`` line.
    """
    have = [set(c.all_steps()) for c in ckpts]
    if not any(have):
        return states, 0
    common = sorted(set.intersection(*have), reverse=True)
    if not common:
        raise ResumeError(f"the seeds' checkpoints share no step ({[sorted(h) for h in have]}); "
                          "delete the checkpoints folders to start again")
    unreadable: list[tuple[Checkpointer, int, str]] = []
    for step in common:
        attempts = [c.try_restore(s, step) for c, s in zip(ckpts, states)]
        unreadable += [(c, step, reason) for c, (_, reason) in zip(ckpts, attempts) if reason]
        if not any(reason for _, reason in attempts):
            if set_aside:
                _set_aside(unreadable, step, main)
            elif unreadable:
                said = "; ".join(f"checkpoint step {s} in {c.directory} is unreadable ({r})" for c, s, r in unreadable)
                print(f"note: {said}; using step {step}", flush=True)
            return [state for state, _ in attempts], step
    found = "; ".join(f"step {s} in {c.directory}: {reason}" for c, s, reason in unreadable)
    raise CheckpointError(f"no checkpoint to {'resume' if set_aside else 'restore'} from can be read ({found}): "
                          "damaged, or written with another config; move the checkpoints folder away to start again")


def _set_aside(unreadable: list[tuple[Checkpointer, int, str]], step: int, main: bool) -> None:
    """Renames the unreadable steps (process 0; the others list the folder again once it has) and says so."""
    for ckpt, bad, reason in unreadable:
        if main:
            name = ckpt.set_aside(bad)
            print(f"checkpoint step {bad} in {ckpt.directory} is unreadable ({reason}); set aside as {name}, "
                  f"resuming from step {step}", flush=True)
    if unreadable and jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("attn_lab_set_aside")
        for ckpt, _, _ in unreadable:
            ckpt.reload()
