"""The one owner of a run folder's records: results.json, training.json, config.json and metrics.jsonl.

No other module names these files or the keys inside them: the trainer builds and writes its records here, the
sweep and the reporting read a finished trial's table row from here (:func:`summary_row`), the analysis reads a
finished run from here. It imports nothing that imports jax, so a sweep driver or a table script stays light.

- ``results.json`` -- written once, when a run reaches its last step and its test is scored: ``final``
  (``validation`` = the last evaluation, ``test``), ``best`` (best validation value of each metric), what training
  measured (see ``training.json``), ``config``, ``environment``, and for gated or shape-learning models ``gates`` /
  ``learned``. A folder with it is *finished*; no rerun writes it again.
- ``training.json`` -- what training measured (parameters, steps, compilations, wall time, speed), written at the
  last step before the test, so a process that only finishes an interrupted test reports the original speed.
- ``config.json`` -- the run's resolved config, written when training starts.
- ``metrics.jsonl`` -- one JSON object per logged step (``{'step': s, 'train/loss': ...}``); written line by line by
  :class:`attn_lab.train.logging.MetricLogger`, read back here.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Iterator

from attn_lab.checks import RunError, describe
from attn_lab.io import write_json_atomic

RESULTS_FILE = "results.json"
TRAINING_FILE = "training.json"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
# training.json's speed fields, all over the part of the run one process trained (see attn_lab.train.loop)
SPEED_FIELDS = ("compilations", "wall_time_sec", "steps_per_sec", "steady_steps_per_sec", "compile_seconds",
                "train_time_sec")
PRINTED = ("final", "best", "num_params", "steps", "wall_time_sec", "steps_per_sec")  # what a finished run prints


# --- reading -------------------------------------------------------------------------------------------------------

def read_record(workdir: str, name: str) -> dict[str, Any] | None:
    """``<workdir>/<name>`` as a dict, None when absent; ValueError (one line naming the file) when it does not
    parse or is not a JSON object."""
    path = os.path.join(workdir, name)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read ({describe(e)})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path} cannot be read (a JSON {type(record).__name__}, not an object)")
    return record


def is_finished(workdir: str) -> bool:
    """Whether the run in ``workdir`` finished (its results.json exists; a damaged one still counts: it is never
    overwritten)."""
    return os.path.exists(os.path.join(workdir, RESULTS_FILE))


def finished_results(workdir: str) -> dict[str, Any] | None:
    """The results.json of a finished run in ``workdir``, or None when the run has not finished.

    Raises:
        RunError: results.json exists but is not a finished run's record (edited or truncated by hand); it is not
            overwritten, the user decides.
    """
    try:
        results = read_record(workdir, RESULTS_FILE)
    except ValueError as e:
        raise RunError(f"{e}; a finished run's record is never overwritten: move it away to finish the run "
                       "again") from None
    problem = None if results is None else record_problem(results)
    if problem:
        raise RunError(f"{os.path.join(workdir, RESULTS_FILE)} {problem} (not a finished run's record, edited or "
                       "damaged); it is never overwritten: move it away to finish the run again")
    return results


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return _number(value) and isinstance(value, int) and value >= 0


# A finished run's results.json, key -> (what belongs there, its test): what every reader of it relies on.
RECORD = {"final": ("an object with 'test'", lambda v: isinstance(v, dict) and isinstance(v.get("test"), dict)),
          "best": ("an object", lambda v: isinstance(v, dict)),
          "steps": ("an integer", _count), "num_params": ("an integer", _count)}


def record_problem(results: dict[str, Any]) -> str | None:
    """What is wrong with a results.json record (a key missing, or a value that is not what belongs there:
    :data:`RECORD`; test and validation metrics and speed fields numbers or null), or None."""
    for key, (what, ok) in RECORD.items():
        if key not in results:
            return f"has no '{key}'"
        if not ok(results[key]):
            return f"has {key}={results[key]!r} where {what} belongs"
    if not isinstance(results.get("config", {}), dict):  # older records have none
        return f"has config={results['config']!r} where an object belongs"
    metrics = {**{f"final.test.{k}": v for k, v in results["final"]["test"].items()},
               **{f"best.{k}": v for k, v in results["best"].items()},
               **{k: results[k] for k in SPEED_FIELDS if k in results and k != "compilations"}}
    bad = next((k for k, v in metrics.items() if v is not None and not _number(v)), None)
    return None if bad is None else f"has {bad}={metrics[bad]!r} where a number belongs"


def require_finished(workdir: str) -> dict[str, Any]:
    """:func:`finished_results` for a command that needs a finished run: ValueError (one line) when it has not."""
    results = finished_results(workdir)
    if results is None:
        raise ValueError(f"{workdir} has no {RESULTS_FILE}: the run has not finished")
    return results


def read_config(workdir: str) -> dict[str, Any]:
    """The run's config.json; ValueError (one line) when ``workdir`` is not a run folder."""
    config = read_record(workdir, CONFIG_FILE)
    if config is None:
        raise ValueError(f"{workdir} is not a run folder (no {CONFIG_FILE})")
    return config


