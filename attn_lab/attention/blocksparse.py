"""Shared machinery of block-sparse attention: exact softmax over a fixed, static set of keys per query.

Sparse patterns (Sparse Transformer, Longformer, BigBird) are exact softmax attention restricted to a pattern
``A(i) = {j : query i may see key j}``. This module computes that softmax without a ``[T, S]`` matrix. The sequence
is padded to a multiple of ``block_size`` and cut into blocks; each query block gathers its candidate keys from up
to three static *sources*, concatenated along one key axis so a single softmax normalizes over all of them:

- ``blocks [num_q_blocks, r]``: whole key blocks per query block (sliding windows, random blocks);
- ``extra_keys [e]``: the same key positions for every query (global keys, summary columns);
- ``columns``: for the query at offset ``o`` of its block, the keys ``o + m * block_size`` for every block ``m``
  (the "every l-th position" of strided attention, found by a transpose instead of a gather).

An exact token-level mask, built once in numpy at trace time (:class:`Layout`), then keeps a gathered key only
when the pattern allows it, causality holds, it is a real (not block-filling) position, and it is the first copy
of that position in the row (a key gathered twice, e.g. a window block that is also global, counts once). Memory is
O(T * keys per query). Global queries, which attend to every key, are computed densely (O(g * T)) and scattered over
their rows. Nothing here registers a kernel; ``sparse.py`` builds layouts for its patterns.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attn_lab.attention.dense import NEG, group_heads

# pattern(query_pos, key_pos) -> bool, numpy broadcasting; symmetric or not, causality is applied separately.
Pattern = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True, eq=False)
class Layout:
    """Static (numpy) description of which keys each query sees; built at trace time, never traced.

    Attributes:
      length: sequence length T (queries == keys).
      block_size: bs; the sequence is padded to ``num_blocks * bs``.
      blocks: ``[num_blocks, r]`` key-block indices gathered for each query block.
      extra_keys: ``[e]`` key positions gathered for every query.
      columns: whether each query also gathers the keys at its own in-block offset in every block.
      key_pos: ``[num_blocks, bs, r * bs + e + (num_blocks if columns)]`` position of every gathered key.
      allowed: same shape; True where the key is counted (pattern, causal, real, first copy).
      global_queries: ``[g]`` query positions computed densely over all keys.
      global_allowed: ``[g, T]`` pattern (and causality) of those rows.
    """

    length: int
    block_size: int
    blocks: np.ndarray
    extra_keys: np.ndarray
    columns: bool
    key_pos: np.ndarray
    allowed: np.ndarray
    global_queries: np.ndarray
    global_allowed: np.ndarray

    @property
    def num_blocks(self) -> int:
        return self.blocks.shape[0]


def num_blocks(length: int, block_size: int) -> int:
    """Blocks needed to cover ``length`` positions (the last one may be partly padding)."""
    return -(-length // block_size)


def clipped_window(nb: int, left: int, right: int) -> np.ndarray:
    """``[nb, left + 1 + right]`` block indices ``q - left .. q + right`` clipped into range.

    Clipping repeats edge blocks instead of pointing outside; :func:`first_copy` masks the repeats.
    """
    offsets = np.arange(-left, right + 1)  # (r,)
    return np.clip(np.arange(nb)[:, None] + offsets[None, :], 0, nb - 1)  # (nb, r)


def first_copy(pos: np.ndarray) -> np.ndarray:
    """Boolean of ``pos``'s shape: True at the first occurrence of each value along the last axis."""
    flat = pos.reshape(-1, pos.shape[-1])  # (rows, S)
    order = np.argsort(flat, axis=-1, kind="stable")
    ranked = np.take_along_axis(flat, order, axis=-1)
    first_sorted = np.ones_like(ranked, dtype=bool)
    first_sorted[:, 1:] = ranked[:, 1:] != ranked[:, :-1]  # stable sort: the earliest copy comes first
    first = np.empty_like(first_sorted)
    np.put_along_axis(first, order, first_sorted, axis=-1)
    return first.reshape(pos.shape)


