"""Sparse attention by alpha-entmax instead of softmax (Peters et al. 2019, "Sparse Sequence-to-Sequence Models";
Correia et al. 2019, "Adaptively Sparse Transformers").

``entmax_alpha(z) = argmax_p <p, z> + H_alpha(p)`` over the simplex, with Tsallis entropy ``H_alpha``. Its solution
is ``p_i = [(alpha - 1) z_i - tau]_+ ^ (1 / (alpha - 1))`` with the threshold ``tau`` that makes ``p`` sum to one,
so keys scoring below the threshold get weight *exactly* zero. ``alpha -> 1`` is softmax, ``alpha = 2`` sparsemax
(the Euclidean projection onto the simplex), ``alpha = 1.5`` in between.

Thresholds: exact sort-based for alpha = 2 (Martins & Astudillo 2016) and alpha = 1.5 (Peters et al.'s exact
entmax15: a quadratic per candidate support size); bisection on ``tau`` for any other or learned alpha (Blondel
et al. 2019; the ``entmax`` package's ``entmax_bisect``). Derivatives come from a custom JVP, never from
differentiating the sort or the bisection loop: with ``s = p^(2 - alpha)`` on the support (0 off it),
``dz = s * dp - s * <s, dp> / sum(s)``, and for alpha the closed form of Correia et al. (appendix B)::

    dp/dalpha = (p - s~) / (alpha - 1)^2 - (p log p - s~ * sum(p log p)) / (alpha - 1),   s~ = s / sum(s).

Normalization is computed in float32 at least (float64 stays float64), whatever the input dtype.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from attn_lab.attention.dense import apply_weights, attention_dropout, group_heads
from attn_lab.attention.registry import AttentionKernel, register

ALPHA_FLOOR = 1.01  # learned alpha = ALPHA_FLOOR + (2 - ALPHA_FLOOR) * sigmoid(a): stays in (1.01, 2]


def _compute_dtype(dtype: Any) -> Any:
    """float32 for half and single precision inputs, float64 for float64."""
    return jnp.promote_types(dtype, jnp.float32)


def _shift(z: jax.Array, keep: jax.Array) -> jax.Array:
    """Logits minus their row max over kept entries; dropped entries become -inf (a row keeping none: all -inf)."""
    z = jnp.where(keep, z, -jnp.inf)
    top = z.max(-1, keepdims=True)
    return z - jnp.where(jnp.isfinite(top), top, 0.0)


def _normalize(p: jax.Array, keep: jax.Array) -> jax.Array:
    """Zero outside ``keep`` and rescale to sum 1 (rows keeping nothing stay all zeros)."""
    p = jnp.where(keep, p, 0.0)
    total = p.sum(-1, keepdims=True)
    return p / jnp.where(total > 0, total, 1.0)


def _sorted_prefix(z: jax.Array, keep: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Kept logits sorted descending, zero past the kept count; ``valid`` marks kept slots; ``rho`` = 1..S."""
    zs = -jnp.sort(-z, axis=-1)  # (..., S); dropped (-inf) entries last
    rho = jnp.arange(1, z.shape[-1] + 1, dtype=z.dtype)  # (S,)
    valid = rho <= keep.sum(-1, keepdims=True)  # (..., S)
    return jnp.where(valid, zs, 0.0), valid, rho


def _sparsemax_forward(z: jax.Array, keep: jax.Array) -> jax.Array:
    """Exact sparsemax: the largest k with ``1 + k z_(k) > sum_{j<=k} z_(j)`` fixes ``tau``."""
    z = _shift(z, keep)
    zs, valid, rho = _sorted_prefix(z, keep)
    cs = jnp.cumsum(zs, axis=-1)  # (..., S)
    support = (valid & (1.0 + rho * zs > cs)).sum(-1, keepdims=True)  # (..., 1)
    k = jnp.maximum(support, 1)
    tau = (jnp.take_along_axis(cs, k - 1, -1) - 1.0) / k.astype(z.dtype)  # (..., 1)
    return _normalize(jnp.maximum(z - tau, 0.0), keep)


def _entmax15_forward(z: jax.Array, keep: jax.Array) -> jax.Array:
    """Exact 1.5-entmax (Peters et al. 2019, Alg. 2): for each support size k, the tau that solves
    ``sum_{j<=k} (x_(j) - tau)^2 = 1`` with ``x = z / 2``; the largest consistent k wins."""
    x = _shift(z, keep) / 2
    xs, valid, rho = _sorted_prefix(x, keep)
    mean = jnp.cumsum(xs, -1) / rho  # (..., S)
    mean_sq = jnp.cumsum(xs * xs, -1) / rho
    delta = (1.0 - rho * (mean_sq - mean * mean)) / rho
    tau = mean - jnp.sqrt(jnp.maximum(delta, 0.0))  # (..., S)
    support = (valid & (tau <= xs)).sum(-1, keepdims=True)  # (..., 1)
    tau_star = jnp.take_along_axis(tau, jnp.maximum(support, 1) - 1, -1)
    return _normalize(jnp.maximum(x - tau_star, 0.0) ** 2, keep)


