"""Analysis of a finished run: its captured attention maps (the run is restored by
:func:`attn_lab.train.restore.load_finished_run`; its results.json is read through :mod:`attn_lab.results`)."""

from __future__ import annotations

import jax
import numpy as np

from attn_lab.train.capture import as_layers, capture_step
from attn_lab.train.restore import FinishedRun


def capture_maps(run: FinishedRun, batch: dict) -> dict[str, dict[str, np.ndarray]]:
    """``'<kind>/<layer>'`` -> attention maps ``[B, N, T, S]``, head outputs, key validity (``[B, S]``;
    causal decoder self-attention ``[B, T, S]``) and query validity ``[B, T]``."""
    return as_layers(jax.jit(capture_step(run.graphdef))(run.state, batch))
