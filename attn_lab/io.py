"""Files that are either old or new, never half written: the bottom layer every other module may use.

Data preparation, training, sweeps and reporting all write through these (a crash, Ctrl-C or a full disk never
leaves a truncated results.json, table or tokenizer model behind).
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Any


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as JSON so that readers see either the old or the new file.

    The JSON is serialised into a temp file in the *same* directory (so the
    final ``os.replace`` is a same-filesystem atomic rename), flushed and
    fsynced before the rename. A crash or a serialisation error therefore never
    leaves a half-written ``path``, and the temp file is removed on error.

    Args:
        path: Destination file; its directory must exist.
        obj: Any ``json.dump``-able object.
    """
    write_text_atomic(pathlib.Path(path), json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_text_atomic(path: pathlib.Path, text: str) -> None:
    """Temp file in the same directory, fsync, then ``os.replace``: readers see the old or the new file."""
    write_bytes_atomic(path, text.encode("utf-8"))


def _umask() -> int:
    """This process's umask (read without changing it where /proc tells, else set and restored at once)."""
    try:
        with open("/proc/self/status") as f:
            return int(next(line.split()[1] for line in f if line.startswith("Umask:")), 8)
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def _mode(path: pathlib.Path) -> int:
    """A file's mode as ``open(path, 'w')`` leaves it: an existing file keeps its own, a new one gets 0o666 less
    the umask."""
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return 0o666 & ~_umask()


def write_bytes_atomic(path: pathlib.Path, data: bytes) -> None:
    """:func:`write_text_atomic` for bytes, with the mode ``open()`` would leave (:func:`_mode`): mkstemp's temp
    file is owner-only, and a result a collaborator cannot read on shared storage is lost to them."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _mode(path))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
