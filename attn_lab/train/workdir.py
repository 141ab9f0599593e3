"""A run folder's safety: one process at a time, and a finished run's record never rewritten.

- :class:`WorkdirLock`: ``<workdir>/.lock``, held with ``fcntl.flock`` for as long as a process trains in the folder.
  A second process stops with one line naming the holder. The kernel drops a flock when its process dies, so the lock
  of a killed run is simply free; the holder's pid and host written in the file are for the message only, and a
  non-empty file found free (a holder that never released it) is reported as taken over.
- A finished run (:func:`attn_lab.results.finished_results`) is the facts of that run: no rerun writes its records
  again (the records themselves are :mod:`attn_lab.results`'s).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from typing import Any, Sequence

from attn_lab.checks import RunError

LOCK_FILE = ".lock"
BUSY_EXIT = 75  # EX_TEMPFAIL: python -m attn_lab.train's exit code when another live process holds the folder


class WorkdirBusy(RunError):
    """Another live process holds the workdir's lock."""


def _holder_text(info: dict[str, Any]) -> str:
    return f"pid {info.get('pid', '?')} on host {info.get('host', '?')} (started {info.get('started', '?')})"


def _read_holder(fd: int) -> dict[str, Any]:
    """The holder info in the lock file ({} when empty or unreadable: a torn write says nothing)."""
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        return json.loads(os.read(fd, 4096).decode() or "{}")
    except ValueError:
        return {}


def _alive(info: dict[str, Any]) -> bool:
    """Whether the pid in ``info`` runs on this host (only for filesystems without flock)."""
    if info.get("host") != socket.gethostname() or not isinstance(info.get("pid"), int):
        return False
    try:
        os.kill(info["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        pass
    return info["pid"] != os.getpid()


class WorkdirLock:
    """``<workdir>/.lock`` held by this process (see the module docstring); creates the workdir."""

    def __init__(self, workdir: str, name: str = LOCK_FILE):
        self.workdir, self.name, self.fd = workdir, name, None

    def acquire(self) -> None:
        """Takes the lock or raises :class:`WorkdirBusy`; prints one line when it takes over a stale lock."""
        os.makedirs(self.workdir, exist_ok=True)
        fd = os.open(os.path.join(self.workdir, self.name), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._flock(fd)
            previous = _read_holder(fd)  # read under the lock: stable
        except BaseException:
            os.close(fd)
            raise
        if previous:  # the file was not emptied: its holder ended without releasing (killed, crashed)
            print(f"{self.workdir}: taking over the lock of {_holder_text(previous)}, which is no longer running",
                  flush=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        self.fd = fd

    def probe(self) -> None:
        """Raises :class:`WorkdirBusy` when a live process holds the lock; creates nothing (a missing or free lock
        passes), so a refusal of several folders leaves none of them made or locked."""
        try:
            fd = os.open(os.path.join(self.workdir, self.name), os.O_RDWR)
        except OSError:  # no lock file yet (acquire creates it, and says why if it cannot)
            return
        try:
            self._flock(fd)
        finally:
            os.close(fd)  # drops the probe's flock

    def _flock(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):  # no flock here: trust the pid
                if not _alive(_read_holder(fd)):
                    return
        raise WorkdirBusy(f"workdir {self.workdir} is in use by {_holder_text(_read_holder(fd))}; wait for it to "
                          "finish or stop it") from None

    def release(self) -> None:
        """Empties the file (a clean release) and unlocks; the file stays, so no second inode can be locked."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing drops the flock


def lock_workdirs(workdirs: list[str]) -> list[WorkdirLock]:
    """Locks every folder (a vmapped run writes one per seed), or none: raises the first busy one's line."""
    for workdir in workdirs:  # every busy folder found before any is made or locked
        WorkdirLock(workdir).probe()
    locks: list[WorkdirLock] = []
    try:
        for workdir in workdirs:
            lock = WorkdirLock(workdir)
            lock.acquire()
            locks.append(lock)
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks


SEED_FIELD = "{seed}"  # placeholder in a workdir template: runs/x/seed={seed}


def seed_workdirs(workdir: str, seeds: Sequence[int]) -> list[str]:
    """One folder per seed from a template containing ``{seed}`` (a single seed may use a plain folder)."""
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds has duplicates: {list(seeds)}")
    if SEED_FIELD not in workdir:
        if len(seeds) > 1:
            raise ValueError(f"--workdir {workdir!r} must contain {SEED_FIELD} to train several seeds")
        return [workdir]
    return [workdir.replace(SEED_FIELD, str(s)) for s in seeds]
