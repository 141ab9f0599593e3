"""A run's identity: its resolved config, less the keys that cannot change what it computes.

A resume, a rerun of a finished run and a sweep that skips a finished trial each compare the config they would run
with the one the folder recorded (results.json's ``config`` for a finished run, else config.json once a checkpoint
exists). A difference stops them with one line naming the key and both values -- a run is never continued, reused
or tabulated under a config that did not produce it. The fingerprint (:func:`fingerprint`, in results.json and
training.json) is the same comparison as one short hash.

:data:`NEUTRAL` keys are left out: they say where files go or how often the loop logs or saves, not what it
computes (the data order, dropout keys and the learning-rate schedule do not depend on them). ``train.eval_every``
is *not* neutral: it decides which validation scores ``best`` picks from.

The comparison is of what a run *uses* (:func:`used`), so the lab can grow under a recorded run: a key the record
lacks compares at today's default (a kernel option, a model kind's keys or an objective added later), an objective
that is off compares as absent whatever its section holds, and an active objective compares its section in a form
that does not change when a registry grows (``loss.diversity.kinds`` as the kinds the run's model has). Importing
this module is jax-free, like :mod:`attn_lab.results`; comparing imports the registries (the defaults live there).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable

from attn_lab import results
from attn_lab.checks import RunError

# Where W&B logs, where the prepared data and the compiled programs are kept, the logging / checkpoint cadence,
# the per-head diagnostics logged at evaluations, and a multi-host launch's addresses: none changes a number.
NEUTRAL = ("wandb.", "task.data_dir", "compile_cache", "train.log_every", "train.checkpoint_every", "heads.track",
           "parallel.coordinator_address", "parallel.process_id")
ABSENT = "(absent)"
# Keys added after runs were recorded whose old behaviour is not today's default: a record without one ran with
# this value (restore fills it in too: attn_lab/train/restore.py). A key added at the value that computes what older
# runs computed needs no entry -- a record without it compares at today's default (:func:`used`) -- as the fused
# kernels' options, whose 'auto' implementation is decided per backend and was never part of a run's identity.
RECORDED_BEFORE = {"train.weight_decay_on": "all"}


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{'train': {'learning_rate': 1e-3}}`` -> ``{'train.learning_rate': 1e-3}``; values as JSON has them
    (tuples are lists), so a recorded and a live config compare equal when they are."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = plain(value)
    return out


def plain(value: Any) -> Any:
    """``value`` as a JSON record holds it (a tuple is a list)."""
    return json.loads(json.dumps(value))


def unused_kernels(keys: dict[str, Any]) -> set[str]:
    """The kernels whose options (``model.attention.<kernel>.*``) nothing uses: neither ``model.attention.name``
    nor a ``model.kinds.<kind>.attention`` names them (``keys``: :func:`flat`; validation refuses a kind the model
    does not have, so the names given are the ones used)."""
    used = {keys.get("model.attention.name")} | {v for k, v in keys.items()
                                                 if k.startswith("model.kinds.") and k.endswith(".attention") and v}
    return {k.split(".")[2] for k in keys if k.startswith("model.attention.") and k.count(".") == 3} - used


def comparable(config: dict[str, Any]) -> dict[str, Any]:
    """The keys that make the run's identity: every key but the :data:`NEUTRAL` ones, the options of kernels no
    attention uses (:func:`unused_kernels`: they do nothing)."""
    return _comparable_keys(flat(config))


def _comparable_keys(keys: dict[str, Any]) -> dict[str, Any]:
    unused = tuple(f"model.attention.{kernel}." for kernel in unused_kernels(keys))
    return {k: v for k, v in keys.items()
            if not (k.startswith(NEUTRAL) or k + "." in NEUTRAL or (unused and k.startswith(unused)))}


def defaults(keys: dict[str, Any]) -> dict[str, Any]:
    """Today's default of every key (flat) for the task ``keys`` names: the base config built from the registries,
    with that task's options (none where the task is no longer registered)."""
    from attn_lab.data import tasks
    from attn_lab.train.config import base_config

    config = base_config()
    try:
        config.task.update(name=keys.get("task.name"), **tasks.defaults(keys.get("task.name")))
    except (KeyError, ValueError, TypeError):
        pass
    return flat(config.to_dict())


