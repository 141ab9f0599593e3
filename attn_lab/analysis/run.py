"""Analysis of a finished run: its results and its captured attention maps (the run is restored by
:func:`attn_lab.train.restore.load_finished_run`)."""

from __future__ import annotations

import json
import os

import jax
import numpy as np

from attn_lab.train.capture import as_layers, capture_step
from attn_lab.train.restore import FinishedRun


def finished_results(workdir: str) -> dict:
    """``workdir/results.json`` (written when a run reaches its last step)."""
    path = os.path.join(workdir, "results.json")
    if not os.path.exists(path):
        raise ValueError(f"{workdir} has no results.json: the run has not finished")
    with open(path) as f:
        return json.load(f)


def capture_maps(run: FinishedRun, batch: dict) -> dict[str, dict[str, np.ndarray]]:
    """``'<kind>/<layer>'`` -> attention maps ``[B, N, T, S]``, head outputs, key validity (``[B, S]``;
    causal decoder self-attention ``[B, T, S]``) and query validity ``[B, T]``."""
    return as_layers(jax.jit(capture_step(run.graphdef))(run.state, batch))
