"""Hard-concrete (L0) head gates (Louizos et al. 2018, as used for heads by Voita et al. 2019).

Each head of each attention kind gets a gate ``z`` in [0, 1] multiplying its output (through the models' head
masks). In training ``z`` is a stretched, clipped sample of a binary-concrete variable with learned location
``log_alpha``, so exact zeros have positive probability and the expected number of open gates,
``sum_h P(z_h != 0)``, is differentiable: that is the L0 penalty. At test time the gates are binarized
(the ``k`` heads with the largest ``log_alpha`` get 1, the others 0; see :func:`binarize`), so evaluation runs a
truly pruned model.

Two ways to ask for sparsity (``config.heads.gates``):
- ``l0 = lambda``: loss += lambda * sum_h P(z_h != 0) (Voita et al.'s penalty; the number of heads kept follows);
- ``target = 0.25``: keep 25% of heads. The constraint ``kept share = target`` enters the loss as
  ``lambda1 * gap + lambda2 * gap**2`` (gap = expected kept share - target; Wang et al. 2020, "Structured Pruning
  of Large Language Models"), with the multipliers (state, not parameters) moved by gradient ascent each step:
  the linear term pushes towards the target from either side, the growing quadratic term damps the overshoot,
  and the target itself falls linearly from 1 over the first ``anneal`` share of training (as Wang et al. do).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

BETA, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1  # temperature and stretch interval of Louizos et al.


class Multiplier(nnx.Variable):
    """The Lagrange multipliers ``[lambda1, lambda2]`` of the target constraint: moved by ascent, not the optimizer."""


class HeadGates(nnx.Module):
    """``log_alpha`` per attention kind ``[layers, heads]``; calls return gates to multiply into head masks."""

    def __init__(self, shapes: dict[str, tuple[int, int]], init: float = 3.0, target: float | None = None):
        self.kinds, self.target = tuple(shapes), target
        self.log_alpha = nnx.Dict({k: nnx.Param(jnp.full(s, init, jnp.float32)) for k, s in shapes.items()})
        self.multiplier = Multiplier(jnp.zeros((2,), jnp.float32))

    def __call__(self, kinds: tuple[str, ...], batch: int, deterministic: bool,
                 rngs: nnx.Rngs | None) -> dict[str, jax.Array]:
        """Gates for ``kinds``: ``[batch, L, N]`` samples in training, binary ``[L, N]`` when deterministic."""
        log_alpha = {k: self.log_alpha[k][...] for k in self.kinds}  # each (L, N)
        if deterministic:
            return {k: v for k, v in binarize(log_alpha, self.target).items() if k in kinds}
        out = {}
        for kind in kinds:
            u = jax.random.uniform(rngs.dropout(), (batch, *log_alpha[kind].shape), minval=1e-6, maxval=1 - 1e-6)
            s = jax.nn.sigmoid((jnp.log(u) - jnp.log1p(-u) + log_alpha[kind]) / BETA)  # (B, L, N)
            out[kind] = jnp.clip(s * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)
        return out

    def open_probability(self) -> jax.Array:
        """``P(z_h != 0)`` for every head of every kind, concatenated ``[total heads]``."""
        return open_probability({k: self.log_alpha[k][...] for k in self.kinds})

    def penalty(self, gcfg: Any, progress: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The sparsity loss term for ``config.heads.gates`` at ``progress`` (share of training done); with a target,
        also takes one dual-ascent step."""
        p = self.open_probability()  # (heads,)
        kept = p.mean()
        loss = gcfg.l0 * p.sum()
        terms = {"gates/expected_kept": kept, "gates/l0": p.sum()}
        if gcfg.target is not None:  # Wang et al. 2020: lambda1 * gap + lambda2 * gap^2, both raised by ascent
            # the target falls linearly from 1 over the first `anneal` of training: closed gates get no gradient
            # to reopen, so an abrupt target overshoots
            target = 1.0 - (1.0 - gcfg.target) * jnp.minimum(progress / max(gcfg.anneal, 1e-9), 1.0)
            gap = kept - target
            terms["gates/target"] = target
            lam = self.multiplier[...]  # (2,)
            loss = loss + lam[0] * gap + lam[1] * gap ** 2
            step = jax.lax.stop_gradient(jnp.stack([gap, gap ** 2]))
            self.multiplier[...] = lam + gcfg.dual_lr * step
            terms |= {"gates/lambda1": lam[0], "gates/lambda2": lam[1]}
        return loss, terms


def open_probability(log_alpha: dict[str, jax.Array]) -> jax.Array:
    """``P(z_h != 0) = sigmoid(log_alpha - beta * log(-gamma / zeta))`` of every head, concatenated."""
    shift = BETA * math.log(-GAMMA / ZETA)
    return jnp.concatenate([jax.nn.sigmoid(v - shift).ravel() for v in log_alpha.values()])


def binarize(log_alpha: dict[str, jax.Array], target: float | None = None) -> dict[str, jax.Array]:
    """Test-time gates: the ``k`` heads with the largest ``log_alpha`` (over all kinds) get 1, the rest 0.

    ``k = round(target * heads)`` when a target share was asked for (the constraint decides which heads survive;
    the count is what the user asked, even while the dual ascent still oscillates around it), else
    ``k = round(sum_h P(z_h != 0))``, the expected L0 norm the penalty trained.
    """
    flat = jnp.concatenate([v.ravel() for v in log_alpha.values()])  # (heads,)
    if target is None:
        k = jnp.round(open_probability(log_alpha).sum()).astype(jnp.int32)
    else:
        k = jnp.int32(max(1, round(target * flat.size)))
    top = jnp.sort(flat)[::-1]
    threshold = jnp.where(k > 0, top[jnp.maximum(k - 1, 0)], jnp.inf)
    return {kind: (v >= threshold).astype(jnp.float32) for kind, v in log_alpha.items()}


def binary_gates(params: dict, target: float | None = None) -> dict[str, list[list[float]]] | None:
    """Test-time 0/1 gates per kind from a (pure dict) parameter tree; None when the model has no gates."""
    if "gates" not in params:
        return None
    return {k: np.asarray(v).tolist() for k, v in binarize(
        {k: jnp.asarray(v) for k, v in params["gates"]["log_alpha"].items()}, target).items()}
