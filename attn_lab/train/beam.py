"""Beam search for translation (Vaswani et al. 2017: beam 4, GNMT length penalty alpha 0.6).

Each example keeps ``K`` hypotheses as rows ``b * K + k`` of one ``[B * K, ...]`` decoder batch, so the decoder runs
exactly as in greedy decoding (:mod:`attn_lab.train.decode`): through its KV cache, whose rows are reordered after
each step by the parent each surviving hypothesis extends, or -- for kernels without cached decoding -- by
re-running the causal decoder over the token buffer (reordered the same way).

Scoring (Wu et al. 2016, GNMT): a hypothesis ``Y`` ranks by ``log P(Y|X) / lp(Y)``, ``lp(Y) = ((5 + |Y|) / 6)^alpha``,
``|Y|`` counting its EOS (or ``max_len`` when it never ended). Within the search hypotheses compete by ``log P``;
a finished one stays in the beam with its score (its only continuation is padding, at log-prob 0), so the final
choice sees every hypothesis the beam kept. With ``K = 1`` each step takes the argmax token: greedy decoding.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from attn_lab.models import decoding_attentions
from attn_lab.models.transformer import BOS, EOS, PAD, Ctx
from attn_lab.train.state import merge


class Beams(NamedTuple):
    """The ``K`` hypotheses of each of ``B`` examples after some steps."""
    ids: jax.Array  # (B, K, T) tokens so far, PAD after EOS
    scores: jax.Array  # (B, K) summed log-probs; -inf for slots no hypothesis fills
    lengths: jax.Array  # (B, K) tokens incl. EOS
    finished: jax.Array  # (B, K) produced EOS


def gnmt_lp(lengths: jax.Array, alpha: float) -> jax.Array:
    """GNMT's ``lp(Y) = ((5 + |Y|) / 6)^alpha`` (1 for ``alpha = 0``: plain log-probs)."""
    return ((5.0 + lengths.astype(jnp.float32)) / 6.0) ** alpha


def init_beams(batch: int, beam_size: int, max_len: int) -> Beams:
    """One live empty hypothesis per example; the other slots score -inf, so the first step fills them with
    distinct continuations of that one instead of ``K`` copies of the same."""
    scores = jnp.full((batch, beam_size), -jnp.inf).at[:, 0].set(0.0)  # (B, K)
    return Beams(jnp.zeros((batch, beam_size, max_len), jnp.int32), scores,
                 jnp.zeros((batch, beam_size), jnp.int32), jnp.zeros((batch, beam_size), bool))


def step(beams: Beams, logits: jax.Array, i: jax.Array) -> tuple[Beams, jax.Array]:
    """Extends the hypotheses by token ``i``: the ``K`` best of beam x vocab by summed log-prob.

    Args:
      beams: the hypotheses before step ``i``.
      logits: ``[B, K, V]`` next-token logits of each hypothesis.
      i: the position being written.

    Returns:
      The new hypotheses and each one's parent slot ``[B, K]`` (what the decoder's rows must be reordered by).
    """
    batch, k, vocab = logits.shape
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # (B, K, V)
    pad_only = jnp.where(jnp.arange(vocab) == PAD, 0.0, -jnp.inf)  # (V,): a finished hypothesis only pads
    logp = jnp.where(beams.finished[..., None], pad_only, logp)
    candidates = (beams.scores[..., None] + logp).reshape(batch, k * vocab)  # (B, K * V)
    scores, index = jax.lax.top_k(candidates, k)  # (B, K)
    parent, token = index // vocab, (index % vocab).astype(jnp.int32)  # (B, K)
    take = lambda x: jnp.take_along_axis(x, parent, axis=1)
    was_finished = take(beams.finished)
    ids = jnp.take_along_axis(beams.ids, parent[..., None], axis=1).at[:, :, i].set(token)  # (B, K, T)
    lengths = jnp.where(was_finished, take(beams.lengths), i + 1)
    return Beams(ids, scores, lengths, was_finished | (token == EOS)), parent


def all_done(beams: Beams) -> jax.Array:
    """Whether no hypothesis can still change: all finished or empty (-inf)."""
    return (beams.finished | jnp.isneginf(beams.scores)).all()


def best(beams: Beams, alpha: float) -> jax.Array:
    """``[B, T]`` ids of each example's hypothesis with the highest ``score / lp(length)``."""
    normalized = beams.scores / gnmt_lp(beams.lengths, alpha)  # (B, K)
    choice = normalized.argmax(-1)  # (B,)
    return jnp.take_along_axis(beams.ids, choice[:, None, None], axis=1)[:, 0]  # (B, T)


def _rows(x: jax.Array, k: int) -> jax.Array:
    """``[B, ...] -> [B * K, ...]``: each example repeated for its ``K`` hypotheses (rows ``b * K + k``)."""
    return jnp.repeat(x, k, axis=0)


