"""Exact softmax attention (Vaswani et al. 2017, "Attention Is All You Need").

Two paths with the same result: when nobody needs the attention matrix (no capture, no dropout) it calls
``jax.nn.dot_product_attention`` -- the same call ``flax.nnx.MultiHeadAttention`` makes, so outputs match flax
bit for bit; otherwise it materializes the ``[batch, heads, q_len, kv_len]`` softmax so weights can be captured
and dropped out. The helpers here are shared by other kernels that need to show the matrix they imply.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from attn_lab.attention.registry import AttentionKernel, register


def group_heads(query: jax.Array, num_kv_heads: int) -> jax.Array:
    """``[B, T, N, H] -> [B, T, K, N // K, H]`` so each group of query heads shares one key/value head."""
    b, t, n, h = query.shape
    return query.reshape(b, t, num_kv_heads, n // num_kv_heads, h)


def attention_weights(query: jax.Array, key: jax.Array, *, mask: jax.Array | None = None,
                      is_causal: bool = False, precision: Any = None) -> jax.Array:
    """Softmax attention matrix ``[B, N, T, S]`` in the computation dtype.

    Masked logits get the dtype's most negative value (as flax does) rather than -inf, so a query whose keys are
    all masked gets uniform weights and finite gradients instead of NaN.
    """
    num_kv_heads = key.shape[2]
    q = group_heads(query, num_kv_heads) / jnp.sqrt(query.shape[-1]).astype(query.dtype)  # (B, T, K, G, H)
    logits = jnp.einsum("btkgh,bskh->bkgts", q, key, precision=precision)  # (B, K, G, T, S)
    b, k, g, t, s = logits.shape
    logits = logits.reshape(b, k * g, t, s)  # (B, N, T, S)
    keep = jnp.ones((1, 1, t, s), bool) if mask is None else jnp.asarray(mask, bool)
    if is_causal:
        keep = keep & jnp.tril(jnp.ones((t, s), bool))  # top-left aligned, as jax and flax
    logits = jnp.where(keep, logits, jnp.finfo(logits.dtype).min)
    return jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(query.dtype)


def apply_weights(weights: jax.Array, value: jax.Array, precision: Any = None) -> jax.Array:
    """``weights [B, N, T, S]`` x ``value [B, S, K, H]`` -> ``[B, T, N, H]`` (grouped-query aware)."""
    b, n, t, s = weights.shape
    k = value.shape[2]
    w = weights.reshape(b, k, n // k, t, s)  # (B, K, G, T, S)
    out = jnp.einsum("bkgts,bskh->btkgh", w, value, precision=precision)  # (B, T, K, G, H)
    return out.reshape(b, t, n, value.shape[-1])


def attention_dropout(weights: jax.Array, rng: jax.Array, rate: float, broadcast: bool) -> jax.Array:
    """Inverted dropout on attention weights; ``broadcast`` shares one mask over the batch (as flax does)."""
    shape = (1,) * (weights.ndim - 2) + weights.shape[-2:] if broadcast else weights.shape
    keep = jax.random.bernoulli(rng, 1.0 - rate, shape)
    return jnp.where(keep, weights / (1.0 - rate), 0.0).astype(weights.dtype)


@register("dense")
class DenseAttention(AttentionKernel):
    """Exact softmax attention.

    Options:
      implementation: 'xla' (``jax.nn.dot_product_attention``; the matrix is formed only when asked for).
    """

    IMPLEMENTATIONS = ("xla",)

    def __init__(self, *, implementation: str = "xla", **shared: Any):
        super().__init__(**shared)
        if implementation not in self.IMPLEMENTATIONS:
            raise ValueError(f"attention.implementation must be one of {self.IMPLEMENTATIONS}, "
                             f"got '{implementation}'")
        self.implementation = implementation

    def __call__(self, query, key, value, *, mask, is_causal, dropout_rng, dropout_rate, broadcast_dropout,
                 deterministic, precision, need_weights):
        dropping = dropout_rate > 0.0 and not deterministic
        if not (need_weights or dropping):
            mask = None if mask is None else jnp.asarray(mask, bool)
            return jax.nn.dot_product_attention(query, key, value, mask=mask, is_causal=is_causal), None
        weights = attention_weights(query, key, mask=mask, is_causal=is_causal, precision=precision)
        probs = attention_dropout(weights, dropout_rng, dropout_rate, broadcast_dropout) if dropping else weights
        return apply_weights(probs, value, precision), weights
