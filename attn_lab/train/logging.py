"""Metric logging: a local ``metrics.jsonl`` that is always written, plus W&B.

The JSONL file is the source of truth (it survives without network or a W&B
account); W&B is a convenience mirror. Both are written only by the main
process so that multi-host runs do not produce N copies.
"""

from __future__ import annotations

import json
import netrc
import os
import pathlib
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

import numpy as np

from attn_lab.io import write_bytes_atomic, write_json_atomic, write_text_atomic  # noqa: F401  (old import path)
from attn_lab.results import METRICS_FILE

WANDB_MODES = ("offline", "online", "disabled")

RUN_ID_FILE = "wandb_run_id.txt"
_DEFAULT_WANDB_HOST = "https://api.wandb.ai"


def _has_wandb_api_key() -> bool:
    """Whether W&B would find credentials: env var, identity token, or netrc.

    Returns:
        True if ``wandb.init(mode='online')`` would not need to prompt for a
        key. Uses wandb's own netrc reader when available so that the
        ``NETRC`` env var and ``WANDB_BASE_URL`` host are honoured exactly as
        wandb does.
    """
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = os.environ.get("WANDB_BASE_URL", _DEFAULT_WANDB_HOST)
    try:  # wandb's internal reader (wandb >= 0.2x); fall back to stdlib below.
        from wandb.sdk.lib.wbauth import read_netrc_auth

        return bool(read_netrc_auth(host=host))
    except ImportError:
        pass
    except Exception:  # malformed key in netrc: let wandb report it later.
        return True
    netrc_path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        creds = netrc.netrc(netrc_path).authenticators(host.split("://")[-1])
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(creds and creds[2])


def check_wandb_mode(mode: str) -> None:
    """Fail fast on an unusable W&B mode, before the trainer compiles anything.

    Args:
        mode: One of ``'offline'``, ``'online'``, ``'disabled'``.

    Raises:
        ValueError: With a one-line message if ``mode`` is unknown, or if it is
            ``'online'`` and no API key can be found (otherwise wandb would
            prompt interactively or fail minutes into the run).
    """
    if mode not in WANDB_MODES:
        raise ValueError(f"wandb.mode={mode!r} is invalid; use one of {'|'.join(WANDB_MODES)}")
    if mode == "online" and not _has_wandb_api_key():
        raise ValueError(
            "wandb.mode='online' needs a W&B API key (wandb login or WANDB_API_KEY); "
            "use wandb.mode=offline"
        )


def _to_python(value: Any) -> Any:
    """Convert numpy/jax scalars (and 0-d arrays) to plain Python numbers for JSON.

    Args:
        value: A metric value.

    Returns:
        ``float`` for numeric scalars (``int`` stays ``int``, bools stay bools),
        other values unchanged; NaN/inf stay floats (json writes them as NaN).
    """
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    arr = np.asarray(value)
    if arr.ndim == 0:
        if arr.dtype.kind in "iu":
            return int(arr)
        if arr.dtype.kind == "b":
            return bool(arr)
        return float(arr)
    return arr.tolist()


@contextmanager
def _default_env(defaults: Mapping[str, str]) -> Iterator[None]:
    """Temporarily set env vars that are not already set, then restore them.

    wandb 0.31 has no ``wandb.Settings`` field for its cache/artifact/data dirs:
    the ``wandb-core`` service (started by the first ``wandb.init`` in a
    process, inheriting ``os.environ``) writes its debug logs to
    ``$WANDB_CACHE_DIR`` or ``~/.cache/wandb``. Setting the variables only
    around ``wandb.init`` keeps those files in the workdir without leaving a
    process-wide change behind; values the user already exported win.

    Args:
        defaults: Variable name -> value to use if the variable is unset.
    """
    added = [k for k in defaults if k not in os.environ]
    for key in added:
        os.environ[key] = defaults[key]
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def _plain_config(config: Any) -> dict[str, Any]:
    """Return ``config`` as a plain dict (ml_collections ConfigDict via ``to_dict``)."""
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return dict(config)


def _truncate_jsonl(path: pathlib.Path, resume_step: int) -> None:
    """Drop lines with ``step > resume_step`` so a resumed run has no duplicate steps.

    Args:
        path: The metrics.jsonl file (may not exist).
        resume_step: Step of the checkpoint being resumed; later lines were
            logged after that checkpoint and will be re-logged.
    """
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line torn by a crash: drop it
            continue
        if not isinstance(record, dict) or not isinstance(record.get("step", -1), int):
            continue  # not a step's record (edited by hand): dropped like a torn line
        if record.get("step", -1) <= resume_step:
            kept.append(line)
    write_text_atomic(path, "".join(line + "\n" for line in kept))


