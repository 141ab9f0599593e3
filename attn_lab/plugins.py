"""A researcher's own extensions, imported before any config is built: kernels, model kinds, objectives, tasks and
analyses registered from outside this package.

Three routes, all imported before a command parses its flags (a config file's defaults come from the registries, so
a plugin's kernel options and objective sections must exist by then):

  --plugins=my_lab.kernels,~/ideas/cosine.py   (any command: importable module names or Python files)
  ATTN_LAB_PLUGINS=my_lab.kernels               (the same list from the environment)
  [project.entry-points."attn_lab.plugins"]     (an installed package: cosine = "my_lab.cosine")

A command exports the list it loaded in ``ATTN_LAB_PLUGINS``, so the processes it starts (a sweep's trials, their
head analyses) import the same modules. Jax-free until a plugin imports something.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable
from importlib import metadata

from attn_lab.checks import load_user_module

ENV = "ATTN_LAB_PLUGINS"
GROUP = "attn_lab.plugins"
_LOADED: dict[str, object] = {}  # what each plugin spec imported, so a second load is a no-op


def from_argv(argv: list[str]) -> list[str]:
    """The ``--plugins`` values of a command line (``--plugins=a,b`` or ``--plugins a,b``), in order."""
    found = []
    for i, arg in enumerate(argv):
        if arg.startswith("--plugins="):
            found.append(arg.split("=", 1)[1])
        elif arg == "--plugins" and i + 1 < len(argv):
            found.append(argv[i + 1])
    return [item.strip() for value in found for item in value.split(",") if item.strip()]


def load(spec: str) -> object:
    """Imports one plugin: a Python file (``.py``; ``~`` expanded) or an importable module name. Raises a one-line
    ValueError naming the plugin when it cannot be found or fails while it runs."""
    if spec in _LOADED:
        return _LOADED[spec]
    if spec.endswith(".py"):
        path = os.path.abspath(os.path.expanduser(spec))
        stem = os.path.splitext(os.path.basename(path))[0]
        module = load_user_module(path, f"attn_lab_plugin_{stem}")
    else:
        try:
            module = importlib.import_module(spec)
        except ModuleNotFoundError as e:
            if e.name and spec.startswith(e.name):
                raise ValueError(f"plugins: no module named {spec!r} (give an importable module name or a .py "
                                 "file)") from None
            raise ValueError(f"plugins: {spec} failed to import: {type(e).__name__}: {e}") from None
        except Exception as e:  # noqa: BLE001 (a plugin can raise anything: name it in one line)
            raise ValueError(f"plugins: {spec} failed to import: {type(e).__name__}: {e}") from None
    _LOADED[spec] = module
    return module


def entry_points() -> list[str]:
    """The module names installed packages declare in the ``attn_lab.plugins`` entry-point group."""
    return [ep.value.split(":")[0] for ep in metadata.entry_points(group=GROUP)]


def load_all(argv: list[str]) -> list[str]:
    """Imports every plugin a command is given -- the entry-point group, ``ATTN_LAB_PLUGINS``, then ``--plugins``
    of ``argv`` -- and exports the list in ``ATTN_LAB_PLUGINS`` for the processes it starts. Returns the list."""
    given = os.environ.get(ENV, "")
    where = {**{s: f"entry point group {GROUP}" for s in entry_points()},
             **{s.strip(): f"{ENV}={given}" for s in given.split(",") if s.strip()},
             **{s: "--plugins" for s in from_argv(argv)}}  # where each plugin was named, for its error line
    where = {os.path.abspath(os.path.expanduser(s)) if s.endswith(".py") else s: w for s, w in where.items()}
    specs = list(where)
    for spec in specs:
        try:
            load(spec)
        except ValueError as e:
            raise ValueError(str(e) if where[spec] == "--plugins" else f"{where[spec]}: {e}") from None
    if specs:
        os.environ[ENV] = ",".join(specs)
    return specs


# Config sections a registry fills, prefix -> (the registered names below it, the entry a key below it names, from
# the key's rest after the prefix). The registries
# add themselves (attention/registry.py, objectives/base.py): this module, below them, imports neither.
SECTIONS: dict[str, tuple[Callable[[], Iterable[str]], Callable[[str], str]]] = {}


def unregistered(key: str) -> str | None:
    """Why a config key (``model.attention.<kernel>.<option>``, ``loss.<term>...``) is unknown in this process when
    a plugin would make it known: ``"attention kernel 'x' is not registered here: ..."``, or None for any other key.
    Said instead of "unknown key" or "was trained with": the run is fine, only its plugin is not loaded."""
    key = key.removeprefix("config.")
    for prefix, (names, named) in SECTIONS.items():
        rest = key[len(prefix) + 1:] if key.startswith(prefix + ".") else ""
        if rest.count(".") >= 1 and not any(rest.startswith(f"{n}.") for n in names()):
            return (f"{named(rest)} is not registered here: load the plugin that registers it (--plugins "
                    f"FILE_OR_MODULE, or {ENV}, or the entry-point group {GROUP})")
    return None