def build_layout(length: int, block_size: int, *, pattern: Pattern, is_causal: bool, blocks: np.ndarray,
                 extra_keys: Sequence[int] = (), columns: bool = False,
                 global_queries: Sequence[int] = ()) -> Layout:
    """Gathered key positions and their exact mask for one (length, pattern, causality).

    The sources must cover the pattern for every non-global query; keys they gather outside it are masked, so
    a generous cover is exact, only slower.
    """
    bs, nb = block_size, num_blocks(length, block_size)
    blocks = np.asarray(blocks, np.int32).reshape(nb, -1)  # (nb, r)
    extra = np.unique(np.asarray(extra_keys, np.int32).reshape(-1))
    extra = extra[(extra >= 0) & (extra < length)]  # (e,)
    offsets = np.arange(bs)
    block_keys = (blocks[:, :, None] * bs + offsets).reshape(nb, 1, -1)  # (nb, 1, r * bs)
    sources = [np.broadcast_to(block_keys, (nb, bs, block_keys.shape[-1]))]
    if extra.size:
        sources.append(np.broadcast_to(extra, (nb, bs, extra.size)))
    if columns:
        sources.append(np.broadcast_to(offsets[:, None] + np.arange(nb)[None, :] * bs, (nb, bs, nb)))
    key_pos = np.concatenate(sources, axis=-1).astype(np.int32)  # (nb, bs, C)
    q_pos = (np.arange(nb)[:, None] * bs + offsets)[:, :, None]  # (nb, bs, 1)
    allowed = pattern(q_pos, key_pos) & (key_pos < length) & first_copy(key_pos)
    gq = np.unique(np.asarray(global_queries, np.int32).reshape(-1))
    gq = gq[(gq >= 0) & (gq < length)]  # (g,)
    g_allowed = np.asarray(pattern(gq[:, None], np.arange(length)[None, :]), bool).reshape(gq.size, length)
    if is_causal:
        allowed &= key_pos <= q_pos
        g_allowed &= np.arange(length)[None, :] <= gq[:, None]
    return Layout(length, bs, blocks, extra, columns, key_pos, np.asarray(allowed, bool), gq, g_allowed)


def masked_softmax(logits: jax.Array, counted: jax.Array, visible: jax.Array | None) -> jax.Array:
    """Softmax over the ``counted`` keys; counted-but-invisible (padding) keys get the logit ``NEG``.

    Uncounted keys get weight exactly 0. So a query whose counted keys are all padding gets uniform weights over
    its pattern (finite, and never mass on keys outside it -- causality holds even there), and a row with nothing
    counted (the block-filling queries) gets zeros with a safe denominator, so gradients stay finite.
    """
    keep = counted if visible is None else counted & visible
    return _kept_softmax(logits.astype(jnp.float32), keep, counted)


@jax.custom_jvp
def _kept_softmax(logits: jax.Array, keep: jax.Array, counted: jax.Array) -> jax.Array:
    logits = jnp.where(keep, logits, NEG)
    top = jax.lax.stop_gradient(logits.max(-1, keepdims=True))  # the softmax does not depend on it
    p = jnp.where(counted, jnp.exp(logits - top), 0.0)
    total = p.sum(-1, keepdims=True)
    return p / jnp.where(total > 0.0, total, 1.0)


@_kept_softmax.defjvp
def _kept_softmax_jvp(primals, tangents):
    """The softmax Jacobian from the probabilities alone: what autodiff computes, but linear in the tangent with
    only ``p`` and ``keep`` as constants, so reverse mode (its transpose) keeps neither the logits, the exponentials
    nor the masked copies alive for the backward pass -- the largest temporaries at long T. A JVP rule rather than
    a VJP one, so forward mode (``jax.jacfwd``) works too. Uncounted keys have p = 0 and so no derivative; a masked
    (NEG) logit is a constant, so none either."""
    logits, keep, counted = primals
    p = _kept_softmax(logits, keep, counted)
    dl = jnp.where(keep, tangents[0], 0.0)
    return p, p * (dl - (p * dl).sum(-1, keepdims=True))