class MetricLogger:
    """Logs scalar metrics to ``workdir/metrics.jsonl`` and to a W&B run.

    Usable as a context manager; ``close`` is idempotent.
    """

    def __init__(
        self,
        workdir: str,
        config: Mapping[str, Any],
        *,
        mode: str = "offline",
        project: str = "attn_lab",
        group: str | None = None,
        tags: Sequence[str] = (),
        name: str | None = None,
        resume_step: int | None = None,
        is_main_process: bool = True,
    ) -> None:
        """Open the JSONL file and start (or resume) the W&B run.

        Args:
            workdir: Run directory; metrics.jsonl, the W&B run id and (for
                offline mode) all W&B files go inside it so a run is
                self-contained and easy to copy or delete.
            config: Run config recorded in W&B (dict or ConfigDict).
            mode: ``'offline'`` (default, needs no key; ``wandb sync`` later),
                ``'online'``, or ``'disabled'`` (JSONL only).
            project: W&B project.
            group: W&B group, e.g. to gather the seeds of one experiment.
            tags: W&B tags.
            name: W&B display name.
            resume_step: Step of the checkpoint being resumed. Later JSONL
                lines are dropped and the previous W&B run id is reused, so a
                resumed run looks like an uninterrupted one.
            is_main_process: False on non-zero hosts: then nothing is written.
        """
        check_wandb_mode(mode)
        self._active = is_main_process
        self._file: TextIO | None = None
        self._run: Any = None
        if not self._active:
            return
        workdir_path = pathlib.Path(workdir)
        workdir_path.mkdir(parents=True, exist_ok=True)
        metrics_path = workdir_path / METRICS_FILE
        if resume_step is not None:
            _truncate_jsonl(metrics_path, resume_step)
        self._file = open(metrics_path, "a")
        if mode != "disabled":
            self._run = self._init_wandb(
                workdir_path, _plain_config(config), mode=mode, project=project,
                group=group, tags=tags, name=name, resume=resume_step is not None,
            )

    @staticmethod
    def _init_wandb(
        workdir: pathlib.Path,
        config: dict[str, Any],
        *,
        mode: str,
        project: str,
        group: str | None,
        tags: Sequence[str],
        name: str | None,
        resume: bool,
    ) -> Any:
        """Start the W&B run with all of its files under ``workdir``.

        Args:
            workdir: Run directory; W&B writes ``workdir/wandb/<mode>-run-*``.
            config: Plain-dict run config.
            mode: ``'offline'`` or ``'online'``.
            project, group, tags, name: Passed to ``wandb.init``.
            resume: Reuse the id stored in ``workdir/wandb_run_id.txt`` (if
                any) with ``resume='allow'`` so W&B continues the same run.

        Returns:
            The ``wandb.Run``.
        """
        import wandb  # imported lazily: importing wandb is slow and not needed when disabled

        id_path = workdir / RUN_ID_FILE
        run_id = id_path.read_text().strip() if resume and id_path.exists() else None
        wandb_dir = workdir / "wandb"
        env_dirs = {
            "WANDB_CACHE_DIR": str(wandb_dir / "cache"),
            "WANDB_DATA_DIR": str(wandb_dir / "data"),
            "WANDB_ARTIFACT_DIR": str(wandb_dir / "artifacts"),
        }
        settings = wandb.Settings(
            silent=True,  # no banners / "syncing" chatter in the training log
            console="off",  # don't capture stdout/stderr into the run
            root_dir=str(workdir),
        )
        with _default_env(env_dirs):
            run = wandb.init(
                dir=str(workdir), mode=mode, project=project, group=group, tags=list(tags),
                name=name, config=config, id=run_id, resume="allow" if run_id else None,
                settings=settings, reinit="create_new",  # vectorized seeds: one live run per seed in one process
            )
        id_path.write_text(run.id + "\n")
        return run

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append one JSONL record and log the same metrics to W&B.

        Args:
            step: Training step; the x-axis in W&B and the key used on resume.
            metrics: Scalars keyed like ``'train/loss'``, ``'eval/bleu'``;
                numpy/jax scalars are converted to Python numbers.
        """
        if not self._active:
            return
        values = {k: _to_python(v) for k, v in metrics.items()}
        if self._file is not None:
            record = {"step": int(step), "time": time.time(), **values}
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()  # a crash loses at most the line being written
        if self._run is not None:
            self._run.log(values, step=int(step))

    def summary(self, metrics: Mapping[str, Any]) -> None:
        """Set W&B run-summary values (e.g. ``num_params``, final eval metrics).

        Args:
            metrics: Values shown in the W&B runs table; overrides the
                default "last logged value" summary for the same keys.
        """
        if self._run is None:
            return
        for key, value in metrics.items():
            self._run.summary[key] = _to_python(value)

    def close(self) -> None:
        """Close the JSONL file and finish the W&B run; safe to call twice."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._run is not None:
            run, self._run = self._run, None
            run.finish()

    def __enter__(self) -> MetricLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