def _bisect_forward(z: jax.Array, alpha: jax.Array, keep: jax.Array, n_iter: int) -> jax.Array:
    """Bisection on ``tau`` (Blondel et al. 2019): with the row max at 0, ``tau`` lies in
    ``[-1, -(1/d)^(alpha-1)]`` for d kept entries; each step halves the interval, keeping ``sum p(tau_lo) >= 1``."""
    x = _shift(z, keep) * (alpha - 1.0)  # (..., S)
    power = 1.0 / (alpha - 1.0)
    d = jnp.maximum(keep.sum(-1, keepdims=True), 1).astype(z.dtype)
    p_at = lambda tau: jnp.maximum(x - tau, 0.0) ** power  # (..., S)
    lo = jnp.full_like(d, -1.0) + jnp.zeros_like(alpha)
    width = -(1.0 / d) ** (alpha - 1.0) - lo

    def step(_, carry):
        lo, width = carry
        width = width / 2
        mid = lo + width
        return jnp.where(p_at(mid).sum(-1, keepdims=True) >= 1.0, mid, lo), width

    lo, width = jax.lax.fori_loop(0, n_iter, step, (lo, width))
    return _normalize(p_at(lo + width), keep)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _entmax_core(z: jax.Array, alpha: jax.Array, keep: jax.Array, method: str, n_iter: int) -> jax.Array:
    """entmax over the last axis; ``alpha [..., 1]``, ``keep`` boolean like ``z``; method picks the forward."""
    if method == "sparsemax":
        return _sparsemax_forward(z, keep)
    if method == "entmax15":
        return _entmax15_forward(z, keep)
    return _bisect_forward(z, alpha, keep, n_iter)


@_entmax_core.defjvp
def _core_jvp(method, n_iter, primals, tangents):
    """Exact entmax Jacobian (Peters et al. 2019, Prop. 1) and dp/dalpha (Correia et al. 2019, appendix B).

    A JVP rule rather than a VJP, so forward mode (``jax.jacfwd``) works too; it is linear in the tangents and
    the Jacobian in z is symmetric, so reverse mode transposes it into the same formula.
    """
    z, alpha, keep = primals
    dz, dalpha, _ = tangents
    p = _entmax_core(z, alpha, keep, method, n_iter)
    pos = p > 0
    s = jnp.where(pos, jnp.where(pos, p, 1.0) ** (2.0 - alpha), 0.0)  # (..., S); p^0 := 1 on the support only
    s_sum = s.sum(-1, keepdims=True)
    skew = s / jnp.where(s_sum > 0, s_sum, 1.0)  # (..., S)
    plogp = jnp.where(pos, p * jnp.log(jnp.where(pos, p, 1.0)), 0.0)
    dp_dalpha = (p - skew) / (alpha - 1.0) ** 2 - (plogp - skew * plogp.sum(-1, keepdims=True)) / (alpha - 1.0)
    return p, s * dz - skew * (s * dz).sum(-1, keepdims=True) + dp_dalpha * dalpha


def entmax(logits: jax.Array, alpha: float | jax.Array = 1.5, axis: int = -1, *, where: jax.Array | None = None,
           n_iter: int = 50) -> jax.Array:
    """alpha-entmax of ``logits`` along ``axis``; weights sum to one with exact zeros below the threshold.

    Args:
      logits: any shape; computed in float32 (float64 stays float64), returned in that dtype.
      alpha: a Python float in (1, 2] (2 and 1.5 take the exact sort-based paths) or an array broadcastable to
        ``logits`` with size 1 along ``axis`` (per head, say): always bisection, differentiable in alpha.
      where: optional boolean like ``logits``; False entries get weight exactly 0 and never join the support.
        A row with no True entry returns zeros.
      n_iter: bisection steps (each halves the interval for tau; float32 settles after about 25).
    """
    dtype = _compute_dtype(logits.dtype)
    axis = axis % logits.ndim
    z = jnp.moveaxis(jnp.asarray(logits, dtype), axis, -1)  # (..., S)
    keep = jnp.ones(logits.shape, bool) if where is None else jnp.broadcast_to(where, logits.shape)
    keep = jnp.moveaxis(keep, axis, -1)  # (..., S)
    method = "bisect"
    if isinstance(alpha, (int, float)):
        method = {2.0: "sparsemax", 1.5: "entmax15"}.get(float(alpha), "bisect")
    row = logits.shape[:axis] + (1,) + logits.shape[axis + 1:]
    alpha_arr = jnp.moveaxis(jnp.broadcast_to(jnp.asarray(alpha, dtype), row), axis, -1)  # (..., 1)
    return jnp.moveaxis(_entmax_core(z, alpha_arr, keep, method, n_iter), -1, axis)


def sparsemax(logits: jax.Array, axis: int = -1, *, where: jax.Array | None = None) -> jax.Array:
    """Euclidean projection of ``logits`` onto the simplex (Martins & Astudillo 2016): 2-entmax, exact."""
    return entmax(logits, 2.0, axis, where=where)


def entmax15(logits: jax.Array, axis: int = -1, *, where: jax.Array | None = None) -> jax.Array:
    """1.5-entmax by Peters et al.'s exact sort-based algorithm."""
    return entmax(logits, 1.5, axis, where=where)


