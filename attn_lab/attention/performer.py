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

Numerical range. At the norms trained models produce (q, k ~ N(0, sigma^2), sigma up to 3, head_dim up to 128) the
exponents ``W x - |x|^2/2`` reach -80 (``exp`` underflows float32 below -87), so features must be scaled. Every
constant of a query row cancels, so queries drop ``|q|^2/2`` and subtract their largest ``W q`` (each row's largest
feature is ``1/sqrt(F)``). A key's ``|k|^2/2`` does not cancel: keys hand over ``(psi, s)`` with
``phi(k) = exp(s) psi``, ``s = max_f (W k - |k|^2/2)``, and the shared attention in ``linear.py`` weighs each key by
``exp(s_j - m)`` with ``m`` the running maximum over the keys that row may see -- the prefix ``j <= i`` in causal
mode, rescaled as it grows like online softmax, so no output depends on a later key or value by any path. Positive
features divide by their exact normalizer (only a row with no key at all, normalizer 0, outputs 0); trig
normalizers can cross zero and are clamped at ``|den| >= 1e-6`` in units where the row's largest key weight is 1.
(The paper's code subtracts a maximum over *all* keys, future ones included, and adds ``1e-6`` to every feature,
which biases small kernel values; the earlier version here clamped the normalizer at ``1e-6`` after the same global
shift and its outputs collapsed to ~0 at sigma >= 2.) Maxima are ``stop_gradient``: they cancel, so gradients are
exact. Against an independent log-space evaluation of the same estimator (same projection) the float32 output is
within ~3e-5 of mean |out| at sigma 3, head_dim 128 (tests/test_performer_numerics.py). The estimator itself is
another matter: unbiased, but its relative variance grows like ``exp(|q + k|^2 / sqrt(H)) / F``, so at sigma >= 1
its outputs are the right size but far from softmax's at any practical F (measured there too).

The projection is state, not a parameter: a :class:`FeatureProjection` variable (optimizers filtering on
``nnx.Param`` skip it), redrawn every ``redraw_every`` training calls inside the call so it works under jit.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from attn_lab.attention.linear import EPS, KernelizedAttention
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
    """Projection number ``index`` of the stream ``seed`` (a float32 holding an integer): ``fold_in(key(seed), i)``."""
    rng = jax.random.fold_in(jax.random.key(seed.astype(jnp.uint32)), index)
    return gaussian_projection(rng, num_features, dim, orthogonal)


def _project(x: jax.Array, proj: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(W x [..., F], |x|^2 / 2 [...])``."""
    return jnp.einsum("...h,fh->...f", x, proj), 0.5 * jnp.sum(x * x, axis=-1)


def positive_query_features(x: jax.Array, proj: jax.Array) -> jax.Array:
    """``exp(W x - max_f W x) / sqrt(F)``: FAVOR+ features ``exp(W x - |x|^2/2) / sqrt(F)`` divided by the row
    constant ``exp(max_f W x - |x|^2/2)``, which cancels in the row's ratio (the max is ``stop_gradient``).
    Largest feature: ``1 / sqrt(F)``."""
    logits = _project(x, proj)[0]  # (..., F)
    return jnp.exp(logits - jax.lax.stop_gradient(logits.max(-1, keepdims=True))) / jnp.sqrt(proj.shape[0])


def positive_key_parts(x: jax.Array, proj: jax.Array) -> tuple[jax.Array, jax.Array]:
    """FAVOR+ key features ``exp(W x - |x|^2/2) / sqrt(F)`` split as ``(psi, s)``: ``s = max_f (W x - |x|^2/2)``
    (no gradient) and ``psi = exp(W x - |x|^2/2 - s) / sqrt(F)``, whose largest entry is ``1 / sqrt(F)``."""
    logits, half_sq = _project(x, proj)  # (..., F), (...)
    expo = logits - half_sq[..., None]
    s = jax.lax.stop_gradient(expo.max(-1))  # (...)
    return jnp.exp(expo - s[..., None]) / jnp.sqrt(proj.shape[0]), s


def trig_query_features(x: jax.Array, proj: jax.Array) -> jax.Array:
    """``[sin(W x), cos(W x)] / sqrt(F)`` (``2 F`` features); the row factor ``exp(|x|^2 / 2)`` cancels."""
    logits = _project(x, proj)[0]  # (..., F)
    return jnp.concatenate([jnp.sin(logits), jnp.cos(logits)], axis=-1) / jnp.sqrt(proj.shape[0])


def trig_key_parts(x: jax.Array, proj: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``exp(|x|^2/2) [sin(W x), cos(W x)] / sqrt(F)`` split as ``(psi, s = |x|^2/2)``."""
    logits, half_sq = _project(x, proj)  # (..., F), (...)
    s = jax.lax.stop_gradient(half_sq)
    trig = jnp.concatenate([jnp.sin(logits), jnp.cos(logits)], axis=-1) / jnp.sqrt(proj.shape[0])
    return jnp.exp(half_sq - s)[..., None] * trig, s  # exp(0) = 1, kept for the gradient of |x|^2/2


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

    @property
    def normalizer_eps(self) -> float:
        return EPS if self.feature_kind == "trig" else 0.0  # trig normalizers can cross zero

    def query_features(self, proj, query):
        phi = positive_query_features if self.feature_kind == "positive" else trig_query_features
        return phi(self._scaled(query), proj)  # (B, T, K, G, F)

    def key_parts(self, proj, key):
        parts = positive_key_parts if self.feature_kind == "positive" else trig_key_parts
        return parts(self._scaled(key), proj)  # (B, S, K, F), (B, S, K)
