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

Scale. Exponential features (Performer's) span hundreds of orders of magnitude at the norms trained models produce,
so a kernel hands each key's features over in two parts: ``phi(k_j) = exp(s_j) * psi_j``, with ``psi_j`` of order
one and the log-scale ``s_j`` a number (see :meth:`KernelizedAttention.key_parts`). The sums here weight key ``j``
by ``exp(s_j - m)`` with ``m`` the largest log-scale among the keys that row may see -- the running maximum of
online softmax: causal rows use the prefix maximum over ``j <= i`` and the carried sums are rescaled when it grows,
so no output depends on a later key by any path, rounding included. ``m`` is a constant of its row's numerator and
denominator, so it cancels; every weight is ``<= 1``, the largest is exactly 1, and no absolute floor is put on the
normalizer: positive features divide by their exact (positive) denominator and only a row with no key at all
(denominator exactly 0) outputs 0. Signed features (trig) clamp ``|den| < eps`` in these same units.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp

from attn_lab.attention.dense import group_heads
from attn_lab.attention.registry import AttentionKernel, key_padding, register

EPS = 1e-6  # |den| floor for signed features, in units of the row's largest key weight (exactly 1)
FLOOR = -1e30  # log-scale of padded keys: below every real one, finite so FLOOR - FLOOR = 0 (never NaN)


def safe_normalizer(den: jax.Array, eps: float = 0.0) -> jax.Array:
    """The divisor for a row's numerator. ``eps == 0`` (positive features): ``den`` itself, 1 where it is exactly 0
    (a row with no key; its numerator is 0 too, so it outputs 0). ``eps > 0`` (signed features): ``|den| < eps``
    becomes ``+-eps``, keeping the sign. Other values are untouched, so scalings of the features cancel exactly."""
    if eps == 0.0:
        return jnp.where(den == 0.0, 1.0, den)
    return jnp.where(jnp.abs(den) < eps, jnp.where(den < 0.0, -eps, eps), den)


def mask_keys(k_feat: jax.Array, valid: jax.Array | None) -> jax.Array:
    """Zeros the feature vectors ``[B, S, K, F]`` of padded keys (``valid [B, S]``): they then add nothing."""
    if valid is None:
        return k_feat
    return jnp.where(valid[:, :, None, None], k_feat, 0.0)  # (B, S, K, F)


def mask_log_scale(log_scale: jax.Array, valid: jax.Array) -> jax.Array:
    """Log-scales ``[B, S, K]`` of padded keys (``valid [B, S]``) set to :data:`FLOOR`: they never set a maximum."""
    return jnp.where(valid[:, :, None], log_scale, FLOOR)  # (B, S, K)


def _key_weights(log_scale: jax.Array, top: jax.Array) -> jax.Array:
    """``exp(s - top)``, ``<= 1`` wherever ``top`` is a maximum over the keys included."""
    return jnp.exp(log_scale - top)


def _quadratic(q_feat, k_feat, log_scale, value, top):
    """Causal quadratic form on one chunk, prefix-stabilized: unnormalized ``(num [B,C,K,G,H], den [B,C,K,G])``.

    Query ``i`` weighs key ``j <= i`` by ``exp(s_j - top_i)``; ``top_i`` is the running maximum up to ``i``
    (``[B, C, K]``). Later keys get weight 0 through a masked exponent, so nothing about them enters row ``i``.
    """
    c = q_feat.shape[1]
    a = jnp.einsum("bikgf,bjkf->bkgij", q_feat, k_feat)  # (B, K, G, C, C)
    past = jnp.tril(jnp.ones((c, c), bool))  # (C_i, C_j)
    expo = log_scale.transpose(0, 2, 1)[:, :, None, :] - top.transpose(0, 2, 1)[:, :, :, None]  # (B, K, C_i, C_j)
    w = jnp.exp(jnp.where(past, expo, -jnp.inf))[:, :, None]  # (B, K, 1, C, C)
    a = a * w
    num = jnp.einsum("bkgij,bjkh->bikgh", a, value)  # (B, C, K, G, H)
    den = a.sum(-1).transpose(0, 3, 1, 2)  # (B, C, K, G)
    return num, den


def _fold_keys(carry, k_feat, log_scale, value):
    """Adds one block of keys to ``(top [B,K], sum w phi v^T [B,K,F,H], sum w phi [B,K,F])``, rescaling the carried
    sums when the running maximum ``top`` grows (online softmax)."""
    top, kv, z = carry
    new_top = jnp.maximum(top, log_scale.max(1))  # (B, K)
    r = jnp.exp(top - new_top)  # (B, K) <= 1
    kw = k_feat * _key_weights(log_scale, new_top[:, None])[..., None]  # (B, C, K, F)
    kv = kv * r[..., None, None] + jnp.einsum("bckf,bckh->bkfh", kw, value)
    return new_top, kv, z * r[..., None] + kw.sum(1)


def _chunks(x: jax.Array, chunk: int) -> jax.Array:
    """``[B, T, ...] -> [T / chunk, B, chunk, ...]`` (T padded with zeros to a multiple of ``chunk``)."""
    b, t = x.shape[:2]
    x = jnp.pad(x, [(0, 0), (0, -t % chunk)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(b, -1, chunk, *x.shape[2:]), 1, 0)


def _unchunk(x: jax.Array, t: int) -> jax.Array:
    """Inverse of :func:`_chunks`: ``[n, B, chunk, ...] -> [B, T, ...]``."""
    return jnp.moveaxis(x, 0, 1).reshape(x.shape[1], -1, *x.shape[3:])[:, :t]


def _sums_init(k_fn: Callable, key: jax.Array, value: jax.Array):
    """Empty ``(top [B, K] = FLOOR, sum [B, K, F, H], sum [B, K, F])``, F read off the feature map's shape."""
    f = jax.eval_shape(lambda: k_fn(key[:, :1])[0]).shape[-1]
    b, k, h = value.shape[0], value.shape[2], value.shape[-1]
    return (jnp.full((b, k), FLOOR, jnp.float32), jnp.zeros((b, k, f, h), jnp.float32),
            jnp.zeros((b, k, f), jnp.float32))


def _masked_parts(k_fn: Callable, key: jax.Array, valid: jax.Array):
    k_feat, log_scale = k_fn(key)  # (B, S, K, F), (B, S, K)
    return mask_keys(k_feat, valid), mask_log_scale(log_scale, valid)


def bidirectional_chunked(q_fn: Callable, k_fn: Callable, query, key, value, valid, chunk: int,
                          eps: float = 0.0) -> jax.Array:
    """Normalized bidirectional output, features computed chunk by chunk (never ``[T, F]`` at once).

    A ``lax.scan`` over key chunks sums ``w phi(k) v^T`` and ``w phi(k)`` (online rescaling to the running maximum
    log-scale); a ``lax.map`` over query chunks applies them. Both bodies are rematerialized, so the backward pass
    holds one chunk's features at a time.
    """
    @jax.checkpoint
    def add_keys(carry, xs):
        kc, vc, valc = xs  # (B, C, K, H), (B, C, K, H), (B, C)
        return _fold_keys(carry, *_masked_parts(k_fn, kc, valc), vc), None

    xs = (_chunks(key, chunk), _chunks(value, chunk), _chunks(valid, chunk))
    (_, kv, z), _ = jax.lax.scan(add_keys, _sums_init(k_fn, key, value), xs)

    @jax.checkpoint
    def apply(qc):  # (B, C, K, G, H)
        qf = q_fn(qc)  # (B, C, K, G, F)
        num = jnp.einsum("bckgf,bkfh->bckgh", qf, kv)  # (B, C, K, G, H)
        return num / safe_normalizer(jnp.einsum("bckgf,bkf->bckg", qf, z), eps)[..., None]

    return _unchunk(jax.lax.map(apply, _chunks(query, chunk)), query.shape[1])  # (B, T, K, G, H)


def causal_chunked(q_fn: Callable, k_fn: Callable, query, key, value, valid, chunk: int,
                   eps: float = 0.0) -> jax.Array:
    """Normalized causal output by a ``lax.scan`` over chunks carrying ``(top, sum w phi(k) v^T, sum w phi(k))``;
    inside a chunk the masked quadratic form with each row's prefix maximum. Features are computed per chunk and
    rematerialized in the backward pass."""
    @jax.checkpoint
    def step(carry, xs):
        top, kv, z = carry  # (B, K), (B, K, F, H), (B, K, F)
        qc, kc, vc, valc = xs  # (B, C, K, G, H), (B, C, K, H), (B, C, K, H), (B, C)
        qf = q_fn(qc)  # (B, C, K, G, F)
        kf, ls = _masked_parts(k_fn, kc, valc)  # (B, C, K, F), (B, C, K)
        row_top = jnp.maximum(top[:, None], jax.lax.cummax(ls, axis=1))  # (B, C, K): max over keys <= i
        num, den = _quadratic(qf, kf, ls, vc, row_top)
        r = _key_weights(top[:, None], row_top)[..., None]  # (B, C, K, 1): carried sums to each row's scale
        num = num + jnp.einsum("bckgf,bkfh->bckgh", qf, kv) * r[..., None]  # (B, C, K, G, H)
        den = den + jnp.einsum("bckgf,bkf->bckg", qf, z) * r  # (B, C, K, G)
        return _fold_keys(carry, kf, ls, vc), num / safe_normalizer(den, eps)[..., None]

    xs = (_chunks(query, chunk), _chunks(key, chunk), _chunks(value, chunk), _chunks(valid, chunk))
    return _unchunk(jax.lax.scan(step, _sums_init(k_fn, key, value), xs)[1], query.shape[1])


def _prefix_sums(q_feat, k_feat, log_scale, value):
    """Causal sums by an associative scan of ``(running max, rescaled sums)`` pairs (the online-softmax merge):
    each prefix combines only its own keys. O(T * F * H) memory."""
    def merge(a, b):
        (ta, kva, za), (tb, kvb, zb) = a, b
        top = jnp.maximum(ta, tb)
        ra, rb = jnp.exp(ta - top), jnp.exp(tb - top)
        return top, kva * ra[..., None, None] + kvb * rb[..., None, None], za * ra[..., None] + zb * rb[..., None]

    kv = jnp.einsum("bskf,bskh->bskfh", k_feat, value)  # (B, T, K, F, H)
    _, kv, z = jax.lax.associative_scan(merge, (log_scale, kv, k_feat), axis=1)
    return jnp.einsum("btkgf,btkfh->btkgh", q_feat, kv), jnp.einsum("btkgf,btkf->btkg", q_feat, z)


def kernelized_attention(q_feat: jax.Array, k_feat: jax.Array, log_scale: jax.Array, value: jax.Array, *,
                         is_causal: bool, eps: float = 0.0) -> jax.Array:
    """``phi(Q) phi(K)^T V`` normalized per row from whole feature arrays (the unchunked path, ``chunk_size=0``).

    Args:
      q_feat: ``[B, T, K, G, F]`` query features (grouped: G query heads per key/value head).
      k_feat: ``[B, S, K, F]`` key features ``psi``, padded keys already zeroed.
      log_scale: ``[B, S, K]`` key log-scales ``s`` (``phi(k) = exp(s) psi``), padded keys at :data:`FLOOR`.
      value: ``[B, S, K, H]``.

    Returns:
      ``[B, T, K, G, H]``.
    """
    if is_causal:
        num, den = _prefix_sums(q_feat, k_feat, log_scale, value)
    else:
        kf = k_feat * _key_weights(log_scale, log_scale.max(1, keepdims=True))[..., None]  # (B, S, K, F)
        kv = jnp.einsum("bskf,bskh->bkfh", kf, value)  # (B, K, F, H)
        num = jnp.einsum("btkgf,bkfh->btkgh", q_feat, kv)  # (B, T, K, G, H)
        den = jnp.einsum("btkgf,bkf->btkg", q_feat, kf.sum(1))  # (B, T, K, G)
    return num / safe_normalizer(den, eps)[..., None]  # (B, T, K, G, H)


def align_causal(key: jax.Array, value: jax.Array, valid: jax.Array, t: int):
    """Top-left causal alignment when ``q_len != kv_len``: query i sees keys j <= i, so keys past T never count
    and missing ones are padding."""
    s = key.shape[1]
    if s >= t:
        return key[:, :t], value[:, :t], valid[:, :t]
    pad = lambda x: jnp.pad(x, [(0, 0), (0, t - s)] + [(0, 0)] * (x.ndim - 2))
    return pad(key), pad(value), pad(valid)


def implied_weights(q_feat: jax.Array, k_feat: jax.Array, log_scale: jax.Array, *, is_causal: bool,
                    eps: float = 0.0) -> jax.Array:
    """The attention matrix ``[B, N, T, S]`` the kernel implies: ``phi(q_i).phi(k_j)`` over its row's sum (causal
    and padding applied, same scaling and guard), so ``dense.apply_weights(weights, value)`` equals the output."""
    a = jnp.einsum("btkgf,bskf->bkgts", q_feat, k_feat)  # (B, K, G, T, S)
    t, s = a.shape[-2:]
    keep = jnp.tril(jnp.ones((t, s), bool)) if is_causal else jnp.ones((t, s), bool)
    expo = jnp.where(keep, log_scale.transpose(0, 2, 1)[:, :, None, :], -jnp.inf)  # (B, K, T, S)
    top = expo.max(-1, keepdims=True)  # (B, K, T, 1): each row's maximum over the keys it sees
    a = a * jnp.exp(expo - jnp.where(jnp.isfinite(top), top, 0.0))[:, :, None]
    w = a / safe_normalizer(a.sum(-1, keepdims=True), eps)
    b, k, g = w.shape[:3]
    return w.reshape(b, k * g, t, s)


class KernelizedAttention(AttentionKernel):
    """Shared call of kernelized kernels: subclasses define their feature maps as pure functions of a per-call
    ``feature_state``: :meth:`query_features` and :meth:`key_parts` (features plus a per-key log-scale).

    ``need_weights=True`` returns the implied matrix ``[B, N, T, S]`` of :func:`implied_weights` (quadratic; for
    analysis only), such that ``out == dense.apply_weights(weights, value)``. No attention dropout: the fast path
    never forms the weights.
    """

    supports_dropout = False
    normalizer_eps: ClassVar[float] = 0.0  # > 0 for signed features (see safe_normalizer)

    def __init__(self, *, chunk_size: int = 256, **shared: Any):
        super().__init__(**shared)
        if chunk_size < 0:
            raise ValueError(f"attention.chunk_size must be >= 0 (0 = unchunked), got {chunk_size}")
        self.chunk_size = chunk_size

    def feature_state(self, deterministic: bool) -> Any:
        """Arrays the feature maps need this call (e.g. a random projection); stateful updates happen here."""
        return None

    def query_features(self, state: Any, query: jax.Array) -> jax.Array:
        """``[B, T, K, G, H] -> [B, T, K, G, F]`` float32, up to a positive factor per row (it cancels)."""
        raise NotImplementedError

    def key_parts(self, state: Any, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``[B, S, K, H] -> (psi [B, S, K, F], s [B, S, K])`` float32 with ``phi(k) = exp(s) psi``; ``s`` carries no
        gradient (``psi`` does), so only where the scale is split is a choice. Key-local, so chunkable."""
        raise NotImplementedError

    def key_offset(self, state: Any, key: jax.Array, valid: jax.Array) -> jax.Array:
        """Whole-sequence helper: the largest log-scale over the unpadded keys, ``[B, 1, K, 1]`` (0 if none)."""
        top = mask_log_scale(self.key_parts(state, key)[1], valid).max(1)  # (B, K)
        return jnp.where(top > FLOOR, top, 0.0)[:, None, :, None]

    def key_features(self, state: Any, key: jax.Array, valid: jax.Array, offset: jax.Array) -> jax.Array:
        """Whole-sequence helper: ``phi(k) exp(-offset)`` ``[B, S, K, F]`` for references and analysis (the
        attention itself never forms it: see the module docstring)."""
        psi, log_scale = self.key_parts(state, key)
        return psi * jnp.exp(log_scale[..., None] - offset)

    def __call__(self, query, key, value, *, mask, is_causal, dropout_rng, dropout_rate, broadcast_dropout,
                 deterministic, precision, need_weights):
        pad = key_padding(mask, self.name)  # (B, S) or None
        valid = jnp.ones(key.shape[:2], bool) if pad is None else pad  # (B, S)
        state = self.feature_state(deterministic)
        query, value = group_heads(query, key.shape[2]), value.astype(jnp.float32)  # (B, T, K, G, H), (B, S, K, H)
        if is_causal:
            key, value, valid = align_causal(key, value, valid, query.shape[1])
        q_fn = lambda q: self.query_features(state, q)
        k_fn = lambda k: self.key_parts(state, k)
        eps = self.normalizer_eps
        if need_weights or self.chunk_size == 0:
            q_feat, (k_feat, log_scale) = q_fn(query), _masked_parts(k_fn, key, valid)
            out = kernelized_attention(q_feat, k_feat, log_scale, value, is_causal=is_causal, eps=eps)
            weights = (implied_weights(q_feat, k_feat, log_scale, is_causal=is_causal, eps=eps)
                       if need_weights else None)
        else:
            chunk = min(self.chunk_size, query.shape[1], key.shape[1])
            attend = causal_chunked if is_causal else bidirectional_chunked
            out, weights = attend(q_fn, k_fn, query, key, value, valid, chunk, eps), None
        b, t, k, g, h = out.shape
        out = out.reshape(b, t, k * g, h).astype(query.dtype)  # (B, T, N, H)
        return out, None if weights is None else weights.astype(query.dtype)


def log_elu_plus_one(x: jax.Array) -> jax.Array:
    """``log(elu(x) + 1)``: ``log1p(x)`` for ``x > 0``, ``x`` otherwise -- exact at any ``x``, where ``elu(x) + 1``
    computed as ``(exp(x) - 1) + 1`` loses every digit below ``x ~ -17`` in float32 (it rounds to 0)."""
    return jnp.where(x > 0, jnp.log1p(jnp.maximum(x, 0.0)), x)


@register("linear")
class LinearAttention(KernelizedAttention):
    """Linear attention with ``phi(x) = elu(x) + 1`` (Katharopoulos et al. 2020).

    Features are formed from ``log phi`` (:func:`log_elu_plus_one`), queries divided by their row maximum (a row
    constant) and keys split as ``exp(s) psi`` with ``s`` the key's largest ``log phi``, like Performer's. So the
    normalizer is exact at any input size (``elu(x) + 1`` in float32 is 0 below ``x ~ -17``, and the old 1e-6
    normalizer floor shrank outputs whose normalizer is legitimately small) and has no floor: a row with no key
    outputs 0.

    Options:
      chunk_size: positions per chunk (default 256): features are computed chunk by chunk (bidirectional: a scan
        over key chunks, then query chunks; causal: one scan with the masked quadratic form inside a chunk), so
        memory is O(chunk * F) per step; 0 = whole-sequence features and prefix sums.
    """

    def query_features(self, state, query):
        log_phi = log_elu_plus_one(query.astype(jnp.float32))  # (B, T, K, G, H)
        return jnp.exp(log_phi - jax.lax.stop_gradient(log_phi.max(-1, keepdims=True)))

    def key_parts(self, state, key):
        log_phi = log_elu_plus_one(key.astype(jnp.float32))  # (B, S, K, H)
        s = jax.lax.stop_gradient(log_phi.max(-1))  # (B, S, K)
        return jnp.exp(log_phi - s[..., None]), s