def _pad_blocks(x: jax.Array, nb: int, bs: int) -> jax.Array:
    """``[B, T, ...] -> [B, nb, bs, ...]`` with zero (False) padding at the end."""
    x = jnp.pad(x, [(0, 0), (0, nb * bs - x.shape[1])] + [(0, 0)] * (x.ndim - 2))
    return x.reshape(x.shape[0], nb, bs, *x.shape[2:])


def _gathered(layout: Layout, x: jax.Array) -> list[jax.Array]:
    """The key (or value) tensor of each source, ``x [B, T, K, H]``, in :attr:`Layout.key_pos` order.

    Blocks then extra keys ``[B, nb, r * bs + e, K, H]`` (per query block: the e shared keys are broadcast so
    that there is one key axis, not a second [.., e] logits tensor to concatenate), then columns
    ``[B, nb, bs, K, H]`` (indexed by the query's offset; the transpose happens in the einsum).
    """
    nb, bs = layout.num_blocks, layout.block_size
    xb = _pad_blocks(x, nb, bs)  # (B, nb, bs, K, H)
    picked = xb[:, layout.blocks].reshape(x.shape[0], nb, -1, *x.shape[2:])  # (B, nb, r * bs, K, H)
    if layout.extra_keys.size:
        extra = x[:, None, layout.extra_keys]  # (B, 1, e, K, H)
        extra = jnp.broadcast_to(extra, (x.shape[0], nb, *extra.shape[2:]))  # (B, nb, e, K, H)
        picked = jnp.concatenate([picked, extra], axis=2)  # (B, nb, r * bs + e, K, H)
    out = [picked]
    if layout.columns:
        out.append(xb)  # (B, nb, bs, K, H): key (m, o) for query offset o
    return out


# einsum specs per source (blocks + extra keys, then columns): query blocks "bqokgh" (B, nb, bs, K, G, H) against
# each source's keys. Logits are batch dims first, (B, nb, K, G, bs, C): fewer layout copies around XLA's CPU dots
# (tests/test_kernels_sparse.py, the memory test at 4K).
_LOGIT_SPECS = ("bqokgh,bqskh->bqkgos", "bqokgh,bmokh->bqkgom")
_OUT_SPECS = ("bqkgos,bqskh->bqokgh", "bqkgom,bmokh->bqokgh")


def _global_rows(layout: Layout, q: jax.Array, key: jax.Array, value: jax.Array, key_valid: jax.Array | None,
                 precision: Any) -> tuple[jax.Array, jax.Array]:
    """Dense attention of the global queries over all keys: ``(out [B, g, K, G, H], probs [B, K, G, g, T])``."""
    qg = q[:, layout.global_queries]  # (B, g, K, G, H)
    logits = jnp.einsum("bikgh,bskh->bkgis", qg, key, precision=precision,
                        preferred_element_type=jnp.float32)  # (B, K, G, g, T)
    visible = None if key_valid is None else key_valid[:, None, None, None, :]  # (B, 1, 1, 1, T)
    probs = masked_softmax(logits, jnp.asarray(layout.global_allowed), visible)
    out = jnp.einsum("bkgis,bskh->bikgh", probs.astype(value.dtype), value, precision=precision,
                     preferred_element_type=jnp.float32)  # (B, g, K, G, H)
    return out, probs


