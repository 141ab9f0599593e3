"""Performer / FAVOR+ attention (Choromanski et al. 2020, "Rethinking Attention with Performers",
https://arxiv.org/abs/2009.14794).

Softmax similarity ``exp(q.k / sqrt(H))`` is estimated without bias by random features: with ``q, k`` scaled by
``H**-0.25`` and rows ``w`` of a projection ``W [F, H]``,

- positive (FAVOR+): ``phi(x) = exp(W x - |x|^2 / 2) / sqrt(F)``; every feature is positive, so the estimate of a
  small kernel value stays small and positive and the normalizer never changes sign (the paper's argument for
  them over trigonometric features, whose variance blows up exactly where softmax values are small);
- trigonometric: ``phi(x) = exp(|x|^2 / 2) [sin(W x), cos(W x)] / sqrt(F)`` (``2 F`` features).

Rows of ``W`` are block-orthogonal (QR of Gaussian blocks, rescaled by chi-distributed norms so each row keeps
the Gaussian row-norm law), which lowers the estimator's variance; ``orthogonal=False`` draws iid Gaussians.
Numerical stabilization as in the paper's code: the largest exponent is subtracted before ``exp`` -- per query row
for queries, one maximum over the (unpadded) keys of each batch element and key/value head for keys. Both are
constants of a row's numerator and denominator, so they cancel; they are ``stop_gradient`` so no gradient leaks
across positions through them. Attention itself (bidirectional and chunked causal) is shared with ``linear.py``.

The projection is state, not a parameter: a :class:`FeatureProjection` variable (optimizers filtering on
``nnx.Param`` skip it), redrawn every ``redraw_every`` training calls inside the call so it works under jit.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from attn_lab.attention.linear import KernelizedAttention
from attn_lab.attention.registry import register

FEATURES = ("positive", "trig")
SEED_RANGE = 2 ** 24  # seeds and the call counter are float32 (exact integers below 2**24): see FeatureProjection


@jax.jit
def _draw_seed(rng: jax.Array) -> jax.Array:
    return jax.random.randint(rng, (), 0, SEED_RANGE).astype(jnp.float32)


class FeatureProjection(nnx.Variable):
    """Random-feature state of a Performer kernel: the projection, its seed and the training-call counter.

    Not an ``nnx.Param``, so optimizers skip it. All leaves are float32 (integers stored exactly below 2**24) so a
    model's whole state stays differentiable as one pytree (``jax.grad`` refuses integer and key leaves).
    """


@functools.partial(jax.jit, static_argnums=(1, 2, 3))  # one compiled program, not dozens of eager ops at init
def gaussian_projection(rng: jax.Array, num_features: int, dim: int, orthogonal: bool) -> jax.Array:
    """``[num_features, dim]`` random projection: iid N(0, 1) rows, or block-orthogonal rows (QR of Gaussian
    ``[dim, dim]`` blocks) each rescaled by the norm of an independent Gaussian row (chi with ``dim`` dof)."""
    if not orthogonal:
        return jax.random.normal(rng, (num_features, dim), jnp.float32)
    blocks_rng, norms_rng = jax.random.split(rng)
    num_blocks = -(-num_features // dim)
    gauss = jax.random.normal(blocks_rng, (num_blocks, dim, dim), jnp.float32)  # (nb, H, H)
    q, r = jnp.linalg.qr(gauss)  # orthonormal columns
    q = q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[:, None, :]  # sign fix: Haar, so rows are unbiased
    rows = jnp.swapaxes(q, -1, -2).reshape(num_blocks * dim, dim)[:num_features]  # (F, H) orthonormal per block
    norms = jnp.linalg.norm(jax.random.normal(norms_rng, (num_features, dim), jnp.float32), axis=-1)  # (F,)
    return rows * norms[:, None]


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def draw_projection(seed: jax.Array, index: jax.Array, num_features: int, dim: int, orthogonal: bool) -> jax.Array:
    """Projection number ``index`` of the stream ``seed`` (float32 holding an integer): ``fold_in(key(seed), index)``."""
    rng = jax.random.fold_in(jax.random.key(seed.astype(jnp.uint32)), index)
    return gaussian_projection(rng, num_features, dim, orthogonal)


def _key_max(x: jax.Array, valid: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """Max of ``x [B, S, K, ...]`` over ``axes`` ignoring padded keys; 0 where every key is padded."""
    x = jnp.where(valid.reshape(valid.shape + (1,) * (x.ndim - 2)), x, -jnp.inf)
    m = jnp.max(x, axis=axes, keepdims=True)
    return jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))


def _project(x: jax.Array, proj: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(W x [..., F], |x|^2 / 2 [..., 1])``."""
    return jnp.einsum("...h,fh->...f", x, proj), 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)


def positive_offset(k: jax.Array, proj: jax.Array, valid: jax.Array) -> jax.Array:
    """The keys' stabilizer: max of ``W k`` over the (unpadded) keys and features, per batch and kv head."""
    return _key_max(_project(k, proj)[0], valid, axes=(1, 3))  # (B, 1, K, 1)


