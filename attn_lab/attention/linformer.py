"""Low-rank attention (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity", arXiv:2006.04768).

Keys and values are projected along the *sequence* axis by learned matrices ``E, F [max_len, k]`` before softmax
attention, so each query attends to ``k`` mixed "pseudo-keys" instead of ``S`` keys: time and memory are
``O(T k)`` rather than ``O(T S)`` (paper eq. 7: ``softmax(Q (E^T K)^T / sqrt(d)) (F^T V)``; here the matrices are
stored transposed, ``[length, k]``, so ``E^T K`` is ``einsum('sr,bskh->brkh')``).

A sequence of length ``S <= max_len`` uses the first ``S`` rows of ``E`` and ``F``. Padded keys and values are zeroed
before the projection (``registry.key_padding``), so they add nothing, and outputs do not change when more padding
is appended. Because every pseudo-key mixes all positions, the method has no causal mode (the paper's Section 4
leaves it to future work) and no KV-cache decoding.

Sharing (paper Section 4, "Parameter sharing"):

- ``'none'``: the unshared baseline -- separate ``E_i, F_i`` per key/value head (``[K, max_len, k]`` each; under
  grouped-query attention the query heads of one group share their key/value head's matrices).
- ``'headwise'`` (default): one ``E`` and one ``F`` shared by all heads of the layer.
- ``'kv'``: headwise plus key-value sharing: one matrix with ``E = F`` for keys and values of all heads.
- ``'layerwise'``: one matrix for all heads, keys, values *and layers*. Within one module that is exactly ``'kv'``
  (same single ``[max_len, k]`` parameter). True cross-layer sharing needs the model to hand every layer the same
  parameter; that is not done here, so each layer still owns its own matrix.

Initialization follows the authors' fairseq code (``nn.Linear(max_seq_len, k)`` with Xavier-uniform, gain
``1/sqrt(2)``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from attn_lab.attention.dense import group_heads
from attn_lab.attention.registry import AttentionKernel, key_padding, register

SHARING = ("none", "headwise", "kv", "layerwise")

# Xavier-uniform with gain 1/sqrt(2): variance_scaling(gain**2, fan_avg, uniform); fans over (max_len, k).
_projection_init = jax.nn.initializers.variance_scaling(0.5, "fan_avg", "uniform", in_axis=-2, out_axis=-1,
                                                        batch_axis=(0,))


def project_sequence(x: jax.Array, proj: jax.Array, valid: jax.Array | None) -> jax.Array:
    """``x [B, S, K, H]`` -> ``[B, k, K, H]``: mixes the S positions into k rows with the first S rows of ``proj``.

    ``proj`` is ``[max_len, k]`` (shared by heads) or ``[K, max_len, k]`` (one per key/value head). Masked
    positions are zeroed first, so padding contributes nothing.
    """
    s = x.shape[1]
    if valid is not None:
        x = jnp.where(valid[:, :, None, None], x, jnp.zeros((), x.dtype))  # (B, S, K, H)
    if proj.ndim == 2:
        return jnp.einsum("sr,bskh->brkh", proj[:s].astype(x.dtype), x)  # (B, k, K, H)
    return jnp.einsum("ksr,bskh->brkh", proj[:, :s].astype(x.dtype), x)  # (B, k, K, H)


def implied_weights(probs: jax.Array, proj: jax.Array, valid: jax.Array | None, s: int) -> jax.Array:
    """``probs [B, N, T, k]`` -> ``[B, N, T, S] = probs @ F[:S]^T`` (masked keys zeroed).

    With these weights ``dense.apply_weights(weights, value)`` equals the kernel output, since
    ``P (F^T V) = (P F^T) V``. Rows are not a distribution: entries can be negative and need not sum to one.
    """
    b, n, t, r = probs.shape
    if proj.ndim == 2:
        weights = jnp.einsum("bntr,sr->bnts", probs, proj[:s].astype(probs.dtype))  # (B, N, T, S)
    else:
        kv = proj.shape[0]
        p = probs.reshape(b, kv, n // kv, t, r)  # (B, K, G, T, k)
        weights = jnp.einsum("bkgtr,ksr->bkgts", p, proj[:, :s].astype(probs.dtype)).reshape(b, n, t, s)
    if valid is not None:
        weights = jnp.where(valid[:, None, None, :], weights, jnp.zeros((), weights.dtype))  # (B, N, T, S)
    return weights


@register("linformer")
class LinformerAttention(AttentionKernel):
    """Softmax attention over k learned sequence projections of the keys and values (see the module docstring).

    Options:
      k: projected length (the paper's k; 256 in its main experiments).
      max_len: longest key/value sequence; ``E, F`` are ``[max_len, k]`` and length S uses their first S rows.
      sharing: 'headwise' (default), 'kv', 'layerwise' or 'none' (per key/value head). 'layerwise' is exactly
        'kv' (one ``[max_len, k]`` matrix for keys, values and heads); it does not share across layers, since each
        layer builds its own kernel instance with its own matrix.
    """

    supports_causal = False
    supports_decode = False
    supports_dropout = False
    supports_cross = True

    def __init__(self, *, k: int = 256, max_len: int = 4096, sharing: str = "headwise", **shared: Any):
        super().__init__(**shared)
        if sharing not in SHARING:
            raise ValueError(f"attention.sharing must be one of {SHARING}, got '{sharing}'")
        if k < 1 or max_len < 1:
            raise ValueError(f"attention.k and attention.max_len must be positive, got k={k}, max_len={max_len}")
        self.k, self.max_len, self.sharing = k, max_len, sharing
        rngs = shared["rngs"] if shared.get("rngs") is not None else nnx.Rngs(0)
        param_dtype = shared["param_dtype"] if shared.get("param_dtype") is not None else jnp.float32
        self.dtype = shared.get("dtype")
        shape = (self.num_kv_heads, max_len, k) if sharing == "none" else (1, max_len, k)

        def make() -> nnx.Param:
            p = _projection_init(rngs.params(), shape, param_dtype)
            return nnx.Param(p if sharing == "none" else p[0])  # [K, max_len, k] or [max_len, k]

        self.key_proj = make()  # E
        self.value_proj = make() if sharing in ("none", "headwise") else nnx.data(None)  # F (None: F = E)

    def projections(self) -> tuple[jax.Array, jax.Array]:
        """``(E, F)``; the same array twice under key-value (and layerwise) sharing."""
        e = self.key_proj[...]
        return e, (e if self.value_proj is None else self.value_proj[...])

    def __call__(self, query, key, value, *, mask, is_causal, dropout_rng, dropout_rate, broadcast_dropout,
                 deterministic, precision, need_weights):
        if is_causal:
            raise ValueError(f"attention '{self.name}' does not support causal attention")
        s = key.shape[1]
        if s > self.max_len:
            raise ValueError(f"attention 'linformer': key/value length {s} exceeds max_len={self.max_len}; "
                             f"raise attention.max_len")
        if self.dtype is not None:
            query, key, value = (x.astype(self.dtype) for x in (query, key, value))
        valid = key_padding(mask, self.name)  # (B, S) or None
        e, f = self.projections()
        key_p = project_sequence(key, e, valid)  # (B, k, K, H)
        value_p = project_sequence(value, f, valid)  # (B, k, K, H)
        num_kv_heads = key.shape[2]
        q = group_heads(query, num_kv_heads) / jnp.sqrt(query.shape[-1]).astype(query.dtype)  # (B, T, K, G, H)
        logits = jnp.einsum("btkgh,brkh->bkgtr", q, key_p, precision=precision)  # (B, K, G, T, k)
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(query.dtype)  # (B, K, G, T, k)
        out = jnp.einsum("bkgtr,brkh->btkgh", probs, value_p, precision=precision)  # (B, T, K, G, H)
        b, t, n, h = query.shape
        out = out.reshape(b, t, n, value.shape[-1])  # (B, T, N, H)
        if not need_weights:
            return out, None
        probs = probs.reshape(b, n, t, probs.shape[-1])  # (B, N, T, k)
        return out, implied_weights(probs, f, valid, s)