@functools.partial(jax.jit, static_argnames=("layout", "precision", "need_weights"))
def block_sparse_attention(query: jax.Array, key: jax.Array, value: jax.Array, layout: Layout, *,
                           key_valid: jax.Array | None = None, precision: Any = None, need_weights: bool = False
                           ) -> tuple[jax.Array, jax.Array | None]:
    """Exact softmax attention restricted to ``layout``'s pattern, O(T * keys per query) memory.

    Args:
      query: ``[B, T, N, H]``; key, value: ``[B, T, K, H]`` with K dividing N (grouped-query).
      layout: from :func:`build_layout` for this T (causality is part of the layout). Static and hashed by
        identity: cache layouts (as ``sparse.py`` does) so eager calls reuse one compiled program.
      key_valid: ``[B, T]`` key-padding vector (False masks a key out) or None.
      need_weights: also return the dense ``[B, N, T, T]`` matrix of the weights applied (for analysis, small T).

    Returns:
      ``(out [B, T, N, H], weights or None)``; scores and sums in float32, output in the query dtype.
    """
    b, t, n, h = query.shape
    if key.shape[1] != t or layout.length != t:
        raise ValueError(f"block-sparse attention is self-attention: query length {t}, key length "
                         f"{key.shape[1]}, layout length {layout.length}")
    nb, bs, k = layout.num_blocks, layout.block_size, key.shape[2]
    q = group_heads(query, k) / jnp.sqrt(h).astype(query.dtype)  # (B, T, K, G, H)
    qb = _pad_blocks(q, nb, bs)  # (B, nb, bs, K, G, H)
    parts = [jnp.einsum(spec, qb, ks, precision=precision, preferred_element_type=jnp.float32)
             for spec, ks in zip(_LOGIT_SPECS, _gathered(layout, key))]  # each (B, nb, K, G, bs, C_i)
    logits = jnp.concatenate(parts, axis=-1)  # (B, nb, K, G, bs, C)
    visible = None
    if key_valid is not None:
        valid = jnp.pad(key_valid.astype(bool), ((0, 0), (0, nb * bs - t)))  # (B, T_pad)
        visible = valid[:, layout.key_pos][:, :, None, None]  # (B, nb, 1, 1, bs, C)
    counted = jnp.asarray(layout.allowed)[:, None, None]  # (nb, 1, 1, bs, C)
    probs = masked_softmax(logits, counted, visible)  # (B, nb, K, G, bs, C)
    splits = np.cumsum([part.shape[-1] for part in parts])[:-1]
    p_parts = jnp.split(probs.astype(value.dtype), splits, axis=-1)
    out = sum(jnp.einsum(spec, p, vs, precision=precision, preferred_element_type=jnp.float32)
              for spec, p, vs in zip(_OUT_SPECS, p_parts, _gathered(layout, value)))  # (B, nb, bs, K, G, H)
    out = out.reshape(b, nb * bs, k, n // k, h)[:, :t]  # (B, T, K, G, H)
    g_probs = None
    if layout.global_queries.size:
        g_out, g_probs = _global_rows(layout, q, key, value, key_valid, precision)
        out = out.at[:, layout.global_queries].set(g_out)
    out = out.reshape(b, t, n, h).astype(query.dtype)
    weights = _dense_weights(layout, probs, g_probs, n).astype(query.dtype) if need_weights else None
    return out, weights


def _dense_weights(layout: Layout, probs: jax.Array, g_probs: jax.Array | None, n: int) -> jax.Array:
    """Scatters the gathered probabilities into the ``[B, N, T, T]`` matrix they imply (exact: what was applied).

    Uncounted entries (duplicates, filler) carry weight 0, so scatter-adding every gathered key is exact.
    """
    b, nb, bs, t = probs.shape[0], layout.num_blocks, layout.block_size, layout.length
    p = probs.reshape(b, nb, n, bs, -1).transpose(0, 2, 1, 3, 4)  # (B, N, nb, bs, C)
    rows = np.arange(nb)[:, None, None], np.arange(bs)[None, :, None]
    dense = jnp.zeros((b, n, nb, bs, nb * bs), p.dtype).at[:, :, rows[0], rows[1], layout.key_pos].add(p)
    dense = dense.reshape(b, n, nb * bs, nb * bs)[:, :, :t, :t]  # (B, N, T, T)
    if g_probs is not None:
        dense = dense.at[:, :, layout.global_queries].set(g_probs.reshape(b, n, -1, t))
    return dense
