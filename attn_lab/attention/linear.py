"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs: Fast Autoregressive Transformers with
Linear Attention", https://arxiv.org/abs/2006.16236).

Softmax similarity ``exp(q.k)`` is replaced by a kernel ``phi(q).phi(k)`` with the feature map
``phi(x) = elu(x) + 1`` (positive, so every normalizer is positive). Associativity then gives

- bidirectional: ``out_i = phi(q_i) (sum_j phi(k_j) v_j^T) / (phi(q_i) . sum_j phi(k_j))`` -- O(T) in length;
- causal: the same sums taken over the prefix ``j <= i``, computed by a scan over chunks of ``chunk_size``
  positions that carries the ``[F, H]`` state and inside a chunk uses the masked quadratic form, so memory is
  ``O(T / chunk * F * H)`` instead of the ``O(T * F * H)`` of plain prefix sums (``chunk_size=0``).

The feature-space routines here (:func:`kernelized_attention`, :func:`implied_weights`, :func:`causal_prefix`)
take any feature maps, so other kernelized variants (``performer.py``) share them rather than copy them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from attn_lab.attention.dense import group_heads
from attn_lab.attention.registry import AttentionKernel, key_padding, register

EPS = 1e-6  # normalizers with |den| < EPS are clamped, so fully masked rows give 0 instead of NaN


def safe_normalizer(den: jax.Array, eps: float = EPS) -> jax.Array:
    """Clamps ``|den| < eps`` to ``eps`` (sign-preserving for signed features), leaving other values untouched so
    a constant rescaling of the features still cancels exactly (no value or gradient leak across positions)."""
    return jnp.where(jnp.abs(den) < eps, eps, den)


def mask_keys(k_feat: jax.Array, valid: jax.Array | None) -> jax.Array:
    """Zeros the feature vectors ``[B, S, K, F]`` of padded keys (``valid [B, S]``): they then add nothing."""
    if valid is None:
        return k_feat
    return jnp.where(valid[:, :, None, None], k_feat, 0.0)  # (B, S, K, F)


def _quadratic(q_feat: jax.Array, k_feat: jax.Array, value: jax.Array, causal: bool):
    """Masked quadratic form on one block: unnormalized ``(num [B,T,K,G,H], den [B,T,K,G])``."""
    a = jnp.einsum("btkgf,bskf->bkgts", q_feat, k_feat)  # (B, K, G, T, S)
    if causal:
        a = jnp.where(jnp.tril(jnp.ones(a.shape[-2:], bool)), a, 0.0)
    num = jnp.einsum("bkgts,bskh->btkgh", a, value)  # (B, T, K, G, H)
    return num, a.sum(-1).transpose(0, 3, 1, 2)  # (B, T, K, G)


def _prefix_cumsum(q_feat: jax.Array, k_feat: jax.Array, value: jax.Array):
    """Causal sums by a cumulative sum of ``[F, H]`` outer products: simple, but O(T * F * H) memory."""
    kv = jnp.cumsum(jnp.einsum("bskf,bskh->bskfh", k_feat, value), axis=1)  # (B, T, K, F, H)
    z = jnp.cumsum(k_feat, axis=1)  # (B, T, K, F)
    return jnp.einsum("btkgf,btkfh->btkgh", q_feat, kv), jnp.einsum("btkgf,btkf->btkg", q_feat, z)


def _prefix_chunked(q_feat: jax.Array, k_feat: jax.Array, value: jax.Array, chunk: int):
    """Causal sums by ``lax.scan`` over chunks carrying ``(sum phi(k) v^T [B,K,F,H], sum phi(k) [B,K,F])``; only
    one state per chunk is kept for the backward pass."""
    b, t, k, g, f = q_feat.shape
    pad = -t % chunk
    if pad:  # padded keys have zero features and padded queries are cut off below: no effect on real positions
        q_feat, k_feat, value = (jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
                                 for x in (q_feat, k_feat, value))
    n = (t + pad) // chunk
    split = lambda x: jnp.moveaxis(x.reshape(b, n, chunk, *x.shape[2:]), 1, 0)  # (n, B, C, ...)

    def step(carry, xs):
        kv, z = carry  # (B, K, F, H), (B, K, F)
        qc, kc, vc = xs  # (B, C, K, G, F), (B, C, K, F), (B, C, K, H)
        num, den = _quadratic(qc, kc, vc, causal=True)
        num = num + jnp.einsum("bckgf,bkfh->bckgh", qc, kv)  # (B, C, K, G, H)
        den = den + jnp.einsum("bckgf,bkf->bckg", qc, z)  # (B, C, K, G)
        carry = (kv + jnp.einsum("bckf,bckh->bkfh", kc, vc), z + kc.sum(1))
        return carry, (num, den)

    init = (jnp.zeros((b, k, f, value.shape[-1]), q_feat.dtype), jnp.zeros((b, k, f), q_feat.dtype))
    _, (num, den) = jax.lax.scan(step, init, (split(q_feat), split(k_feat), split(value)))
    merge = lambda x: jnp.moveaxis(x, 0, 1).reshape(b, n * chunk, *x.shape[3:])[:, :t]
    return merge(num), merge(den)  # (B, T, K, G, H), (B, T, K, G)


def causal_prefix(q_feat: jax.Array, k_feat: jax.Array, value: jax.Array, chunk_size: int):
    """Unnormalized causal ``(num, den)``; ``chunk_size=0`` uses plain prefix sums, else the chunked scan."""
    if chunk_size <= 0:
        return _prefix_cumsum(q_feat, k_feat, value)
    return _prefix_chunked(q_feat, k_feat, value, min(chunk_size, q_feat.shape[1]))


