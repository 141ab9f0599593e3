"""Adaptive attention span (Sukhbaatar et al. 2019, "Adaptive Attention Span in Transformers", arXiv:1905.07799).

Each head h learns how far it looks: a span ``z_h`` in tokens and the soft ramp mask on the query-key distance x
(causal ``x = i - j``, two-sided ``x = |i - j|``)::

    m_z(x) = clip((R + z - x) / R, 0, 1),        a_ij = m_z(x_ij) exp(s_ij) / sum_k m_z(x_ik) exp(s_ik)

(the mask multiplies after the exponential and the row is renormalized, as in the paper). ``z = S clip(v, 0, 1)``
with ``v`` an ``nnx.Param`` per query head; the span penalty (:meth:`AdaptiveSpanAttention.penalty`, the mean of z
in tokens) is what shrinks it. Keys at distance ``x >= z + R`` get weight exactly 0 and no influence.

Blockwise, never a masked ``[T, T]`` matrix: queries and keys are cut into blocks of ``block_size`` w; a query
block meets the key block d blocks away, for every d whose distances can fall under ``S + R``, in a ``lax.scan``
with an online softmax (running max, normalizer and numerator, as flash attention). Under jit the learned span is
traced, so shapes cannot depend on it: each block offset runs under ``lax.cond`` only when its nearest query-key
distance is below ``max_h z_h + R``, so a layer whose spans are short costs O(T (max z + R + w)) per head (twice
that two-sided) whatever ``max_span`` is. ``lax.cond`` turns into a select when vmapped (e.g. vectorized seeds):
then every offset up to ``S + R`` is computed and masked. Scan and cond are reverse-differentiable (a fori_loop
with a traced trip count is not), so the gradient reaches z through the ramp (slope ``1/R`` inside it, 0 outside
and, by this file's choice, at its two kinks). Query blocks go in ``GROUPS`` sequential, checkpointed groups, as
in local.py, so the backward pass holds one group's per-offset carries at a time.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn_lab.attention.dense import NEG, apply_weights, group_heads
from attn_lab.attention.registry import AttentionKernel, key_padding, register

GROUPS = 8  # query blocks are processed in this many sequential groups (memory of the backward pass / GROUPS)


def ramp_mask(distance: jax.Array, spans: jax.Array, ramp: float) -> jax.Array:
    """``clip((R + z - x) / R, 0, 1)``; its derivative in z is ``1/R`` strictly inside the ramp, else 0 (also at the
    kinks x = z and x = z + R, so a key whose mask is 0 never carries gradient and skipped blocks lose nothing)."""
    r = (ramp + spans - distance) / ramp
    return jnp.where(r >= 1.0, 1.0, jnp.where(r > 0.0, r, 0.0))


def span_mask(offset: jax.Array, spans: jax.Array, ramp: float, is_causal: bool) -> jax.Array:
    """Mask ``[N, *offset.shape]`` for ``offset = query_pos - key_pos``: causal keys after the query get 0."""
    distance = (offset if is_causal else jnp.abs(offset)).astype(spans.dtype)
    m = ramp_mask(distance, spans.reshape((-1,) + (1,) * offset.ndim), ramp)
    return jnp.where(offset >= 0, m, 0.0) if is_causal else m


def fold(carry, logits, mask, valid):
    """One online-softmax update with the mask applied after exp: ``p = m exp(s - max)``.

    Padding keys get the logit NEG (a query whose visible keys are all padding averages them by mask, like dense);
    the running max runs over keys with ``m > 0`` only, so a masked-out key can neither overflow nor set the scale.
    """
    top, total, acc = carry  # (B, K, G, *Q), (B, K, G, *Q), (B, K, G, *Q, H)
    s = jnp.where(mask > 0.0, jnp.where(valid, logits, NEG), NEG)  # (B, K, G, *Q, C)
    new = jax.lax.stop_gradient(jnp.maximum(top, s.max(-1)))  # the result does not depend on it
    p = mask * jnp.exp(s - new[..., None])  # (B, K, G, *Q, C); exactly 0 where mask is 0
    scale = jnp.exp(top - new)
    return new, total * scale + p.sum(-1), acc * scale[..., None], p


def adaptive_span_attention(query: jax.Array, key: jax.Array, value: jax.Array, spans: jax.Array, *,
                            max_span: float, ramp: float, is_causal: bool = False, block_size: int = 64,
                            key_valid: jax.Array | None = None, precision: Any = None) -> jax.Array:
    """Blockwise adaptive-span self-attention, ``[B, T, N, H]`` x ``[B, T, K, H]`` -> ``[B, T, N, H]``.

    ``spans`` ``[N]`` (tokens, traced) must not exceed ``max_span`` (static: it bounds the offsets compiled);
    ``key_valid`` ``[B, T]`` is a key-padding vector. Offsets beyond ``max(spans) + ramp`` are skipped at run time.
    """
    b, t, n, h = query.shape
    k = key.shape[2]
    f = jnp.promote_types(query.dtype, jnp.float32)  # scores and sums: float32 (float64 for float64 inputs)
    spans = spans.astype(f)
    w = min(block_size, t)
    nb = -(-t // w)
    reach = math.ceil(max_span + ramp) - 1  # the largest distance that can have m > 0
    far = min(-(-reach // w), nb - 1)  # key blocks either side a query block can need
    offsets = np.arange(-far, (0 if is_causal else far) + 1)  # d = key block - query block
    per_group = -(-nb // GROUPS)
    groups = -(-nb // per_group)
    nbp = groups * per_group
    blocks = np.arange(nbp).reshape(groups, per_group)[:, :, None] + offsets  # (groups, pg, D) key block index
    has_keys = jnp.asarray(((blocks >= 0) & (blocks < nb)).any(1))  # (groups, D): static
    nearest = jnp.asarray(np.maximum(0, np.abs(offsets) * w - (w - 1)))  # (D,) smallest |distance| at offset d
    needed = nearest < jax.lax.stop_gradient(spans.max()) + ramp  # (D,): traced, from the current spans
    q = group_heads(query, k) / jnp.sqrt(h).astype(query.dtype)  # (B, T, K, G, H)
    q = jnp.pad(q, [(0, 0), (0, nbp * w - t), (0, 0), (0, 0), (0, 0)])
    q = jnp.moveaxis(q.reshape(b, groups, per_group, w, k, n // k, h), 1, 0)  # (groups, B, pg, w, K, G, H)
    pad = [(0, 0), (far * w, (nbp + far) * w - t)]
    keys, values = (jnp.pad(x, pad + [(0, 0), (0, 0)]) for x in (key, value))  # (B, (2 far + nbp) w, K, H)
    valid = jnp.ones((b, t), bool) if key_valid is None else key_valid.astype(bool)
    valid = jnp.pad(valid, pad)  # (B, (2 far + nbp) w): False outside the sequence
    inside = jnp.pad(jnp.ones((t,), bool), pad[1])  # ((2 far + nbp) w,): False only outside the sequence
    within = jnp.arange(w)[:, None] - jnp.arange(w)[None, :]  # (w, w): query - key position inside a block pair

    def keys_at(x, g, d):
        """Key blocks ``g * pg + i + d`` for the group's query blocks i: one contiguous slice, ``[..., pg, w]``."""
        ax = 1 if x.ndim > 1 else 0  # positions follow the batch axis, if any
        x = jax.lax.dynamic_slice_in_dim(x, (far + g * per_group + d) * w, per_group * w, axis=ax)
        return x.reshape(*x.shape[:ax], per_group, w, *x.shape[ax + 1:])

    def offset_step(g, qg, carry, d):
        """Folds the key blocks d blocks away into every query block of group g."""
        kg, vg = keys_at(keys, g, d), keys_at(values, g, d)  # (B, pg, w, K, H)
        vis = keys_at(valid, g, d)[:, None, None, :, None, :]  # (B, 1, 1, pg, 1, w)
        m = span_mask(within - d * w, spans, ramp, is_causal).reshape(k, n // k, 1, w, w)  # (K, G, 1, w, w)
        m = jnp.where(keys_at(inside, g, d)[:, None, :], m, 0.0)  # (K, G, pg, w, w)
        logits = jnp.einsum("bnqkgh,bnckh->bkgnqc", qg, kg, precision=precision,
                            preferred_element_type=f)  # (B, K, G, pg, w, w)
        top, total, acc, p = fold(carry, logits, m, vis)
        pv = jnp.einsum("bkgnqc,bnckh->bkgnqh", p.astype(vg.dtype), vg, precision=precision,
                        preferred_element_type=f)  # (B, K, G, pg, w, H)
        return top, total, acc + pv

    @jax.checkpoint  # the backward pass recomputes one group at a time
    def one_group(xs):
        g, qg = xs  # (), (B, pg, w, K, G, H)

        def step(carry, xs):
            d, run = xs
            return jax.lax.cond(run, lambda c: offset_step(g, qg, c, d), lambda c: c, carry), None

        stats = jnp.full((b, k, n // k, per_group, w), NEG, f)  # (B, K, G, pg, w)
        init = (stats, jnp.zeros_like(stats), jnp.zeros((*stats.shape, h), f))
        xs = (jnp.asarray(offsets), has_keys[g] & needed)
        (_, total, acc), _ = jax.lax.scan(jax.checkpoint(step, prevent_cse=False), init, xs)
        out = acc / jnp.where(total > 0.0, total, 1.0)[..., None]  # rows past the end have nothing: 0
        return jnp.transpose(out, (0, 3, 4, 1, 2, 5))  # (B, pg, w, K, G, H)

    out = jax.lax.map(one_group, (jnp.arange(groups), q))  # (groups, B, pg, w, K, G, H)
    return jnp.moveaxis(out, 0, 1).reshape(b, nbp * w, n, h)[:, :t].astype(query.dtype)  # (B, T, N, H)


def span_weights(query: jax.Array, key: jax.Array, spans: jax.Array, *, ramp: float, is_causal: bool = False,
                 key_valid: jax.Array | None = None, precision: Any = None,
                 query_start: jax.Array | int = 0) -> jax.Array:
    """The dense ``[B, N, T, S]`` matrix :func:`adaptive_span_attention` implies (O(T S): analysis at small T, and a
    decode step, T = 1, against S cached keys). Query t sits at position ``query_start + t``, key s at s."""
    b, t, n, h = query.shape
    s = key.shape[1]
    f = jnp.promote_types(query.dtype, jnp.float32)
    q = group_heads(query, key.shape[2]) / jnp.sqrt(h).astype(query.dtype)  # (B, T, K, G, H)
    logits = jnp.einsum("btkgh,bskh->bkgts", q, key, precision=precision,
                        preferred_element_type=f).reshape(b, n, t, s)  # (B, N, T, S)
    offset = (query_start + jnp.arange(t))[:, None] - jnp.arange(s)[None, :]  # (T, S): query - key position
    m = span_mask(offset, spans.astype(f), ramp, is_causal)  # (N, T, S)
    valid = jnp.ones((b, s), bool) if key_valid is None else key_valid.astype(bool)
    stats = jnp.full((b, n, t), NEG, f)
    _, total, _, p = fold((stats, jnp.zeros_like(stats), stats[..., None]), logits, m, valid[:, None, None, :])
    return (p / total[..., None]).astype(query.dtype)  # total > 0 when the key at distance 0 is there (m = 1)


def _check(name: str, value: Any, ok: bool, allowed: str) -> None:
    if not ok:
        raise ValueError(f"attention.{name} must be {allowed}, got {value!r}")


@register("adaptive_span")
class AdaptiveSpanAttention(AttentionKernel):
    """Adaptive attention span (see the module docstring).

    Options:
      max_span: S, the largest span a head can learn, in tokens (default 1024). It bounds the key offsets compiled
        (``S + ramp``), not the work done: offsets beyond the current ``max z + ramp`` are skipped at run time.
      ramp: R, width of the soft ramp in tokens (default 32; the paper's R); any positive number.
      init_span: initial span as a fraction of ``max_span``, in [0, 1] (default 0.0, the paper code's
        ``adapt_span_init``: heads start seeing ``ramp`` tokens and grow where the loss needs it).
      block_size: query/key block size w of the blockwise computation (default 64); skipping is per w keys.
      clamp: clamp v to [0, 1] after every optimizer step (default False), as the paper's code does
        (``AdaptiveMask.clamp_param``: "this needs to be called after each update"). Without it v can sink below 0,
        where the forward pass no longer changes: every head's v of the dynamic LM preset ended at -0.11 to -0.39
        (docs/dynamic.md, "Why the spans did not move").

    ``z = S clip(v, 0, 1)`` in value; its gradient reaches v straight through the clip, as in the paper's code,
    where v enters the mask unclipped and is clamped to [0, 1] after each optimizer step: here that clamp is the
    ``clamp`` option (:meth:`project`). Self-attention only (distances between two sequences are undefined),
    key-padding masks only, no attention dropout. KV-cache decoding: the module passes the decoded query's cache slot
    (``decode_needs_position``), and one step is :func:`span_weights` over the cache -- O(S_max) per step and head,
    like dense decoding (the blockwise path is for long training sequences). ``need_weights`` returns the dense
    matrix and the output computed from it, so ``out == dense.apply_weights(weights, value)``. Tests compare at
    'highest' matmul precision (tests/conftest.py).
    """

    supports_cross = False
    supports_dropout = False
    decode_needs_position = True
    penalty_key = "span"  # config.loss.span.weight x penalty(), summed over layers (attn_lab/objectives/span.py)

    def __init__(self, *, max_span: int = 1024, ramp: float = 32.0, init_span: float = 0.0, block_size: int = 64,
                 clamp: bool = False, **shared: Any):
        super().__init__(**shared)
        integer = lambda x: isinstance(x, int) and not isinstance(x, bool)
        number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
        _check("max_span", max_span, integer(max_span) and max_span >= 1, "a positive integer")
        _check("ramp", ramp, number(ramp) and ramp > 0, "a positive number (tokens)")
        _check("init_span", init_span, number(init_span) and 0 <= init_span <= 1, "a fraction in [0, 1]")
        _check("block_size", block_size, integer(block_size) and block_size >= 1, "a positive integer")
        _check("clamp", clamp, isinstance(clamp, bool), "true or false")
        self.max_span, self.ramp, self.init_span, self.block_size = max_span, float(ramp), init_span, block_size
        self.clamp = clamp
        param_dtype = shared.get("param_dtype") or jnp.float32
        self.span_fraction = nnx.Param(jnp.full((self.num_heads,), init_span, param_dtype))  # v, one per head

    def spans(self) -> jax.Array:
        """Per-head span z in tokens, ``[num_heads]``: ``S clip(v, 0, 1)``, gradient straight through the clip."""
        v = self.span_fraction[...].astype(jnp.float32)
        return self.max_span * (v + jax.lax.stop_gradient(jnp.clip(v, 0.0, 1.0) - v))

    @property
    def projects(self) -> bool:
        return self.clamp

    def project(self) -> None:
        """v clamped to [0, 1] (the ``clamp`` option): a span the loss pushed out of [0, S] starts the next step at
        the bound, where the ramp's gradient can bring it back."""
        self.span_fraction[...] = jnp.clip(self.span_fraction[...], 0.0, 1.0)

    def penalty(self) -> jax.Array:
        """Sukhbaatar's span loss of this layer before its coefficient: the mean over heads of z in tokens."""
        return self.spans().mean()

    def learned(self) -> dict[str, jax.Array]:
        return {"span": self.spans()}

    def __call__(self, query, key, value, *, mask, is_causal, dropout_rng, dropout_rate, broadcast_dropout,
                 deterministic, precision, need_weights, query_position=None):
        opts = dict(ramp=self.ramp, is_causal=is_causal, key_valid=key_padding(mask, self.name), precision=precision)
        decode = query_position is not None  # queries [B, 1, N, H] at query_position, keys = the cache [B, S, K, H]
        if decode:  # causal: keys after the query are unwritten cache slots
            self.check(dropout=dropout_rate > 0.0 and not deterministic)
            opts.update(is_causal=True, query_start=query_position)
        else:
            self.check_call(query, key, dropout_rate, deterministic)
        if need_weights or decode:
            weights = span_weights(query, key, self.spans(), **opts)  # (B, N, T, S)
            return apply_weights(weights, value, precision), weights if need_weights else None
        return adaptive_span_attention(query, key, value, self.spans(), max_span=self.max_span,
                                       block_size=self.block_size, **opts), None
