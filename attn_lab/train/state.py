"""A training state's model and back: the two helpers every consumer of a state needs (steps, decoding, beam search,
generation, capture, the analysis), kept apart from the train steps so that decoding does not import them.

The state is a plain pytree ``{'step', 'params', 'model_state', 'opt_state', 'rng'}`` (:mod:`attn_lab.train.steps`).
"""

from __future__ import annotations

from typing import Any

from flax import nnx


def merge(graphdef: Any, state: dict, params: Any = None) -> nnx.Module:
    """The model from a training state (optionally with other ``params``, e.g. the ones being differentiated)."""
    return nnx.merge(graphdef, state["params"] if params is None else params, state["model_state"])


def model_state(model: nnx.Module) -> Any:
    """The model's variables that are not trainable parameters, as a pure dict."""
    return nnx.to_pure_dict(nnx.split(model, nnx.Param, ...)[2])
