"""What a run ran on: Python and package versions, the JAX backend and devices, and the project's git commit.

Written into every ``results.json`` and W&B run config under ``environment`` so a table can say which stacks its
numbers came from (``scripts/make_tables.py`` prints them), and so a result that moves between two runs can be traced
to a changed jax, a GPU instead of a CPU, or uncommitted code.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from typing import Any

import jax

# Distribution names (as pip knows them) whose versions change numbers or speed.
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "tensorflow-datasets", "numpy")
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution (None when it is not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_state(root: str = PROJECT_ROOT) -> dict[str, Any]:
    """``{'commit': sha or None, 'dirty': bool or None}`` of the checkout holding this package.

    None when the package is not inside a git checkout (a non-editable install) or git is missing. Dirty means a
    tracked file differs from the commit or an untracked file is not ignored (a new kernel file counts; ignored
    run folders do not).
    """
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout if proc.returncode == 0 else None

    if not os.path.exists(os.path.join(root, ".git")):
        return {"commit": None, "dirty": None}
    commit, status = git("rev-parse", "HEAD"), git("status", "--porcelain")
    return {"commit": commit.strip() if commit else None, "dirty": None if status is None else bool(status.strip())}


def environment() -> dict[str, Any]:
    """The environment block of results.json and the W&B config.

    Returns:
      ``{'python', 'platform', 'packages': {name: version}, 'backend', 'device_kind', 'device_count',
      'process_count', 'git': {'commit', 'dirty'}}``.
    """
    devices = jax.devices()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "packages": package_versions(),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "process_count": jax.process_count(),
        "git": git_state(),
    }


def describe(env: dict[str, Any]) -> str:
    """One line naming an environment block, e.g. ``python 3.12.1, jax 0.12.0.1, flax 0.12.12, ... cpu x2 @ 1a2b3c``."""
    pkgs = env.get("packages", {})
    names = ", ".join(f"{k} {v}" for k, v in pkgs.items() if v is not None)
    git = env.get("git") or {}
    commit = (git.get("commit") or "no git")[:10] + (" (dirty)" if git.get("dirty") else "")
    return (f"python {env.get('python')}, {names}; {env.get('backend')} {env.get('device_kind')} "
            f"x{env.get('device_count')}; commit {commit}")


def summarize(blocks: list[dict[str, Any] | None]) -> list[str]:
    """``'<n> run(s): <describe(env)>'`` per distinct environment, most runs first; runs written before environments
    were recorded count as ``not recorded``."""
    counts: dict[str, int] = {}
    for env in blocks:
        line = describe(env) if env else "not recorded (results.json written before environments were recorded)"
        counts[line] = counts.get(line, 0) + 1
    return [f"{n} run{'s' if n > 1 else ''}: {line}" for line, n in sorted(counts.items(), key=lambda kv: -kv[1])]
