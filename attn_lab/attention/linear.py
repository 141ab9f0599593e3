"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs: Fast Autoregressive Transformers with
Linear Attention", https://arxiv.org/abs/2006.16236).

Softmax similarity ``exp(q.k)`` is replaced by a kernel ``phi(q).phi(k)`` with the feature map
``phi(x) = elu(x) + 1`` (positive, so every normalizer is positive). Associativity then gives

- bidirectional: ``out_i = phi(q_i) (sum_j phi(k_j) v_j^T) / (phi(q_i) . sum_j phi(k_j))`` -- O(T) in length;
- causal: the same sums taken over the prefix ``j <= i``.

Both are computed chunk by chunk (``chunk_size`` positions): a scan over key chunks (causal: one scan carrying the
``[F, H]`` state, with the masked quadratic form inside a chunk) that computes the features inside its
rematerialized body, so memory is O(chunk * F) per step instead of the O(T * F) of whole-sequence features
(``chunk_size=0``). The routines here take any feature maps, so other kernelized variants (``performer.py``) share
them rather than copy them.
"""

from __future__ import annotations

from typing import Any, Callable

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


def _chunks(x: jax.Array, chunk: int) -> jax.Array:
    """``[B, T, ...] -> [T / chunk, B, chunk, ...]`` (T padded with zeros to a multiple of ``chunk``)."""
    b, t = x.shape[:2]
    x = jnp.pad(x, [(0, 0), (0, -t % chunk)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(b, -1, chunk, *x.shape[2:]), 1, 0)


def _unchunk(x: jax.Array, t: int) -> jax.Array:
    """Inverse of :func:`_chunks`: ``[n, B, chunk, ...] -> [B, T, ...]``."""
    return jnp.moveaxis(x, 0, 1).reshape(x.shape[1], -1, *x.shape[3:])[:, :t]


def _sums_init(k_fn: Callable, key: jax.Array, valid: jax.Array, value: jax.Array):
    """Zero ``(sum phi(k) v^T [B, K, F, H], sum phi(k) [B, K, F])``, F read off the feature map's shape."""
    f = jax.eval_shape(lambda: k_fn(key[:, :1], valid[:, :1])).shape[-1]
    b, k, h = value.shape[0], value.shape[2], value.shape[-1]
    return jnp.zeros((b, k, f, h), jnp.float32), jnp.zeros((b, k, f), jnp.float32)


def bidirectional_chunked(q_fn: Callable, k_fn: Callable, query, key, value, valid, chunk: int,
                          eps: float = EPS) -> jax.Array:
    """Normalized bidirectional output, features computed chunk by chunk (never ``[T, F]`` at once).

    A ``lax.scan`` over key chunks sums ``phi(k) v^T`` and ``phi(k)``; a ``lax.map`` over query chunks applies
    them. Both bodies are rematerialized, so the backward pass holds one chunk's features at a time.
    """
    @jax.checkpoint
    def add_keys(carry, xs):
        kc, vc, valc = xs  # (B, C, K, H), (B, C, K, H), (B, C)
        kf = mask_keys(k_fn(kc, valc), valc)  # (B, C, K, F)
        return (carry[0] + jnp.einsum("bckf,bckh->bkfh", kf, vc), carry[1] + kf.sum(1)), None

    xs = (_chunks(key, chunk), _chunks(value, chunk), _chunks(valid, chunk))
    (kv, z), _ = jax.lax.scan(add_keys, _sums_init(k_fn, key, valid, value), xs)

    @jax.checkpoint
    def apply(qc):  # (B, C, K, G, H)
        qf = q_fn(qc)  # (B, C, K, G, F)
        num = jnp.einsum("bckgf,bkfh->bckgh", qf, kv)  # (B, C, K, G, H)
        return num / safe_normalizer(jnp.einsum("bckgf,bkf->bckg", qf, z), eps)[..., None]

    return _unchunk(jax.lax.map(apply, _chunks(query, chunk)), query.shape[1])  # (B, T, K, G, H)


def causal_chunked(q_fn: Callable, k_fn: Callable, query, key, value, valid, chunk: int,
                   eps: float = EPS) -> jax.Array:
    """Normalized causal output by a ``lax.scan`` over chunks carrying ``(sum phi(k) v^T, sum phi(k))``; inside a
    chunk the masked quadratic form. Features are computed per chunk and rematerialized in the backward pass."""
    @jax.checkpoint
    def step(carry, xs):
        kv, z = carry  # (B, K, F, H), (B, K, F)
        qc, kc, vc, valc = xs  # (B, C, K, G, H), (B, C, K, H), (B, C, K, H), (B, C)
        qf, kf = q_fn(qc), mask_keys(k_fn(kc, valc), valc)  # (B, C, K, G, F), (B, C, K, F)
        num, den = _quadratic(qf, kf, vc, causal=True)
        num = num + jnp.einsum("bckgf,bkfh->bckgh", qf, kv)  # (B, C, K, G, H)
        den = den + jnp.einsum("bckgf,bkf->bckg", qf, z)  # (B, C, K, G)
        carry = (kv + jnp.einsum("bckf,bckh->bkfh", kf, vc), z + kf.sum(1))
        return carry, num / safe_normalizer(den, eps)[..., None]

    xs = (_chunks(query, chunk), _chunks(key, chunk), _chunks(value, chunk), _chunks(valid, chunk))
    return _unchunk(jax.lax.scan(step, _sums_init(k_fn, key, valid, value), xs)[1], query.shape[1])