def test_metrics(results: dict[str, Any]) -> dict[str, float]:
    return results["final"]["test"]


def steps(results: dict[str, Any]) -> int:
    return results["steps"]


def gates(results: dict[str, Any]) -> dict[str, Any] | None:
    """``{'binary': {kind: [L][N] 0/1}, 'kept': int, 'total': int}`` of a gated run, else None."""
    return results.get("gates")


def learned(results: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """``{'<kind>/<layer>': {'span' | 'alpha': [heads]}}`` of kernels that learn their shape ({} otherwise)."""
    return results.get("learned", {})


def environment(results: dict[str, Any]) -> dict[str, Any] | None:
    return results.get("environment")


def readable_results(workdir: str) -> dict[str, Any] | None:
    """results.json of ``workdir`` for a reader that skips what it cannot use: None when absent or unreadable."""
    try:
        return read_record(workdir, RESULTS_FILE)
    except ValueError:
        return None


def learned_in(workdir: str) -> dict[str, dict[str, list[float]]]:
    """:func:`learned` of the run in ``workdir``; {} when it has not finished (a trial without results contributes
    nothing to a table)."""
    record = readable_results(workdir)
    return learned(record) if record else {}


def summary_row(results: dict[str, Any]) -> dict[str, Any]:
    """A finished run's columns in a sweep's table: ``test_<metric>``, ``best_val_<metric>``, ``num_params``,
    ``steps`` and ``steps_per_sec`` (steady state -- compilation excluded -- where the run recorded it)."""
    speed = results.get("steady_steps_per_sec") or results.get("steps_per_sec")
    return {**{f"test_{k}": v for k, v in results["final"]["test"].items()},
            **{f"best_val_{k}": v for k, v in results["best"].items()},
            "num_params": results["num_params"], "steps": results["steps"], "steps_per_sec": speed}


def speed(results: dict[str, Any]) -> dict[str, float | None]:
    """A finished run's speed: ``steady`` steps/s (after the first log window; None with one window), ``whole``
    (every step, compilation included), ``compile_seconds``, ``wall_time_sec`` and ``steps`` (None where not
    recorded: a partial record of a failed step reads too)."""
    return {"steps": results.get("steps"), "steady": results.get("steady_steps_per_sec"),
            "whole": results.get("steps_per_sec"), "compile_seconds": results.get("compile_seconds"),
            "wall_time_sec": results.get("wall_time_sec")}


def test_metric(results: dict[str, Any], name: str) -> float | None:
    """One test metric of a results record, None where it is missing (a partial record of a failed step)."""
    return (results.get("final") or {}).get("test", {}).get(name)


def printed(workdir: str, results: dict[str, Any]) -> dict[str, Any]:
    """What ``python -m attn_lab.train`` prints for a run it finished."""
    return {"workdir": workdir, **{k: results[k] for k in PRINTED if k in results}}


def metric_lines(workdir: str) -> Iterator[dict[str, Any]]:
    """metrics.jsonl's records in order (none when absent; a line torn by a kill, or one that is not a JSON
    object, is skipped)."""
    path = os.path.join(workdir, METRICS_FILE)
    if not os.path.exists(path):  # only the main process writes metrics
        return
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


def eval_history(workdir: str) -> tuple[dict[str, float], dict[str, float]]:
    """(last, best) validation value of each eval metric, read back from metrics.jsonl (so resumes count)."""
    last: dict[str, float] = {}
    best: dict[str, float] = {}
    for record in metric_lines(workdir):
        for key, value in record.items():
            if key.startswith("eval/"):
                name = key[len("eval/"):]
                better = min if name == "loss" else max
                last[name] = value
                best[name] = value if name not in best else better(best[name], value)
    return last, best


def test_logged(workdir: str, step: int) -> bool:
    """Whether metrics.jsonl already has a ``test/`` line at ``step``."""
    return any(r.get("step") == step and any(k.startswith("test/") for k in r) for r in metric_lines(workdir))


# --- writing (the trainer) ------------------------------------------------------------------------------------------

def write_config(workdir: str, config: dict[str, Any]) -> None:
    write_json_atomic(os.path.join(workdir, CONFIG_FILE), config)


def training_record(num_params: int, steps: int, compilations: dict[str, int], wall_time_sec: float,
                    speed: dict[str, float | None], seeds_vectorized: int) -> dict[str, Any]:
    """training.json's record; ``speed``: the :data:`SPEED_FIELDS` the loop measured."""
    return {"num_params": num_params, "steps": steps, "compilations": compilations, "wall_time_sec": wall_time_sec,
            **speed, "seeds_vectorized": seeds_vectorized}


def write_training(workdir: str, record: dict[str, Any]) -> None:
    write_json_atomic(os.path.join(workdir, TRAINING_FILE), record)


def recorded_training(workdir: str, num_params: int, steps: int, seeds_vectorized: int) -> dict[str, Any]:
    """training.json of a run whose final test was interrupted (``final_test_resumed``); speed fields None when the
    process was stopped before writing it (between its last checkpoint and the test)."""
    try:
        record = read_record(workdir, TRAINING_FILE)
    except ValueError as e:  # damaged: the test is still finished, its speed fields said to be unknown
        print(f"note: {e}; results.json gets no speed fields", flush=True)
        record = None
    return {**dict.fromkeys(SPEED_FIELDS), "num_params": num_params, "steps": steps,
            "seeds_vectorized": seeds_vectorized, **(record or {}), "final_test_resumed": True}


def results_record(workdir: str, test: dict[str, float], training: dict[str, Any], tested_seconds: float,
                   config: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """results.json of a finished run: validation history from metrics.jsonl, the test, ``training`` (with its
    ``environment``), ``wall_time_sec`` = training's plus the test's ``tested_seconds``; ``extra``: ``gates`` /
    ``learned`` where the model has them."""
    last, best = eval_history(workdir)
    wall = training["wall_time_sec"]
    return {"final": {"validation": last, "test": test}, "best": best, **training,
            "wall_time_sec": None if wall is None else wall + tested_seconds, "config": config, **extra}


def gates_record(binary: dict[str, list[list[float]]]) -> dict[str, Any]:
    """results.json's ``gates``: the test-time 0/1 gates per kind, how many heads they keep, of how many."""
    total = sum(len(row) for grid in binary.values() for row in grid)
    kept = int(sum(sum(row) for grid in binary.values() for row in grid))
    return {"gates": {"binary": binary, "kept": kept, "total": total}}


def write_results(workdir: str, results: dict[str, Any]) -> None:
    write_json_atomic(os.path.join(workdir, RESULTS_FILE), results)


def reevaluation_path(workdir: str, stamp: str) -> str:
    """``results.reeval-<stamp>[-n].json`` beside results.json: a name no earlier re-evaluation holds."""
    stem, n = os.path.join(workdir, f"results.reeval-{stamp}"), 1
    path = stem + ".json"
    while os.path.exists(path):
        n += 1
        path = f"{stem}-{n}.json"
    return path


def write_reevaluation(path: str, step: int, scores: dict[str, dict[str, float]], stamp: str,
                       environment: dict[str, Any], config: dict[str, Any]) -> None:
    """A re-evaluation's record at ``path`` (:func:`reevaluation_path`); results.json stays as the run wrote it."""
    write_json_atomic(path, {"step": step, "finished": is_finished(os.path.dirname(path)), "final": scores,
                             "reevaluated_at": stamp, "environment": environment, "config": config})


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")
