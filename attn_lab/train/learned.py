"""Attention kernels that learn their own shape: their per-head values in the logs and in results.json.

Adaptive span learns how far each head looks back (Sukhbaatar et al. 2019), entmax can learn each head's alpha
(Correia et al. 2019). The kernels say what they learn (``AttentionKernel.learned()``), so nothing here names a
kernel; their penalty in the loss is a loss term (:mod:`attn_lab.objectives.span`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flax import nnx

from attn_lab.models import attention_layers


def per_head(model: nnx.Module) -> dict[str, dict[str, np.ndarray]]:
    """``{'<kind>/<layer>': {'span' | 'alpha': [num_heads]}}`` for every layer whose kernel learns something."""
    out = {}
    for kind, layer, attn in attention_layers(model):
        values = {name: np.asarray(v, np.float64) for name, v in attn.kernel.learned().items()}
        if values:
            out[f"{kind}/{layer}"] = values
    return out


def scalars(learned: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Flat log keys: ``learned/<kind>/<layer>/<name>/h<i>`` per head plus the layer mean."""
    out = {}
    for layer, values in learned.items():
        for name, heads in values.items():
            out |= {f"learned/{layer}/{name}/h{i}": float(v) for i, v in enumerate(heads)}
            out[f"learned/{layer}/{name}/mean"] = float(np.mean(heads))
    return out
