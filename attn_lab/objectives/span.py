"""Penalties of attention kernels that learn their own shape, e.g. adaptive span's mean span.

Adaptive span learns how far each head looks back (Sukhbaatar et al. 2019) and pays ``loss.span.weight`` times the
mean span of each layer, summed over layers, as in the paper. The kernels say what they pay for
(``AttentionKernel.penalty_key`` and ``penalty()``), so nothing here names a kernel: a new kernel with a learned
shape is picked up by declaring a ``penalty_key`` and registering a :class:`KernelPenalty` with that name.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from attn_lab.checks import NON_NEGATIVE, check_value
from attn_lab.objectives.base import LossTerm, ModelFacts, TermInputs, register_term


class KernelPenalty(LossTerm):
    """``weight x sum over layers`` of ``kernel.penalty()`` for the layers whose kernel's ``penalty_key`` is this
    term's name; logged unweighted as ``<name>/penalty``."""

    order = 30

    def check(self, cfg: Any, facts: ModelFacts) -> None:
        """A weight set for a kernel the model does not use would silently do nothing: one line instead."""
        check_value(f"{self.path}.weight", cfg.weight, NON_NEGATIVE)
        if cfg.weight > 0 and not any(k.penalty_key == self.name for k in facts.kernels.values()):
            used = ", ".join(f"{kind}: {k.name}" for kind, k in facts.kernels.items())
            raise ValueError(f"{self.path}.weight={cfg.weight} needs an attention kernel with a {self.name} penalty "
                             f"(adaptive_span); the model uses {used}")

    def __call__(self, cfg: Any, inputs: TermInputs) -> tuple[jax.Array, dict[str, jax.Array]]:
        layers = [layer.module.kernel for layer in inputs.layers if layer.module.kernel.penalty_key == self.name]
        if not layers:
            return jnp.zeros(()), {}
        summed = jnp.zeros(())
        for kernel in layers:
            summed = summed + kernel.penalty()
        return jnp.zeros(()) + cfg.weight * summed, {f"{self.name}/penalty": summed}


@register_term
class Span(KernelPenalty):
    """``config.loss.span.weight``: Sukhbaatar et al.'s lambda (their released scripts use 5e-7 per token of mean
    span at S = 8192); 0 trains the spans by the task loss alone."""

    name = "span"
