"""A full disk (or a folder that became unwritable) stops a command in exactly one line.

When a checkpoint write hits ENOSPC, orbax and tensorstore report it from their own threads before the main thread
sees it: an ERROR log record with the traceback per failed write, "Event loop is closed" tracebacks from native
callbacks into the save's finished event loop, and at exit asyncio's "Task exception was never retrieved" per
pending write (about 1,200 lines for one save). :func:`quiet_full_disk` drops the log records that are about a full
disk (the main thread's line says it) and holds the closed-loop tracebacks back until exit, where they are printed
unless the command stopped for a full disk -- so nothing is hidden from any other failure.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import re
import sys
import traceback

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)  # a folder that became unwritable mid-run: the same one line
# A library's wrapped error text -> the errno it stands for (tensorstore and orbax name the OS error in the text).
CODES = {"No space left on device": errno.ENOSPC, "os_error_code='28'": errno.ENOSPC,
         "Disk quota exceeded": errno.EDQUOT, "os_error_code='122'": errno.EDQUOT,
         "Permission denied": errno.EACCES, "os_error_code='13'": errno.EACCES,
         "Read-only file system": errno.EROFS, "os_error_code='30'": errno.EROFS}
MARKS = tuple(CODES)
_state: dict = {"held": [], "stopped": False, "installed": False}


def disk_full_line(full: OSError, saved: str = "nothing written before is lost") -> str:
    """The one line of a command stopped by a full disk (or a folder it can no longer write): the file, the reason,
    what is intact, how to go on."""
    where = f" writing {full.filename}" if full.filename else ""
    if full.errno in UNWRITABLE:
        return (f"error: cannot write {full.filename or 'here'} ({os.strerror(full.errno)}); {saved}: make the folder "
                "writable again and rerun the same command to resume")
    return (f"error: disk full{where} ({os.strerror(full.errno)}); {saved}: free space and rerun the same command "
            "to resume")


def disk_full(error: BaseException) -> OSError | None:
    """The ENOSPC / EDQUOT (or EACCES / EPERM / EROFS: unwritable) OSError in ``error``'s chain of causes (libraries
    wrap it), else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in DISK_FULL + UNWRITABLE:
            return error
        mark = next((m for m in MARKS if m in str(error)), None)
        if mark is not None:  # a library's wrapped error: its text names the file
            code = CODES[mark]
            named = re.search(r'(?:Failed writing|local file): "([^"]+)"', str(error))
            return OSError(code, os.strerror(code), named.group(1) if named else None)
        error = error.__cause__ or error.__context__
    return None


def stop_for_full_disk(line: str) -> None:
    """Exits with ``line`` (status 1), discarding the held tracebacks of the failed writes."""
    _state["stopped"] = True
    _state["held"].clear()
    sys.exit(line)


class _AboutFullDisk(logging.Filter):
    """Drops a library's log record about a write that failed for a full disk (message or attached traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += str(record.exc_info[1])
        return not any(mark in text for mark in MARKS)


def _hold_closed_loop(kind, value, tb, default=sys.excepthook) -> None:
    """A native callback into a finished save's event loop: held until exit; anything else as before."""
    if isinstance(value, RuntimeError) and str(value) == "Event loop is closed":
        _state["held"].append("".join(traceback.format_exception(kind, value, tb)))
        return
    default(kind, value, tb)


def _print_held() -> None:
    if not _state["stopped"]:
        sys.stderr.write("".join(_state["held"]))


def quiet_full_disk() -> None:
    """Installs the filter on the root logger's handlers and the asyncio logger, and the closed-loop hook (once)."""
    if _state["installed"]:
        return
    _state["installed"] = True
    about = _AboutFullDisk()
    for handler in logging.getLogger().handlers:
        handler.addFilter(about)
    for name in ("asyncio", "absl"):
        logging.getLogger(name).addFilter(about)
    sys.excepthook = _hold_closed_loop
    atexit.register(_print_held)
