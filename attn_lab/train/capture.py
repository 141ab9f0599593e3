"""Attention maps and per-head outputs of one batch, captured in a jittable forward pass.

Used by the trainer at every evaluation with ``config.heads.track=True``, so a researcher sees heads specialize or
die over training, and by the head analysis of finished runs (:mod:`attn_lab.analysis`). It lives in ``train``,
below both, so imports only point down.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from flax import nnx

from attn_lab.models import Ctx, attention_layers
from attn_lab.train import diagnostics
from attn_lab.train.state import merge


def capture_step(graphdef: Any) -> Callable[[dict, dict], dict]:
    """``(state, batch) -> {'<kind>/<layer>': {'attention_weights', 'head_outputs', 'values', 'valid_queries',
    'valid_keys'}}`` (pure, jittable); the row masks are the model's own (``attention_rows``)."""
    def captured(state: dict, batch: dict) -> dict:
        model = merge(graphdef, state)
        model.forward_batch(batch, Ctx(capture=True))
        rows = model.attention_rows(batch)
        out = {}
        for k, layer, attn in attention_layers(model):
            values = {name: v[0] for name, v in nnx.to_pure_dict(nnx.pop(attn, nnx.Intermediate)).items()}
            out[f"{k}/{layer}"] = {**values, "valid_queries": rows[k][0], "valid_keys": rows[k][1]}
        return out
    return captured


def as_layers(captured: dict) -> dict[str, dict[str, np.ndarray]]:
    """Captured arrays as numpy: maps ``[B, N, T, S]``, head outputs, and each layer's real query rows ``[B, T]``
    and the keys each row sees ``[B, T, S]`` (causal decoder rows see the targets <= t), so statistics such as the
    share of zero weights do not count padding or the future keys the causal mask hides."""
    return {name: {"maps": np.asarray(v["attention_weights"]), "valid_keys": np.asarray(v["valid_keys"]),
                   "valid_queries": np.asarray(v["valid_queries"]), "head_outputs": np.asarray(v["head_outputs"])}
            for name, v in captured.items()}


def track_summary(layers: dict[str, dict[str, np.ndarray]]) -> dict[str, float]:
    """Scalars to log per layer: the :data:`~attn_lab.train.diagnostics.HEAD_STATS` training tracks (per head, e.g.
    normalized entropy, or as the layer's mean), between-head means and the number of flagged heads."""
    out = {}
    for name, c in layers.items():
        report = diagnostics.layer_report(c["maps"], c["valid_keys"], c["head_outputs"], c.get("valid_queries"))
        for key, tracked in diagnostics.HEAD_STATS.items():
            if tracked == "head":
                out.update({f"heads/{name}/{key}/h{i}": value for i, value in enumerate(report[key])})
            elif tracked == "mean":
                out[f"heads/{name}/{key}"] = float(np.mean(report[key]))
        out.update({f"heads/{name}/{key}": report[key] for key in ("mean_js", "mean_similarity")})
        out.update({f"heads/{name}/{flag}_heads": float(len(report["flags"][flag])) for flag in ("dead", "duplicate")})
    return out
