"""The same sweep as a W&B grid sweep, so ``wandb sweep`` + ``wandb agent`` spread it over many machines.

The exported definition has one parameter per axis (a zipped group is one parameter named ``key1+key2`` whose
values are the zipped points) plus ``seed``. Its agent command is ``scripts/sweep.py ... --wandb-trial
${args_json}``: the agent passes the run's parameters as one JSON argument, :func:`trial_from_wandb` maps them back
to the experiment's trial, and the trial runs exactly as in a local sweep (same folder, same trainer, W&B group =
the sweep's name), logging online into the agent's run.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import yaml

from attn_lab.io import write_text_atomic
from attn_lab.sweep.spec import Experiment, Trial

ZIP_SEP = "+"


def _plain(value: Any) -> Any:
    """Tuples -> lists, recursively (YAML/JSON have lists only)."""
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def sweep_definition(exp: Experiment, spec: str, workdir: str, extra: list[str] = ()) -> dict[str, Any]:
    """The W&B sweep config (method grid) of ``exp``; ``spec`` is the experiment argument, e.g. 'x.py:quick'.
    Refused (one ValueError line) when a trial starts from another: W&B agents run trials in any order."""
    ordered = next((t for t in exp.trials() if t.after), None)
    if ordered is not None:
        raise ValueError(f"--export-wandb: trial {ordered.name} starts from {ordered.after[0]} (a '{{trial:...}}' "
                         "value), which W&B agents cannot order; run this experiment with attn_lab.sweep")
    parameters = {}
    for axis in exp.axes:
        keys = list(axis[0])
        values = [point[keys[0]] if len(keys) == 1 else [point[k] for k in keys] for point in axis]
        parameters[ZIP_SEP.join(keys)] = {"values": _plain(values)}
    parameters["seed"] = {"values": list(exp.seeds)}
    # the agent runs the package's entry point (``program`` is W&B's required label; the command does not use it)
    command = ["${env}", "${interpreter}", "-m", "attn_lab.sweep", "--experiment", spec, "--workdir", workdir,
               "--config.wandb.mode=online", *extra, "--wandb-trial", "${args_json}"]
    return {"name": exp.name, "method": "grid", "program": "attn_lab.sweep", "parameters": parameters,
            "command": command}


def write_sweep_yaml(path: str, definition: dict[str, Any]) -> None:
    write_text_atomic(pathlib.Path(path), yaml.safe_dump(definition, sort_keys=False))


def trial_from_wandb(exp: Experiment, params: dict[str, Any] | str) -> Trial:
    """The trial of ``exp`` whose swept values are the W&B run's parameters (a dict, or the agent's JSON)."""
    params = json.loads(params) if isinstance(params, str) else params
    point: dict[str, Any] = {}
    for name, value in params.items():
        keys = name.split(ZIP_SEP)
        values = value if len(keys) > 1 else [value]
        if not isinstance(values, list) or len(values) != len(keys):
            raise ValueError(f"W&B parameter {name!r}={value!r}: expected {len(keys)} zipped values")
        point.update(zip(keys, values))
    for trial in exp.trials():
        if {k: _plain(trial.point[k]) for k in exp.swept_keys()} == {k: _plain(v) for k, v in point.items()}:
            return trial
    raise ValueError(f"W&B parameters {params} are not a trial of sweep '{exp.name}'")