def model_kinds(keys: dict[str, Any]) -> tuple[str, ...] | None:
    """The attention kinds of the model a run's flat config builds (None where its task or model is unknown)."""
    from attn_lab.data import tasks
    from attn_lab.models import model_class

    try:
        kind = tasks.task_spec(keys.get("task.name")).kind or keys.get("task.kind")
        return tuple(model_class(kind, keys.get("model.name")).ATTENTION)
    except (KeyError, ValueError, TypeError, AttributeError):
        return None


def _nested(section: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in section.items():
        *parents, leaf = key.split(".")
        node = out
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return out


def _objectives(keys: dict[str, Any], kinds: tuple[str, ...] | None) -> dict[str, Any]:
    """``keys`` with each registered objective's section as the run uses it: left out when the objective is off,
    in its canonical form (:meth:`~attn_lab.objectives.base.LossTerm.identity`) when it is on. A ``loss.<name>``
    section no registered objective owns (one removed since) is left out when none of its weights is above 0."""
    import ml_collections

    from attn_lab import objectives

    out = dict(keys)
    owned = []
    for term in objectives.terms():
        prefix = term.path + "."
        owned.append(prefix)
        section = {k[len(prefix):]: out.pop(k) for k in list(out) if k.startswith(prefix)}
        if section and term.active(ml_collections.ConfigDict(_nested(section))):
            out |= {prefix + k: v for k, v in term.identity(section, kinds).items()}
    for key in [k for k in out if k.startswith("loss.") and not k.startswith(tuple(owned))]:
        name = ".".join(key.split(".")[:2]) + "."
        weights = [v for k, v in out.items() if k.startswith(name) and k.endswith("weight")]
        if not any(isinstance(w, (int, float)) and w > 0 for w in weights):
            out.pop(key)
    return out


def used(config: dict[str, Any]) -> dict[str, Any]:
    """What a run uses, as flat keys: its config with every key it lacks at its :data:`RECORDED_BEFORE` value, else
    at today's default (:func:`defaults`), less what :func:`comparable` leaves out, with the training objectives as
    :func:`_objectives` says."""
    keys = flat(config)
    keys = {**defaults(keys), **RECORDED_BEFORE, **keys}
    keys = _comparable_keys(keys)
    return _objectives(keys, model_kinds(keys))


def fingerprint(config: dict[str, Any]) -> str:
    """16 hex digits of the sha256 of :func:`used`, canonical JSON."""
    text = json.dumps(used(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, recorded value, current value)`` for each key of what the runs use (:func:`used`) that differs; a
    value the config itself lacks (filled from a default) shows as :data:`ABSENT`. Keys both runs use come first
    (then by key): another kernel is named by ``model.attention.name``, not by the first option only one has."""
    raw_old, raw_new = flat(recorded), flat(current)
    old, new = used(recorded), used(current)
    shown = lambda k, use, raw: use[k] if k in use and k in raw else ABSENT  # noqa: E731
    keys = sorted(set(old) | set(new), key=lambda k: (not (k in old and k in new), k))
    return [(k, shown(k, old, raw_old), shown(k, new, raw_new)) for k in keys
            if old.get(k, ABSENT) != new.get(k, ABSENT)]


def mismatch_text(where: str, source: str, diffs: list[tuple[str, Any, Any]], fresh: str) -> str:
    """One line: ``<where> was trained with <key>=<old> (<source>); this <...> has <key>=<new>`` and how to go on."""
    from attn_lab import plugins  # the registries: only when a run differs

    hint = next((h for k, _, n in diffs if n is ABSENT and (h := plugins.unregistered(k))), None)
    if hint:  # the recorded run used a plugin this process did not load: the run is fine, the command is not
        return f"{where} was trained with a plugin: {hint}"
    key, old, new = diffs[0]
    more = f" (and {len(diffs) - 1} more: {', '.join(d[0] for d in diffs[1:4])}{', ...' if len(diffs) > 4 else ''})"
    return (f"{where} was trained with {key}={old!r} ({source}), this config has {key}={new!r}"
            f"{more if len(diffs) > 1 else ''}; {fresh}")


FRESH = "give a new --workdir to train this config from scratch"


def checkpoint_steps(workdir: str) -> list[int]:
    """The steps ``workdir/checkpoints`` holds a folder for, ascending (jax-free: orbax names them by step)."""
    folder = os.path.join(workdir, "checkpoints")
    return sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []


def has_checkpoint(workdir: str) -> bool:
    """Whether ``workdir/checkpoints`` holds a step folder (what a resume would start from)."""
    return bool(checkpoint_steps(workdir))


def recorded_config(workdir: str) -> tuple[dict[str, Any] | None, str, dict[str, Any] | None]:
    """(the config the folder's run was trained with, the file it came from, its results.json when finished); the
    config is None when nothing was trained yet.

    A finished run: results.json's ``config`` (config.json where an old record lacks it). An unfinished one: its
    config.json once a checkpoint exists (before that there is nothing to resume, and a new start rewrites it).

    Raises:
      RunError: results.json or config.json cannot be read, or a checkpoint exists without config.json.
    """
    record = results.finished_results(workdir)
    if record is not None and isinstance(record.get("config"), dict):
        return record["config"], os.path.join(workdir, results.RESULTS_FILE), record
    if record is None and not has_checkpoint(workdir):
        return None, "", None
    path = os.path.join(workdir, results.CONFIG_FILE)
    try:
        config = results.read_record(workdir, results.CONFIG_FILE)
    except ValueError as e:
        raise RunError(f"{e}; it records which config trained this run: restore it, or {FRESH}") from None
    if config is None:
        raise RunError(f"{workdir} holds a trained run but no {results.CONFIG_FILE}, so which config trained it "
                       f"is unknown; restore the file, or {FRESH}")
    return config, path, record


def moved_references(recorded: dict[str, Any], current: dict[str, Any], workdir: str) -> tuple[dict, dict]:
    """Both configs with ``train.init_from`` written relative to the run's parent folder where the current source is
    a sibling of ``workdir`` (a sweep's ``{trial:<variant>}``) and the recorded one has its folder name: a sweep
    copied, synced or unpacked elsewhere recorded its sources' old absolute paths, and is the same run here."""
    old, new = (c.get("train", {}).get("init_from") for c in (recorded, current))
    parent = os.path.dirname(os.path.abspath(workdir))
    if not (isinstance(old, str) and isinstance(new, str) and os.path.dirname(os.path.abspath(new)) == parent
            and os.path.basename(old.rstrip("/")) == os.path.basename(new.rstrip("/"))):
        return recorded, current
    relative = lambda c: {**c, "train": {**c["train"], "init_from": f"{{sweep}}/{os.path.basename(new)}"}}  # noqa
    return relative(recorded), relative(current)


def check_same_run(workdir: str, config: dict[str, Any] | Callable[[], dict[str, Any]],
                   fresh: str = FRESH) -> dict[str, Any] | None:
    """Raises a one-line :class:`RunError` when ``workdir`` holds a run trained with another identity than
    ``config``; returns its results.json when it finished with this one (None otherwise). ``config`` may be a
    function that builds it, called only when the folder holds a trained run (a sweep's trial config costs a
    config-file load)."""
    recorded, source, record = recorded_config(workdir)
    if recorded is not None:
        diffs = differences(*moved_references(recorded, config() if callable(config) else config, workdir))
        if diffs:
            raise RunError(mismatch_text(workdir, source, diffs, fresh))
    return record


def check_finished(workdir: str, what: str, allow_unfinished: bool) -> None:
    """A command that reads a run's final state (``train.init_from``, the head analysis) refuses a run that has not
    finished, in one line naming its newest checkpoint; ``allow_unfinished`` uses that checkpoint and says so.
    ``what``: the key or flag that named the run, to start the line with ('' for none)."""
    if results.finished_results(workdir) is not None:
        return
    steps, what = checkpoint_steps(workdir), f"{what}: " if what else ""
    if not steps:
        raise RunError(f"{what}{workdir} has no checkpoint (the run has not saved one yet)")
    if not allow_unfinished:
        raise RunError(f"{what}{workdir} has not finished (no {results.RESULTS_FILE}; its newest checkpoint is "
                       f"step {steps[-1]}); wait for it to finish, or pass --allow-unfinished to use step {steps[-1]}")
    print(f"note: {workdir} has not finished; using its newest checkpoint (step {steps[-1]})", flush=True)
