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
from attn_lab.train.steps import merge


def capture_step(graphdef: Any) -> Callable[[dict, dict], dict]:
    """``(state, batch) -> {'<kind>/<layer>': {'attention_weights', 'head_outputs', 'values'}}`` (pure, jittable)."""
    def captured(state: dict, batch: dict) -> dict:
        model = merge(graphdef, state)
        model.forward_batch(batch, Ctx(capture=True))
        return {f"{k}/{layer}": {name: v[0] for name, v in nnx.to_pure_dict(nnx.pop(attn, nnx.Intermediate)).items()}
                for k, layer, attn in attention_layers(model)}
    return captured


def as_layers(captured: dict, batch: dict) -> dict[str, dict[str, np.ndarray]]:
    """Captured arrays as numpy, with each layer's key validity and query validity ``[B, T]`` (encoder
    self-attention: source side; decoder self- and cross-attention: target side). Keys are ``[B, S]`` (source
    padding), except in the causal decoder self-attention: ``[B, T, S]``, row t seeing the valid targets <= t, so
    statistics such as the share of zero weights do not count the future keys the causal mask hides."""
    out = {}
    for name, values in captured.items():
        maps = np.asarray(values["attention_weights"])  # (B, N, T, S)
        causal = name.startswith("decoder_self")
        keys = np.asarray(batch["targets"] if causal else batch["inputs"]) != 0
        if causal:
            keys = keys[:, None, :] & np.tri(maps.shape[-2], maps.shape[-1], dtype=bool)  # (B, T, S)
        queries = np.asarray(batch["inputs"] if name.startswith("encoder_self") else batch["targets"]) != 0
        if maps.shape[-1] == keys.shape[-1] + 1:  # classifier with a CLS token in front
            keys = np.pad(keys, ((0, 0), (1, 0)), constant_values=True)
            queries = keys
        out[name] = {"maps": maps, "valid_keys": keys, "valid_queries": queries,
                     "head_outputs": np.asarray(values["head_outputs"])}
    return out


def track_summary(layers: dict[str, dict[str, np.ndarray]]) -> dict[str, float]:
    """Scalars to log per layer: per-head normalized entropy, layer means and the number of flagged heads."""
    out = {}
    for name, c in layers.items():
        report = diagnostics.layer_report(c["maps"], c["valid_keys"], c["head_outputs"], c.get("valid_queries"))
        for i, value in enumerate(report["entropy"]):
            out[f"heads/{name}/entropy/h{i}"] = value
        for key in ("distance", "self", "zeros"):
            out[f"heads/{name}/{key}"] = float(np.mean(report[key]))
        out.update({f"heads/{name}/{key}": report[key] for key in ("mean_js", "mean_similarity")})
        out.update({f"heads/{name}/{flag}_heads": float(len(report["flags"][flag])) for flag in ("dead", "duplicate")})
    return out