def kernelized_attention(q_feat: jax.Array, k_feat: jax.Array, value: jax.Array, *, is_causal: bool,
                         chunk_size: int, eps: float = EPS) -> jax.Array:
    """``phi(Q) phi(K)^T V`` normalized per row, never forming ``[T, S]``.

    Args:
      q_feat: ``[B, T, K, G, F]`` query features (grouped: G query heads per key/value head).
      k_feat: ``[B, S, K, F]`` key features, padded keys already zeroed.
      value: ``[B, S, K, H]``.

    Returns:
      ``[B, T, K * G, H]``.
    """
    if is_causal:
        if q_feat.shape[1] != k_feat.shape[1]:  # top-left alignment: query i sees keys j <= i
            s = k_feat.shape[1]
            if s < q_feat.shape[1]:
                pad = [(0, 0), (0, q_feat.shape[1] - s), (0, 0), (0, 0)]
                k_feat, value = jnp.pad(k_feat, pad), jnp.pad(value, pad)
            else:
                k_feat, value = k_feat[:, :q_feat.shape[1]], value[:, :q_feat.shape[1]]
        num, den = causal_prefix(q_feat, k_feat, value, chunk_size)
    else:
        kv = jnp.einsum("bskf,bskh->bkfh", k_feat, value)  # (B, K, F, H)
        num = jnp.einsum("btkgf,bkfh->btkgh", q_feat, kv)  # (B, T, K, G, H)
        den = jnp.einsum("btkgf,bkf->btkg", q_feat, k_feat.sum(1))  # (B, T, K, G)
    out = num / safe_normalizer(den, eps)[..., None]  # (B, T, K, G, H)
    b, t, k, g, h = out.shape
    return out.reshape(b, t, k * g, h)


def implied_weights(q_feat: jax.Array, k_feat: jax.Array, *, is_causal: bool, eps: float = EPS) -> jax.Array:
    """The attention matrix ``[B, N, T, S]`` the kernel implies: ``phi(q_i).phi(k_j)`` over its row's sum (causal
    and padding applied, same clamp), so ``dense.apply_weights(weights, value)`` equals the kernel's output."""
    a = jnp.einsum("btkgf,bskf->bkgts", q_feat, k_feat)  # (B, K, G, T, S)
    if is_causal:
        a = jnp.where(jnp.tril(jnp.ones(a.shape[-2:], bool)), a, 0.0)
    w = a / safe_normalizer(a.sum(-1, keepdims=True), eps)
    b, k, g, t, s = w.shape
    return w.reshape(b, k * g, t, s)


class KernelizedAttention(AttentionKernel):
    """Shared call of kernelized kernels: subclasses only define :meth:`features`.

    ``need_weights=True`` returns the implied matrix ``[B, N, T, S]`` of :func:`implied_weights` (quadratic; for
    analysis only), such that ``out == dense.apply_weights(weights, value)``. No attention dropout: the fast path
    never forms the weights.
    """

    supports_dropout = False

    def __init__(self, *, chunk_size: int = 64, **shared: Any):
        super().__init__(**shared)
        if chunk_size < 0:
            raise ValueError(f"attention.chunk_size must be >= 0 (0 = unchunked prefix sums), got {chunk_size}")
        self.chunk_size = chunk_size

    def feature_state(self, deterministic: bool) -> Any:
        """Arrays the feature map needs this call (e.g. a random projection); stateful updates happen here."""
        return None

    def features(self, state: Any, query: jax.Array, key: jax.Array, valid: jax.Array | None
                 ) -> tuple[jax.Array, jax.Array]:
        """Pure: ``(q_feat [B, T, K, G, F], k_feat [B, S, K, F])`` in float32; padded keys may be left non-zero."""
        raise NotImplementedError

    def __call__(self, query, key, value, *, mask, is_causal, dropout_rng, dropout_rate, broadcast_dropout,
                 deterministic, precision, need_weights):
        valid = key_padding(mask, self.name)  # (B, S)
        state = self.feature_state(deterministic)

        def attend(query, key, value, state):  # (B, T, N, H) ...
            q_feat, k_feat = self.features(state, group_heads(query, key.shape[2]), key, valid)
            k_feat = mask_keys(k_feat, valid)  # (B, S, K, F)
            v = value.astype(jnp.float32)  # accumulate in float32 whatever the computation dtype
            out = kernelized_attention(q_feat, k_feat, v, is_causal=is_causal, chunk_size=self.chunk_size)
            return out, q_feat, k_feat

        if need_weights:
            out, q_feat, k_feat = attend(query, key, value, state)
            return out.astype(query.dtype), implied_weights(q_feat, k_feat, is_causal=is_causal).astype(query.dtype)
        # Recompute the [B, T, F] features in the backward pass instead of storing them: they dominate memory.
        out = jax.checkpoint(lambda *args: attend(*args)[0])(query, key, value, state)
        return out.astype(query.dtype), None


@register("linear")
class LinearAttention(KernelizedAttention):
    """Linear attention with ``phi(x) = elu(x) + 1`` (Katharopoulos et al. 2020).

    Options:
      chunk_size: positions per chunk of the causal scan (default 64; 0 = plain prefix sums, O(T F H) memory).
    """

    def features(self, state, query, key, valid):
        phi = lambda x: jax.nn.elu(x.astype(jnp.float32)) + 1.0
        return phi(query), phi(key)  # (B, T, K, G, H), (B, S, K, H)