def _row_masks(head_masks: dict | None, k: int) -> dict | None:
    """Head masks for the ``B * K`` rows: ``[L, N]`` are shared, per-example ``[B, L, N]`` are repeated."""
    if head_masks is None:
        return None
    return {kind: m if m is None or jnp.ndim(m) < 3 else _rows(m, k) for kind, m in head_masks.items()}


def _flat_parents(parent: jax.Array) -> jax.Array:
    """Parent slots ``[B, K]`` -> source rows ``[B * K]`` of the ``B * K`` decoder batch."""
    batch, k = parent.shape
    return (jnp.arange(batch)[:, None] * k + parent).reshape(-1)


def reorder_cache(model: nnx.Module, rows: jax.Array) -> None:
    """Gathers every cached attention's KV cache ``[B * K, S_max, K_heads, H]`` along its batch axis (the
    layout ``init_cache`` allocates); the write index is one scalar shared by all rows, so it stays."""
    for attn in decoding_attentions(model):
        attn.cached_key[...] = attn.cached_key[...][rows]
        attn.cached_value[...] = attn.cached_value[...][rows]


def _token(beams: Beams, i: jax.Array) -> jax.Array:
    """``[B * K]`` decoder input at step ``i``: BOS, then each hypothesis's last token (PAD once finished)."""
    last = jax.lax.dynamic_index_in_dim(beams.ids, jnp.maximum(i - 1, 0), axis=2, keepdims=False)  # (B, K)
    return jnp.where(i == 0, BOS, last).reshape(-1)


def beam_search(state: dict, inputs: jax.Array, head_masks: dict | None = None, *, graphdef: Any, max_len: int,
                beam_size: int, length_penalty: float) -> jax.Array:
    """``inputs [B, S]`` -> best target ids ``[B, max_len]`` (0 after EOS), through the decoder's KV cache.

    Args:
      state: the training state (``params``, ``model_state``).
      inputs: source ids, 0-padded.
      head_masks: ``{kind: [L, N] or [B, L, N]}`` multipliers, as in greedy decoding.
      graphdef: the model graph.
      max_len: the longest output.
      beam_size: hypotheses kept per example (1: greedy).
      length_penalty: GNMT's alpha (0: rank by log-prob alone).

    Returns:
      ``[B, max_len]`` int32 ids.
    """
    model, batch, k = merge(graphdef, state), inputs.shape[0], beam_size
    memory = _rows(model.encode(inputs, head_masks=head_masks), k)  # (B * K, S, d): encoded once
    rows_inputs, masks = _rows(inputs, k), _row_masks(head_masks, k)  # (B * K, S)
    model.init_cache(batch * k, max_len)
    cache_def, cache_state = nnx.split(model)

    def body(carry):
        i, state, beams = carry
        m = nnx.merge(cache_def, state)
        logits = m.decode(_token(beams, i)[:, None], memory, rows_inputs, Ctx(decode=True), start=i,
                          head_masks=masks)  # (B * K, 1, V)
        beams, parent = step(beams, logits[:, 0].reshape(batch, k, -1), i)
        reorder_cache(m, _flat_parents(parent))
        return i + 1, nnx.state(m), beams

    cond = lambda carry: (carry[0] < max_len) & ~all_done(carry[2])
    beams = jax.lax.while_loop(cond, body, (jnp.int32(0), cache_state, init_beams(batch, k, max_len)))[2]
    return best(beams, length_penalty)


def beam_search_uncached(state: dict, inputs: jax.Array, head_masks: dict | None = None, *, graphdef: Any,
                         max_len: int, beam_size: int, length_penalty: float) -> jax.Array:
    """Same result as :func:`beam_search` without a KV cache: step ``i`` runs the causal decoder over every
    hypothesis's ``[max_len]`` token buffer (the beams' ids, already reordered by parent) and reads position ``i``.
    O(max_len^2) work, for kernels that define causal attention but not incremental decoding."""
    model, batch, k = merge(graphdef, state), inputs.shape[0], beam_size
    memory = _rows(model.encode(inputs, head_masks=head_masks), k)  # (B * K, S, d)
    rows_inputs, masks = _rows(inputs, k), _row_masks(head_masks, k)

    def body(carry):
        i, beams = carry
        buffer = beams.ids.reshape(batch * k, max_len)  # (B * K, T)
        decoder_inputs = jnp.pad(buffer, ((0, 0), (1, 0)), constant_values=BOS)[:, :-1]  # (B * K, T)
        logits = model.decode(decoder_inputs, memory, rows_inputs, head_masks=masks)  # (B * K, T, V)
        logits = jax.lax.dynamic_index_in_dim(logits, i, axis=1, keepdims=False)  # (B * K, V)
        return i + 1, step(beams, logits.reshape(batch, k, -1), i)[0]

    cond = lambda carry: (carry[0] < max_len) & ~all_done(carry[1])
    beams = jax.lax.while_loop(cond, body, (jnp.int32(0), init_beams(batch, k, max_len)))[1]
    return best(beams, length_penalty)