def trig_offset(k: jax.Array, proj: jax.Array, valid: jax.Array) -> jax.Array:
    """The keys' stabilizer for trigonometric features: max of ``|k|^2 / 2`` over the (unpadded) keys."""
    return _key_max(_project(k, proj)[1], valid, axes=(1, 3))  # (B, 1, K, 1)


def positive_features(x: jax.Array, proj: jax.Array, offset: jax.Array | None = None) -> jax.Array:
    """``exp(W x - |x|^2/2 - stab) / sqrt(F)``; stab is the row max for queries (``offset=None``) or the keys'
    shared ``offset``. ``x`` is ``[B, T, K, G, H]`` (query) or ``[B, S, K, H]`` (key)."""
    logits, diag = _project(x, proj)  # (..., F), (..., 1)
    stab = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True)) if offset is None else offset
    return jnp.exp(logits - diag - stab) / jnp.sqrt(proj.shape[0])


def trig_features(x: jax.Array, proj: jax.Array, offset: jax.Array | None = None) -> jax.Array:
    """``exp(|x|^2/2 - offset) [sin(W x), cos(W x)] / sqrt(F)`` for keys; for queries (``offset=None``) the
    ``exp(|q|^2/2)`` factor is a row constant and is dropped."""
    logits, diag = _project(x, proj)  # (..., F), (..., 1)
    trig = jnp.concatenate([jnp.sin(logits), jnp.cos(logits)], axis=-1) / jnp.sqrt(proj.shape[0])  # (..., 2F)
    return trig if offset is None else jnp.exp(diag - offset) * trig


@register("performer")
class PerformerAttention(KernelizedAttention):
    """FAVOR+ random-feature estimate of softmax attention (Choromanski et al. 2020).

    Options:
      num_features: random projections F (default 256; trig features have 2 F dimensions).
      features: 'positive' (default, FAVOR+) or 'trig'.
      orthogonal: block-orthogonal projection rows (default True) or iid Gaussian.
      redraw_every: 0 (default) keeps the projection drawn at init; N > 0 redraws it after every N training
        (``deterministic=False``) calls, from ``fold_in(seed, calls)``; deterministic calls neither count nor redraw.
      chunk_size: positions per chunk (default 256): features are computed and applied chunk by chunk, so
        memory is O(chunk * F) per step, not O(T * F); 0 = whole-sequence features.

    ``need_weights=True`` returns the implied (estimated, normalized) matrix; see ``linear.implied_weights``.
    """

    def __init__(self, *, num_features: int = 256, features: str = "positive", orthogonal: bool = True,
                 redraw_every: int = 0, chunk_size: int = 256, rngs: nnx.Rngs | None = None, **shared: Any):
        super().__init__(chunk_size=chunk_size, rngs=rngs, **shared)
        if features not in FEATURES:
            raise ValueError(f"attention.features must be one of {FEATURES}, got '{features}'")
        if num_features < 1 or redraw_every < 0:
            raise ValueError(f"attention.num_features must be >= 1 and redraw_every >= 0, "
                             f"got {num_features} and {redraw_every}")
        if rngs is None:
            raise ValueError("attention 'performer' needs rngs to draw its random features")
        self.num_features, self.feature_kind, self.orthogonal = num_features, features, orthogonal
        self.redraw_every = redraw_every
        rng = rngs.params()
        self.seed = FeatureProjection(_draw_seed(rng))
        self.calls = FeatureProjection(jnp.zeros((), jnp.float32))
        self.projection = FeatureProjection(self._draw(0))

    def _draw(self, index: jax.Array | int) -> jax.Array:
        """The projection for redraw ``index``: a pure function of (seed, index), so reproducible and jit-safe."""
        return draw_projection(self.seed[...], jnp.asarray(index, jnp.uint32), self.num_features, self.head_dim,
                               self.orthogonal)  # (F, H)

    def _maybe_redraw(self) -> None:
        """Counts one training call; on every ``redraw_every``-th, draws the projection the next calls use."""
        calls = self.calls[...] + 1.0
        self.calls[...] = calls
        redraw = jnp.mod(calls, self.redraw_every) == 0
        self.projection[...] = jax.lax.cond(redraw, lambda: self._draw(calls.astype(jnp.uint32)),
                                            lambda: self.projection[...])

    def feature_state(self, deterministic):
        proj = self.projection[...].astype(jnp.float32)  # (F, H): this call's features, before any redraw
        if self.redraw_every and not deterministic:
            self._maybe_redraw()
        return proj

    def _scaled(self, x: jax.Array) -> jax.Array:
        return x.astype(jnp.float32) * self.head_dim ** -0.25  # so phi(q).phi(k) estimates exp(q.k / sqrt(H))

    def key_offset(self, proj, key, valid):
        offset = positive_offset if self.feature_kind == "positive" else trig_offset
        return offset(self._scaled(key), proj, valid)  # (B, 1, K, 1)

    def query_features(self, proj, query):
        phi = positive_features if self.feature_kind == "positive" else trig_features
        return phi(self._scaled(query), proj)  # (B, T, K, G, F)

    def key_features(self, proj, key, valid, offset):
        phi = positive_features if self.feature_kind == "positive" else trig_features
        return phi(self._scaled(key), proj, offset)  # (B, S, K, F)
