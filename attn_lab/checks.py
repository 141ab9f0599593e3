"""Input checks shared by the config validation and the scripts, light enough for a sweep driver to import.

Each raises a one-line ValueError naming the key, the value and what is allowed, and writes nothing.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

SEEDS = range(2**32)  # the data pipeline's shuffle seeds (grain) take [0, 2**32 - 1]


def check_seed(value: Any, key: str = "seed") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value not in SEEDS:
        raise ValueError(f"{key} must be an integer in [0, 2**32 - 1], got {value!r}")


def _can_write(folder: str) -> bool:
    try:
        with tempfile.TemporaryFile(dir=folder):  # an unnamed probe, gone when closed
            return True
    except OSError:
        return False


def check_writable(path: str, key: str) -> None:
    """``path`` is a folder this process can write in, or one it can create (its nearest existing ancestor is a
    writable folder); creates nothing."""
    full = os.path.abspath(os.path.expanduser(path))
    existing = full
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    where = "" if existing == full else f": {existing}"
    if not os.path.isdir(existing):
        raise ValueError(f"{key}='{path}'{where} is a file, not a folder")
    if not _can_write(existing):
        raise ValueError(f"{key}='{path}'{where} is not writable")
