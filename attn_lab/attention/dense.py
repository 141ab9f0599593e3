"""Exact softmax attention (Vaswani et al. 2017, "Attention Is All You Need").

Paths with the same result: when nobody needs the attention matrix (no capture, no dropout) it calls
``jax.nn.dot_product_attention`` -- cuDNN flash attention where it applies (``implementation='auto'``, see
:mod:`attn_lab.attention.dispatch`), else XLA: the call ``flax.nnx.MultiHeadAttention`` makes, so XLA outputs
match flax bit for bit; otherwise it materializes the ``[batch, heads, q_len, kv_len]`` softmax so weights can be
captured and dropped out. The helpers here are shared by other kernels that need to show the matrix they imply.

``implementation='chunked'`` computes the same softmax in O(length) memory, after Rabe & Staats 2021,
"Self-attention Does Not Need O(n^2) Memory" (arXiv:2112.05682): queries in blocks, an online softmax over key
blocks (running max, denominator and numerator) and ``jax.checkpoint`` so the backward pass recomputes each block
instead of storing the ``[q_len, kv_len]`` matrix.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from attn_lab.attention.dispatch import call_facts, check_cudnn_option, choose, cudnn_attention, cudnn_refusal
from attn_lab.attention.registry import AttentionKernel, key_padding, register

# Masked logits get this instead of -inf (as flax and ``attention_weights`` do): a query that sees no key then gets
# uniform weights over the real keys, and no ``-inf - -inf`` can turn a value or a gradient into NaN.
NEG = float(jnp.finfo(jnp.float32).min)


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


def _blocks(x: jax.Array, size: int) -> jax.Array:
    """``[B, L, ...] -> [L_pad // size, B, size, ...]``, zero- (False-) padded so any length splits into blocks.

    The block axis leads so ``lax.scan`` / ``lax.map`` iterate over it.
    """
    b, length = x.shape[:2]
    num = -(-length // size)
    x = jnp.pad(x, [(0, 0), (0, num * size - length)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(b, num, size, *x.shape[2:]), 1, 0)


def chunked_attention(query: jax.Array, key: jax.Array, value: jax.Array, *, key_valid: jax.Array | None = None,
                      is_causal: bool = False, chunk_size: int = 512, precision: Any = None) -> jax.Array:
    """Exact softmax attention in O(q_len + kv_len) memory (Rabe & Staats 2021), same result as the xla path.

    Args:
      query: ``[B, T, N, H]``; key, value: ``[B, S, K, H]`` with K dividing N (grouped-query).
      key_valid: ``[B, S]`` key-padding vector (False masks a key out) or None.
      is_causal: query i sees keys j <= i (top-left aligned, as ``jax.nn.dot_product_attention``).
      chunk_size: block size of queries and of keys (capped at T and S); lengths need not divide it.

    Masked keys get the logit ``NEG`` (so a fully masked query row averages all real keys, as the xla path does);
    the keys added to fill the last block get weight exactly 0. Scores and sums are kept in float32.
    """
    b, t, n, h = query.shape
    s, k = key.shape[1], key.shape[2]
    cq, ck = min(chunk_size, t), min(chunk_size, s)
    q = group_heads(query, k) / jnp.sqrt(h).astype(query.dtype)  # (B, T, K, G, H)
    q_blocks = _blocks(q, cq)  # (nq, B, cq, K, G, H)
    k_blocks, v_blocks = _blocks(key, ck), _blocks(value, ck)  # (nk, B, ck, K, H)
    valid = jnp.ones((b, s), bool) if key_valid is None else key_valid.astype(bool)  # (B, S)
    visible_blocks = _blocks(valid, ck)  # (nk, B, ck); False on padding keys too
    real_blocks = _blocks(jnp.ones((1, s), bool), ck)  # (nk, 1, ck); False only on padding keys
    nk, g = k_blocks.shape[0], n // k

    @jax.checkpoint
    def query_block(args):
        """All keys for one query block; checkpointed so backward keeps only this block's per-key-block carries."""
        qi, q_blk = args  # (), (B, cq, K, G, H)
        q_pos = qi * cq + jnp.arange(cq)  # (cq,)

        def key_step(carry, blk):
            """One online-softmax update: fold a key block into (running max, denominator, numerator)."""
            m, l, acc = carry  # (B, K, G, cq), (B, K, G, cq), (B, K, G, cq, H)
            ki, k_blk, v_blk, visible, real = blk
            logits = jnp.einsum("bqkgh,bskh->bkgqs", q_blk, k_blk, precision=precision,
                                preferred_element_type=jnp.float32)  # (B, K, G, cq, ck)
            see = visible[:, None, None, None, :]  # (B, 1, 1, 1, ck)
            if is_causal:
                see = see & (q_pos[:, None] >= ki * ck + jnp.arange(ck)[None, :])  # (B, 1, 1, cq, ck)
            logits = jnp.where(see, logits, NEG)
            m_new = jax.lax.stop_gradient(jnp.maximum(m, logits.max(-1)))  # the result does not depend on it
            p = jnp.where(real[:, None, None, None, :], jnp.exp(logits - m_new[..., None]), 0.0)  # (B,K,G,cq,ck)
            scale = jnp.exp(m - m_new)  # (B, K, G, cq)
            pv = jnp.einsum("bkgqs,bskh->bkgqh", p.astype(value.dtype), v_blk, precision=precision,
                            preferred_element_type=jnp.float32)  # (B, K, G, cq, H)
            return (m_new, l * scale + p.sum(-1), acc * scale[..., None] + pv), None

        stats = jnp.full((b, k, g, cq), NEG, jnp.float32)  # (B, K, G, cq)
        init = (stats, jnp.zeros_like(stats), jnp.zeros((b, k, g, cq, h), jnp.float32))
        xs = (jnp.arange(nk), k_blocks, v_blocks, visible_blocks, real_blocks)
        (_, l, acc), _ = jax.lax.scan(jax.checkpoint(key_step, prevent_cse=False), init, xs)
        return acc / l[..., None]  # (B, K, G, cq, H); l >= 1: the row max contributes exp(0)

    out = jax.lax.map(query_block, (jnp.arange(q_blocks.shape[0]), q_blocks))  # (nq, B, K, G, cq, H)
    out = jnp.transpose(out, (1, 0, 4, 2, 3, 5)).reshape(b, -1, n, h)  # (B, T_pad, N, H)
    return out[:, :t].astype(query.dtype)


def xla_attention(query: jax.Array, key: jax.Array, value: jax.Array, *, mask: jax.Array | None,
                  is_causal: bool) -> jax.Array:
    """XLA's attention: the call ``flax.nnx.MultiHeadAttention`` makes, so outputs match flax bit for bit."""
    mask = None if mask is None else jnp.asarray(mask, bool)
    return jax.nn.dot_product_attention(query, key, value, mask=mask, is_causal=is_causal)


@register("dense")
class DenseAttention(AttentionKernel):
    """Exact softmax attention.

    Options:
      implementation: where the softmax is computed when nobody needs the matrix (no capture, no dropout):
        'auto' (default): cuDNN flash attention where it computes this call exactly (CUDA GPU, bf16/fp16,
          head_dim a multiple of 8 up to 128/256, no mask, causal, or key padding without causal; see
          :mod:`attn_lab.attention.dispatch`), XLA elsewhere -- on a CPU always XLA, bit for bit;
        'xla': ``jax.nn.dot_product_attention`` (the ``[B, N, T, S]`` matrix is formed inside XLA);
        'cudnn': cuDNN flash attention or a one-line ValueError (when built on a backend without it, and at the
          call for a dtype or mask it cannot take) -- never a silent fallback;
        'chunked': :func:`chunked_attention`, O(length) memory in forward and backward; key-padding masks only.
        Every implementation takes the explicit ``[B, N, T, S]`` softmax when weights are captured or attention
        dropout is on, since those need the matrix anyway.
      chunk_size: query and key block size of the chunked path (default 512).
    """

    IMPLEMENTATIONS = ("auto", "xla", "cudnn", "chunked")

    def __init__(self, *, implementation: str = "auto", chunk_size: int = 512, **shared: Any):
        super().__init__(**shared)
        if implementation not in self.IMPLEMENTATIONS:
            raise ValueError(f"attention.implementation must be one of {self.IMPLEMENTATIONS}, "
                             f"got '{implementation}'")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"attention.chunk_size must be a positive integer, got {chunk_size!r}")
        check_cudnn_option(implementation, head_dim=self.head_dim, dtype=shared.get("dtype"),
                           allowed=self.IMPLEMENTATIONS, fallback="xla")
        self.implementation, self.chunk_size = implementation, chunk_size

    def dispatch(self, *, backend: str, dtype: Any, mask: str, is_causal: bool, needs_matrix: bool = False,
                 q_len: int | None = None, kv_len: int | None = None, max_head_dim: int = 128) -> str:
        """The path a call with these static facts takes: 'cudnn', 'xla', 'chunked' or 'explicit' (raises the
        call's ValueError for an explicit 'cudnn' that cannot run). Used by the call and by the dispatch log line."""
        refusal = cudnn_refusal(backend, dtype, self.head_dim, mask, is_causal=is_causal, q_len=q_len,
                                kv_len=kv_len, max_head_dim=max_head_dim)
        return choose(self.implementation, fallback="xla", needs_matrix=needs_matrix, refusal=refusal,
                      allowed=self.IMPLEMENTATIONS)

    def __call__(self, query, key, value, *, mask, is_causal, dropout_rng, dropout_rate, broadcast_dropout,
                 deterministic, precision, need_weights):
        dropping = dropout_rate > 0.0 and not deterministic
        path = self.dispatch(**call_facts(query, key, mask, is_causal), needs_matrix=need_weights or dropping)
        if path == "explicit":
            weights = attention_weights(query, key, mask=mask, is_causal=is_causal, precision=precision)
            probs = attention_dropout(weights, dropout_rng, dropout_rate, broadcast_dropout) if dropping else weights
            return apply_weights(probs, value, precision), weights
        paths = {
            "xla": lambda: xla_attention(query, key, value, mask=mask, is_causal=is_causal),
            "cudnn": lambda: cudnn_attention(query, key, value, key_valid=key_padding(mask, self.name),
                                             is_causal=is_causal),
            "chunked": lambda: chunked_attention(query, key, value, key_valid=key_padding(mask, self.name),
                                                 is_causal=is_causal, chunk_size=self.chunk_size,
                                                 precision=precision),
        }
        return paths[path](), None
