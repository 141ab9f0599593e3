"""Ctrl-C, SIGTERM and a dead parent stop a command cleanly: one line, exit 130 / 143, nothing half written.

:func:`install` (every entry point, :func:`attn_lab.cli.run_entry_point`) turns SIGINT and SIGTERM into
:class:`Interrupted`, raised in the main thread where the command is. Code that must finish a step before it stops
(the training loop: it checkpoints first) runs inside :func:`deferred`; there a signal only sets a flag that it polls
with :func:`requested`.

A process started by a sweep (``ATTN_LAB_PARENT_PID`` in its environment) watches its parent: when the parent dies
-- even by SIGKILL, which it cannot catch -- the child sends itself SIGTERM, so a trial never runs on orphaned.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Iterator

PARENT_ENV = "ATTN_LAB_PARENT_PID"
NAMES = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived (a BaseException, like KeyboardInterrupt: no ``except Exception`` swallows it)."""

    def __init__(self, signum: int, step: int | None = None):
        super().__init__(NAMES.get(signum, f"signal {signum}"))
        self.signum, self.step = signum, step

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # 130 for SIGINT, 143 for SIGTERM, as a shell reports them


_state = {"signum": None, "deferred": 0}


def _handler(signum: int, frame: object) -> None:
    """Raises :class:`Interrupted`; inside :func:`deferred` only the first signal waits for the safe point (a
    second one, e.g. Ctrl-C pressed twice, raises at once: what is on disk is intact either way)."""
    first = _state["signum"] is None
    _state["signum"] = signum
    if not _state["deferred"] or not first:
        raise Interrupted(signum)


def install() -> None:
    """SIGINT and SIGTERM raise :class:`Interrupted` (main thread only, as Python requires); starts the parent
    watch when a sweep started this process."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in NAMES:
        signal.signal(signum, _handler)
    parent = os.environ.get(PARENT_ENV, "")
    if parent.isdigit():
        threading.Thread(target=_watch_parent, args=(int(parent),), daemon=True, name="parent-watch").start()


def _watch_parent(parent: int, every: float = 0.5) -> None:
    """SIGTERM to this process once its parent is gone (a dead parent's children are adopted: getppid changes)."""
    while True:
        time.sleep(every)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
            return


def requested() -> int | None:
    """The signal that arrived inside :func:`deferred` (None: none)."""
    return _state["signum"]


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside: a signal sets :func:`requested` instead of raising (the caller stops at a safe point). A signal
    that arrived before entering raises at once."""
    if _state["signum"] is not None:
        raise Interrupted(_state["signum"])
    _state["deferred"] += 1
    try:
        yield
    finally:
        _state["deferred"] -= 1
