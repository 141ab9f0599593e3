"""Attention kernels that learn their own shape: their penalty in the loss and their per-head values in the logs.

Adaptive span learns how far each head looks back (Sukhbaatar et al. 2019) and pays ``loss.span.weight`` times the
mean span of each layer, summed over layers, as in the paper; entmax can learn each head's alpha (Correia et al.
2019). The kernels say what they learn (``AttentionKernel.penalty_key``, ``penalty()``, ``learned()``), so nothing
here names a kernel: a new kernel with a learned shape is picked up by defining those.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from attn_lab.models import attention_layers

PENALTIES = ("span",)  # config.loss.<key>.weight for each penalty_key a kernel may declare


def default_config() -> dict[str, ml_collections.ConfigDict]:
    """``config.loss.span.weight``: Sukhbaatar et al.'s lambda (their released scripts use 5e-7 per token of mean span
    at S = 8192); 0 trains the spans by the task loss alone."""
    return {key: ml_collections.ConfigDict({"weight": 0.0}) for key in PENALTIES}


def check_config(loss: Any, kernels: dict[str, Any]) -> None:
    """A penalty weight set for a kernel that nobody uses would silently do nothing: one line instead."""
    for key in PENALTIES:
        if loss[key].weight > 0 and not any(k.penalty_key == key for k in kernels.values()):
            used = ", ".join(f"{kind}: {k.name}" for kind, k in kernels.items())
            raise ValueError(f"loss.{key}.weight={loss[key].weight} needs an attention kernel with a {key} penalty "
                             f"(adaptive_span); the model uses {used}")


def active(loss: Any) -> bool:
    return any(loss[key].weight > 0 for key in PENALTIES)


def penalty(model: nnx.Module, loss: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(weight x sum over layers of each layer's penalty, ``{'<key>/penalty': unweighted sum}``)."""
    sums: dict[str, jax.Array] = {}
    for _, _, attn in attention_layers(model):
        key = attn.kernel.penalty_key
        if key is not None and loss[key].weight > 0:
            sums[key] = sums.get(key, jnp.zeros(())) + attn.kernel.penalty()
    total = sum((loss[key].weight * value for key, value in sums.items()), jnp.zeros(()))
    return total, {f"{key}/penalty": value for key, value in sums.items()}


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