def _check_options(alpha: Any, learn_alpha: Any, n_iter: Any) -> None:
    """One-line ValueErrors naming the option, its value and what is allowed."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 1.0 < alpha <= 2.0:
        raise ValueError(f"attention.alpha must be a number in (1, 2] (2: sparsemax, near 1: softmax), got {alpha!r}")
    if not isinstance(learn_alpha, bool):
        raise ValueError(f"attention.learn_alpha must be True or False, got {learn_alpha!r}")
    if learn_alpha and not ALPHA_FLOOR < alpha < 2.0:
        raise ValueError(f"attention.alpha must be in ({ALPHA_FLOOR}, 2) with attention.learn_alpha=True "
                         f"(its initial value; learned alpha = {ALPHA_FLOOR} + 0.99 * sigmoid(a)), got {alpha!r}")
    if isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 1:
        raise ValueError(f"attention.n_iter must be a positive integer (bisection steps), got {n_iter!r}")


@register("entmax")
class EntmaxAttention(AttentionKernel):
    """Scaled dot-product attention with alpha-entmax in place of softmax (see the module docstring).

    Options:
      alpha: the entmax alpha in (1, 2]; 1.5 (default) and 2 (sparsemax) use exact sort-based thresholds, others
        bisection. With learn_alpha, the initial value of every head's alpha, in (1.01, 2).
      learn_alpha: one alpha per query head as an ``nnx.Param`` ``a`` with ``alpha = 1.01 + 0.99 sigmoid(a)``
        (Correia et al. 2019 clip at 1.01; a smooth map keeps the gradient alive at the floor), bisection path.
      n_iter: bisection steps for alphas without an exact path (default 50, as the entmax package).

    A query row whose keys are all masked averages all keys uniformly, as the dense kernel does; otherwise masked
    keys get weight exactly 0.
    """

    def __init__(self, *, alpha: float = 1.5, learn_alpha: bool = False, n_iter: int = 50, **shared: Any):
        super().__init__(**shared)
        _check_options(alpha, learn_alpha, n_iter)
        self.alpha, self.learn_alpha, self.n_iter = float(alpha), learn_alpha, n_iter
        u = (self.alpha - ALPHA_FLOOR) / (2.0 - ALPHA_FLOOR)  # sigmoid(a) at the initial alpha
        param_dtype = shared.get("param_dtype") or jnp.float32
        self.alpha_logit = (nnx.Param(jnp.full((self.num_heads,), math.log(u / (1.0 - u)), param_dtype))  # (N,)
                            if learn_alpha else nnx.data(None))

    def alphas(self) -> jax.Array:
        """Per-head alpha ``[num_heads]`` in float32 (the fixed option broadcast, or the learned values)."""
        if self.alpha_logit is None:
            return jnp.full((self.num_heads,), self.alpha, jnp.float32)
        a = self.alpha_logit[...].astype(jnp.float32)
        return ALPHA_FLOOR + (2.0 - ALPHA_FLOOR) * jax.nn.sigmoid(a)

    def learned(self) -> dict[str, jax.Array]:
        return {"alpha": self.alphas()}

    def _logits(self, query, key, mask, is_causal, precision) -> tuple[jax.Array, jax.Array]:
        """Scaled logits ``[B, N, T, S]`` and the boolean keep mask (rows keeping nothing see all keys at logit 0,
        so they average uniformly, as dense does)."""
        q = group_heads(query, key.shape[2]) / jnp.sqrt(query.shape[-1]).astype(query.dtype)  # (B, T, K, G, H)
        logits = jnp.einsum("btkgh,bskh->bkgts", q, key, precision=precision)  # (B, K, G, T, S)
        b, k, g, t, s = logits.shape
        logits = logits.reshape(b, k * g, t, s)  # (B, N, T, S)
        keep = jnp.ones((1, 1, t, s), bool) if mask is None else jnp.asarray(mask, bool)
        if is_causal:
            keep = keep & jnp.tril(jnp.ones((t, s), bool))  # top-left aligned, as dense
        keep = jnp.broadcast_to(keep, logits.shape)  # (B, N, T, S)
        blind = ~keep.any(-1, keepdims=True)  # (B, N, T, 1)
        return jnp.where(blind, 0.0, logits), keep | blind

    def __call__(self, query, key, value, *, mask, is_causal, dropout_rng, dropout_rate, broadcast_dropout,
                 deterministic, precision, need_weights):
        logits, keep = self._logits(query, key, mask, is_causal, precision)  # (B, N, T, S)
        alpha = self.alphas()[None, :, None, None] if self.learn_alpha else self.alpha  # (1, N, 1, 1) or float
        weights = entmax(logits, alpha, where=keep, n_iter=self.n_iter).astype(query.dtype)  # (B, N, T, S)
        dropping = dropout_rate > 0.0 and not deterministic
        probs = attention_dropout(weights, dropout_rng, dropout_rate, broadcast_dropout) if dropping else weights
        return apply_weights(probs, value, precision), (weights if need_weights else None)
