"""Sliding-window (local) self-attention.

Each query attends only to keys within a fixed distance, as in the local attention of Image Transformer
(Parmar et al. 2018) and the sliding window of Longformer (Beltagy et al. 2020, "Longformer: The Long-Document
Transformer", arXiv:2004.05150). ``window`` is Longformer's w, the span a query sees: two-sided
``|i - j| <= w // 2``, causal ``i - w < j <= i``. The band is computed blockwise in O(T * w) time and memory: the
sequence is split into blocks of half a reach (``w / 4`` two-sided, ``w / 2`` causal), and each block attends to its
own block of keys plus the 2 blocks on each side that its reach touches: about ``1.25 w`` keys per query two-sided
and ``1.5 w`` causal (whole-window blocks would gather ``1.5 w`` and ``2 w``); a mask then cuts that down to the
exact band. No ``[T, T]`` matrix is formed, except
when the attention matrix is asked for (``need_weights``, meant for analysis at small T). On a CUDA GPU, causal
windows go to cuDNN's sliding-window flash attention instead, and the other windows to the fused block-sparse flash
kernel, which skips every tile outside the band (``implementation='auto'``; see the kernel class).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attn_lab.attention.block_mask import BlockMask, check_block_size, create_block_mask
from attn_lab.attention.dense import NEG, apply_weights, group_heads
from attn_lab.attention.dispatch import (
    FUSED,
    call_facts,
    check_cudnn_option,
    check_fused_option,
    choose,
    choose_fused,
    cudnn_attention,
    cudnn_refusal,
)
from attn_lab.attention.flash import fused_path
from attn_lab.attention.registry import AttentionKernel, key_padding, register

BLOCKS_PER_REACH = 2  # blocks per side's reach: smaller blocks gather fewer keys outside the band
GROUPS = 8  # the blocks are processed in this many sequential groups, so only 1/GROUPS of the band is live


def reach(window: int, is_causal: bool) -> tuple[int, int]:
    """How far back and forward a query sees: causal ``(w - 1, 0)``, two-sided ``(w // 2, w // 2)``."""
    return (window - 1, 0) if is_causal else (window // 2, window // 2)


def in_band(offset: jax.Array, window: int, is_causal: bool) -> jax.Array:
    """Whether a key at ``offset = query_pos - key_pos`` is in the window."""
    back, forward = reach(window, is_causal)
    return (offset <= back) & (offset >= -forward)


def band_softmax(logits: jax.Array, visible: jax.Array, counted: jax.Array) -> jax.Array:
    """Softmax over the ``counted`` keys (the in-range band), with the ``counted & ~visible`` ones masked to NEG.

    Keys outside the band get weight exactly 0, so a query whose in-band keys are all padding gets uniform weights
    over its band (finite, like dense's fully masked rows) rather than mass on keys it cannot see. Rows with nothing
    counted (the padding added to fill the last block) get zeros and a safe denominator, so gradients stay finite.
    """
    logits = jnp.where(visible & counted, logits.astype(jnp.float32), NEG)
    top = jax.lax.stop_gradient(logits.max(-1, keepdims=True))  # softmax does not depend on it
    p = jnp.where(counted, jnp.exp(logits - top), 0.0)
    total = p.sum(-1, keepdims=True)
    return p / jnp.where(total > 0.0, total, 1.0)


def local_attention(query: jax.Array, key: jax.Array, value: jax.Array, *, window: int, is_causal: bool = False,
                    key_valid: jax.Array | None = None, precision: Any = None) -> jax.Array:
    """Blockwise sliding-window self-attention, ``[B, T, N, H]`` x ``[B, T, K, H]`` -> ``[B, T, N, H]``.

    Query i sees key j when ``|i - j| <= window // 2`` or, when causal, ``i - window < j <= i`` (``window`` keys,
    itself included), and ``key_valid[b, j]`` (a ``[B, T]`` key-padding vector). Cost O(T * window).
    """
    b, t, n, h = query.shape
    k = key.shape[2]
    back, forward = reach(window, is_causal)
    w = min(max(1, -(-max(back, forward) // BLOCKS_PER_REACH)), t)  # block size
    nb = -(-t // w)
    left, right = min(-(-back // w), nb - 1), min(-(-forward // w), nb - 1)  # neighbour blocks covering the reach
    per_group = -(-nb // GROUPS)
    groups = -(-nb // per_group)
    nbp = groups * per_group  # blocks, padded to whole groups
    q = group_heads(query, k) / jnp.sqrt(h).astype(query.dtype)  # (B, T, K, G, H)
    q = jnp.pad(q, [(0, 0), (0, nbp * w - t), (0, 0), (0, 0), (0, 0)])
    q = jnp.moveaxis(q.reshape(b, groups, per_group, w, k, n // k, h), 1, 0)  # (groups, B, per_group, w, K, G, H)
    pad = [(0, 0), (left * w, (nbp + right) * w - t)]
    keys = jnp.pad(key, pad + [(0, 0), (0, 0)])  # (B, (nbp + left + right) w, K, H)
    values = jnp.pad(value, pad + [(0, 0), (0, 0)])  # (B, (nbp + left + right) w, K, H)
    valid = jnp.ones((b, t), bool) if key_valid is None else key_valid.astype(bool)  # (B, T)
    valid = jnp.pad(valid, pad)  # (B, (nbp + left + right) w); False outside the sequence
    span = (left + 1 + right) * w  # C: keys gathered per query block
    q_pos = jnp.arange(nbp)[:, None] * w + jnp.arange(w)[None, :]  # (nbp, w)
    k_pos = (jnp.arange(nbp)[:, None] - left) * w + jnp.arange(span)[None, :]  # (nbp, C)
    counted = in_band(q_pos[:, :, None] - k_pos[:, None, :], window, is_causal)  # (nbp, w, C)
    counted &= ((k_pos >= 0) & (k_pos < t))[:, None, :]  # (nbp, w, C)
    counted = counted.reshape(groups, per_group, w, span)  # (groups, per_group, w, C)

    def neighbours(x, i):
        """One group's blocks with their neighbours: ``[B, per_group, C, ...]`` from one contiguous slice."""
        x = jax.lax.dynamic_slice_in_dim(x, i * per_group * w, (per_group + left + right) * w, axis=1)
        x = x.reshape(b, per_group + left + right, w, *x.shape[2:])  # (B, per_group + left + right, w, ...)
        return jnp.concatenate([x[:, o:o + per_group] for o in range(left + 1 + right)], axis=2)  # (B, pg, C, ..)

    @jax.checkpoint  # the backward pass recomputes each group's band instead of storing all of them
    def one_group(xs):
        i, qg, cnt = xs  # (), (B, per_group, w, K, G, H), (per_group, w, C)
        kg, vg = neighbours(keys, i), neighbours(values, i)  # (B, per_group, C, K, H)
        vis = neighbours(valid, i)[:, None, None, :, None, :]  # (B, 1, 1, per_group, 1, C)
        logits = jnp.einsum("bnqkgh,bnckh->bkgnqc", qg, kg, precision=precision,
                            preferred_element_type=jnp.float32)  # (B, K, G, per_group, w, C)
        weights = band_softmax(logits, vis, cnt)  # (B, K, G, per_group, w, C)
        return jnp.einsum("bkgnqc,bnckh->bnqkgh", weights.astype(vg.dtype), vg,
                          precision=precision)  # (B, per_group, w, K, G, H)

    # GROUPS sequential steps: only one group's band (1 / GROUPS of it) is live at a time, forward and backward
    out = jax.lax.map(one_group, (jnp.arange(groups), q, counted))  # (groups, B, per_group, w, K, G, H)
    return jnp.moveaxis(out, 0, 1).reshape(b, nbp * w, n, h)[:, :t]  # (B, T, N, H)


def band_weights(query: jax.Array, key: jax.Array, *, window: int, is_causal: bool = False,
                 key_valid: jax.Array | None = None, precision: Any = None) -> jax.Array:
    """The dense ``[B, N, T, T]`` matrix :func:`local_attention` implies (O(T^2): for analysis at small T)."""
    b, t, n, h = query.shape
    q = group_heads(query, key.shape[2]) / jnp.sqrt(h).astype(query.dtype)  # (B, T, K, G, H)
    logits = jnp.einsum("btkgh,bskh->bkgts", q, key, precision=precision,
                        preferred_element_type=jnp.float32).reshape(b, n, t, t)  # (B, N, T, T)
    counted = in_band(jnp.arange(t)[:, None] - jnp.arange(t)[None, :], window, is_causal)  # (T, T)
    valid = jnp.ones((b, t), bool) if key_valid is None else key_valid.astype(bool)  # (B, T)
    return band_softmax(logits, valid[:, None, None, :], counted).astype(query.dtype)  # (B, N, T, T)


@functools.lru_cache(maxsize=64)
def band_block_mask(length: int, window: int, is_causal: bool, block_size: int) -> BlockMask:
    """The band as a block mask for the fused kernel: tiles within the reach, evaluated once per block offset."""
    back, forward = reach(window, is_causal)

    def cover(nb, bs):
        offset = np.arange(nb)[:, None] - np.arange(nb)[None, :]  # query block - key block
        return (offset <= -(-back // bs)) & (offset >= -forward // bs)  # within ceil(reach / bs) blocks

    return create_block_mask(lambda q, k: in_band(q - k, window, is_causal), length, block_size,
                             is_causal=is_causal, cover=cover, shift_invariant=True, name="attention 'local'")


@register("local")
class LocalAttention(AttentionKernel):
    """Sliding-window self-attention (see the module docstring).

    Options:
      window: the span w a query sees (default 128; Longformer's w). Two-sided: ``|i - j| <= w // 2``; causal:
        ``i - w < j <= i``. ``w >= 2 T`` (causal: ``w >= T``) gives dense attention (a causal query with every
        visible key padded averages keys j <= i, where dense averages all keys).
      implementation: 'auto' (default): cuDNN's sliding window where it computes the band exactly -- causal
        windows without a mask on a CUDA GPU in bf16/fp16 (cuDNN's window is left-only, and key padding under a
        window is exact only for a padding suffix, which a traced mask cannot show; see
        :mod:`attn_lab.attention.dispatch`) -- the blockwise kernel elsewhere; 'blockwise': always
        :func:`local_attention`; 'cudnn': cuDNN or a one-line ValueError, never a silent fallback; 'fused': the
        block-sparse Pallas flash kernel (:mod:`attn_lab.attention.flash`), which visits only the tiles inside the
        band (CUDA GPU; a one-line ValueError elsewhere); 'fused_interpret': the same kernel run as jax operations
        on any backend (slow: tests). Under 'auto', a CUDA GPU runs cuDNN where it is exact, else 'blockwise'
        ('fused' once it passed a GPU check: dispatch.FUSED_BY_DEFAULT).
        The band maps to ``jax.nn.dot_product_attention``'s ``local_window_size`` as :func:`reach` says:
        causal ``(w - 1, 0)`` with ``is_causal`` (cuDNN's ``sliding_window_length = w``).
      fused_block_size: block of the fused kernel's block mask, one of 16, 32, 64 (default), 128 (Triton's rule);
        each fused kernel walks it in the largest tile that fits (:mod:`attn_lab.attention.tiles`).

    Self-attention only (query i and key i are the same position), key-padding masks only, no KV-cache decoding
    and no attention dropout. ``need_weights`` returns the dense band matrix and the output computed from it, so
    ``out == dense.apply_weights(weights, value)`` exactly.
    """

    supports_cross = False
    supports_decode = False
    supports_dropout = False
    IMPLEMENTATIONS = ("auto", "blockwise", "cudnn", "fused", "fused_interpret")

    def __init__(self, *, window: int = 128, implementation: str = "auto", fused_block_size: int = 64,
                 **shared: Any):
        super().__init__(**shared)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"attention.window must be a positive integer, got {window!r}")
        if implementation not in self.IMPLEMENTATIONS:
            raise ValueError(f"attention.implementation must be one of {self.IMPLEMENTATIONS}, "
                             f"got '{implementation}'")
        check_cudnn_option(implementation, head_dim=self.head_dim, dtype=shared.get("dtype"),
                           allowed=self.IMPLEMENTATIONS, fallback="blockwise")
        check_fused_option(implementation, allowed=self.IMPLEMENTATIONS, fallback="blockwise")
        self.window, self.implementation = window, implementation
        self.fused_block_size = check_block_size(fused_block_size)

    def dispatch(self, *, backend: str, dtype: Any, mask: str, is_causal: bool, needs_matrix: bool = False,
                 q_len: int | None = None, kv_len: int | None = None, max_head_dim: int = 128) -> str:
        """The path a call with these static facts takes: 'cudnn' (causal windows, where exact), else 'fused' on a
        CUDA GPU, else 'blockwise'; 'explicit' (the band matrix) for weights; raises the call's ValueError for an
        explicit 'cudnn' or 'fused' that cannot run."""
        refusal = cudnn_refusal(backend, dtype, self.head_dim, mask, is_causal=is_causal,
                                window=reach(self.window, is_causal), q_len=q_len, kv_len=kv_len,
                                max_head_dim=max_head_dim)
        if self.implementation in FUSED or (self.implementation == "auto" and refusal is not None):
            return choose_fused(self.implementation, fallback="blockwise", needs_matrix=needs_matrix,
                                backend=backend, allowed=self.IMPLEMENTATIONS)
        return choose(self.implementation, fallback="blockwise", needs_matrix=needs_matrix, refusal=refusal,
                      allowed=self.IMPLEMENTATIONS)

    def __call__(self, query, key, value, *, mask, is_causal, dropout_rng, dropout_rate, broadcast_dropout,
                 deterministic, precision, need_weights):
        self.check_call(query, key, dropout_rate, deterministic)
        key_valid = key_padding(mask, self.name)
        path = self.dispatch(**call_facts(query, key, mask, is_causal), needs_matrix=need_weights)
        opts = dict(window=self.window, is_causal=is_causal, key_valid=key_valid, precision=precision)
        if path == "explicit":
            weights = band_weights(query, key, **opts)  # (B, N, T, T)
            return apply_weights(weights, value, precision), weights
        if path == "cudnn":  # no mask here: cudnn_refusal lets only unmasked causal windows through
            return cudnn_attention(query, key, value, is_causal=is_causal, window=reach(self.window, is_causal)), None
        if path in FUSED:
            mask = band_block_mask(query.shape[1], self.window, bool(is_causal), self.fused_block_size)
            return fused_path(path, query, key, value, mask, key_valid), None
        return local_attention(query, key, value, **opts), None
