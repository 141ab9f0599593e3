"""Input checks shared by the config validation and the scripts, light enough for a sweep driver to import.

Each raises a one-line ValueError naming the key, the value and what is allowed, and writes nothing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import tempfile
import traceback
from typing import Any, Callable


class RunError(RuntimeError):
    """A run that cannot start or go on, said in one line (the commands print it and exit 1)."""


def describe(error: BaseException) -> str:
    """``'<ExceptionName>: <first line>'`` of an error, short enough for a one-line message."""
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first[:160]}{'...' if len(first) > 160 else ''}"


def _line_in(path: str, error: BaseException) -> str:
    """``<path>:<line>`` of the deepest frame of ``error``'s traceback inside ``path`` (``<path>`` when none)."""
    full = os.path.abspath(path)
    if isinstance(error, SyntaxError) and error.lineno and os.path.abspath(error.filename or "") == full:
        return f"{path}:{error.lineno}"
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__) if os.path.abspath(f.filename) == full]
    return f"{path}:{lines[-1]}" if lines else path


def user_file_error(path: str, error: BaseException) -> ValueError:
    """A user's Python file (a config or experiment) that failed to load or run, as one line: the file and line
    where it failed and the error, e.g. ``configs/x.py:12: NameError: name 'foo' is not defined``."""
    what = f"SyntaxError: {error.msg}" if isinstance(error, SyntaxError) else describe(error)
    return ValueError(f"{_line_in(path, error)}: {what}")


def load_user_module(path: str, name: str) -> Any:
    """Executes the Python file ``path`` as module ``name``; a missing file, a folder, a syntax error or an error
    raised while it runs is a one-line ValueError naming the file and line (:func:`user_file_error`)."""
    if not os.path.isfile(path):
        raise ValueError(f"{path} is a folder, not a Python file" if os.path.isdir(path) else f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 (the user's code can raise anything: report where)
        raise user_file_error(path, e) from None
    return module


def call_user_function(path: str, module: Any, function: str, *args: Any) -> Any:
    """``module.<function>(*args)`` of a file loaded by :func:`load_user_module`; its errors as one line too."""
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ValueError(f"{path}: no {function}() function")
    try:
        return fn(*args)
    except ValueError:  # the file's own one-line message for a bad argument (an unknown preset): kept as it is
        raise
    except Exception as e:  # noqa: BLE001
        raise user_file_error(path, e) from None


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


RESERVE = 200  # bytes of path a run writes below its folder (checkpoints/<step>/<orbax item>/...)


def _limit(folder: str, name: str, default: int) -> int:
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):
        return default


def check_path_lengths(path: str, key: str, existing: str | None = None) -> None:
    """Each folder name in ``path`` fits the file system's name limit and the path leaves room for what a run
    writes below it (:data:`RESERVE`), else one line (the folders would fail with ENAMETOOLONG once created)."""
    full = os.path.abspath(os.path.expanduser(path))
    existing = existing or _nearest(full)
    name_max, path_max = _limit(existing, "PC_NAME_MAX", 255), _limit(existing, "PC_PATH_MAX", 4096)
    for part in full.split(os.sep):
        if len(part.encode()) > name_max:
            raise ValueError(f"{key}='{path}': the name '{part[:24]}...' is {len(part.encode())} bytes; the file "
                             f"system allows {name_max} per folder name")
    if len(full.encode()) + RESERVE > path_max:
        raise ValueError(f"{key}='{path}' is {len(full.encode())} bytes long; the file system allows {path_max} per "
                         f"path and a run writes up to {RESERVE} more below its folder")


def _nearest(full: str) -> str:
    """The nearest existing folder (or file) at or above the absolute path ``full``."""
    while not os.path.exists(full):
        full = os.path.dirname(full)
    return full


def check_writable(path: str, key: str) -> None:
    """``path`` is a folder this process can write in, or one it can create (its nearest existing ancestor is a
    writable folder, its names within the file system's limits); creates nothing."""
    if not str(path).strip():
        raise ValueError(f"{key}='{path}' is empty; name a folder")
    full = os.path.abspath(os.path.expanduser(path))
    existing = _nearest(full)
    where = "" if existing == full else f": {existing}"
    if not os.path.isdir(existing):
        raise ValueError(f"{key}='{path}'{where} is a file, not a folder")
    if not _can_write(existing):
        raise ValueError(f"{key}='{path}'{where} is not writable")
    check_path_lengths(path, key, existing)


TYPES = {int: "an integer", float: "a number", bool: "True or False", str: "a string"}


@dataclasses.dataclass(frozen=True)
class Rule:
    """A scalar config key's type, what is allowed (for the message) and its test; ``optional``: None (unset)
    passes. Config sections declare one per key beside its default (see attn_lab/train/config.py)."""

    kind: type
    allowed: str = ""
    test: Callable[[Any], bool] = lambda v: True
    optional: bool = False
    choices: tuple[str, ...] = ()  # a fixed set of values (then ``allowed`` and ``test`` are not used)


def _has_type(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    kinds = (int, float) if kind is float else kind  # an integer is a number
    return isinstance(value, kinds) and not isinstance(value, bool)


def check_value(key: str, value: Any, rule: Rule) -> None:
    """One line ``<key> must be <what is allowed>, got <value>`` unless ``value`` passes ``rule``."""
    if value is None and rule.optional:
        return
    if rule.choices:
        if value not in rule.choices:
            raise ValueError(f"{key}='{value}' is not one of: {', '.join(rule.choices)}")
        return
    if not _has_type(value, rule.kind):
        raise ValueError(f"{key} must be {TYPES[rule.kind]}{' or unset' if rule.optional else ''}, got {value!r}")
    if not rule.test(value):
        raise ValueError(f"{key} must be {rule.allowed}, got {value!r}")


def check_values(prefix: str, section: Any, rules: dict[str, Rule]) -> None:
    """:func:`check_value` for each ``rules`` key of ``section`` (a ConfigDict), named ``<prefix>.<key>``."""
    for key, rule in rules.items():
        check_value(f"{prefix}.{key}" if prefix else key, section[key], rule)


POSITIVE_INT = Rule(int, "positive", lambda v: v > 0)
OPTIONAL_POSITIVE_INT = Rule(int, "positive", lambda v: v > 0, optional=True)
POSITIVE = Rule(float, "positive", lambda v: v > 0)
NON_NEGATIVE = Rule(float, ">= 0", lambda v: v >= 0)
FRACTION = Rule(float, "in [0, 1)", lambda v: 0 <= v < 1)
BOOL, STR, OPTIONAL_STR = Rule(bool), Rule(str), Rule(str, optional=True)