def kernelized_attention(q_feat: jax.Array, k_feat: jax.Array, value: jax.Array, *, is_causal: bool,
                         eps: float = EPS) -> jax.Array:
    """``phi(Q) phi(K)^T V`` normalized per row from whole feature arrays (the unchunked path, ``chunk_size=0``).

    Args:
      q_feat: ``[B, T, K, G, F]`` query features (grouped: G query heads per key/value head).
      k_feat: ``[B, S, K, F]`` key features, padded keys already zeroed.
      value: ``[B, S, K, H]``.

    Returns:
      ``[B, T, K, G, H]``.
    """
    if is_causal:
        num, den = _prefix_cumsum(q_feat, k_feat, value)
    else:
        kv = jnp.einsum("bskf,bskh->bkfh", k_feat, value)  # (B, K, F, H)
        num = jnp.einsum("btkgf,bkfh->btkgh", q_feat, kv)  # (B, T, K, G, H)
        den = jnp.einsum("btkgf,bkf->btkg", q_feat, k_feat.sum(1))  # (B, T, K, G)
    return num / safe_normalizer(den, eps)[..., None]  # (B, T, K, G, H)


def align_causal(key: jax.Array, value: jax.Array, valid: jax.Array, t: int):
    """Top-left causal alignment when ``q_len != kv_len``: query i sees keys j <= i, so keys past T never count
    and missing ones are padding."""
    s = key.shape[1]
    if s >= t:
        return key[:, :t], value[:, :t], valid[:, :t]
    pad = lambda x: jnp.pad(x, [(0, 0), (0, t - s)] + [(0, 0)] * (x.ndim - 2))
    return pad(key), pad(value), pad(valid)


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
    """Shared call of kernelized kernels: subclasses define their feature maps (pure functions of a per-call
    ``feature_state`` and, for keys, a ``key_offset`` -- a constant over all keys such as a stabilizing max).

    ``need_weights=True`` returns the implied matrix ``[B, N, T, S]`` of :func:`implied_weights` (quadratic; for
    analysis only), such that ``out == dense.apply_weights(weights, value)``. No attention dropout: the fast path
    never forms the weights.
    """

    supports_dropout = False

    def __init__(self, *, chunk_size: int = 256, **shared: Any):
        super().__init__(**shared)
        if chunk_size < 0:
            raise ValueError(f"attention.chunk_size must be >= 0 (0 = unchunked), got {chunk_size}")
        self.chunk_size = chunk_size

    def feature_state(self, deterministic: bool) -> Any:
        """Arrays the feature maps need this call (e.g. a random projection); stateful updates happen here."""
        return None

    def key_offset(self, state: Any, key: jax.Array, valid: jax.Array) -> Any:
        """A constant shared by all key features (computed once over all keys, no gradient); None by default."""
        return None

    def query_features(self, state: Any, query: jax.Array) -> jax.Array:
        """``[B, T, K, G, H] -> [B, T, K, G, F]`` float32; row-local, so it can be applied chunk by chunk."""
        raise NotImplementedError

    def key_features(self, state: Any, key: jax.Array, valid: jax.Array, offset: Any) -> jax.Array:
        """``[B, S, K, H] -> [B, S, K, F]`` float32; padded keys may be left non-zero (they are zeroed after)."""
        raise NotImplementedError

    def __call__(self, query, key, value, *, mask, is_causal, dropout_rng, dropout_rate, broadcast_dropout,
                 deterministic, precision, need_weights):
        pad = key_padding(mask, self.name)  # (B, S) or None
        valid = jnp.ones(key.shape[:2], bool) if pad is None else pad  # (B, S)
        state = self.feature_state(deterministic)
        offset = self.key_offset(state, key, valid)
        query, value = group_heads(query, key.shape[2]), value.astype(jnp.float32)  # (B, T, K, G, H), (B, S, K, H)
        if is_causal:
            key, value, valid = align_causal(key, value, valid, query.shape[1])
        q_fn = lambda q: self.query_features(state, q)
        k_fn = lambda k, val: self.key_features(state, k, val, offset)
        if need_weights or self.chunk_size == 0:
            q_feat, k_feat = q_fn(query), mask_keys(k_fn(key, valid), valid)
            out = kernelized_attention(q_feat, k_feat, value, is_causal=is_causal)
            weights = implied_weights(q_feat, k_feat, is_causal=is_causal) if need_weights else None
        else:
            chunk = min(self.chunk_size, query.shape[1], key.shape[1])
            attend = causal_chunked if is_causal else bidirectional_chunked
            out, weights = attend(q_fn, k_fn, query, key, value, valid, chunk), None
        b, t, k, g, h = out.shape
        out = out.reshape(b, t, k * g, h).astype(query.dtype)  # (B, T, N, H)
        return out, None if weights is None else weights.astype(query.dtype)


@register("linear")
class LinearAttention(KernelizedAttention):
    """Linear attention with ``phi(x) = elu(x) + 1`` (Katharopoulos et al. 2020).

    Options:
      chunk_size: positions per chunk (default 256): features are computed chunk by chunk (bidirectional: a scan
        over key chunks, then query chunks; causal: one scan with the masked quadratic form inside a chunk), so
        memory is O(chunk * F) per step; 0 = whole-sequence features and plain prefix sums.
    """

    def query_features(self, state, query):
        return jax.nn.elu(query.astype(jnp.float32)) + 1.0  # (B, T, K, G, H)

    def key_features(self, state, key, valid, offset):
        return jax.nn.elu(key.astype(jnp.float32)) + 1.0  # (B, S, K, H)
