"""Greedy decoding: through the decoder's preallocated KV cache (one token per step, one compiled loop), or -- for
decoder kernels with no cached mode (local, sparse, lsh) -- by re-running the causal decoder over the prefix.
:func:`compile_decode` picks greedy or beam search (:mod:`attn_lab.train.beam`) from the eval config."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from attn_lab.models import supports_cached_decoding
from attn_lab.models.transformer import BOS, EOS, Ctx
from attn_lab.train.beam import beam_search, beam_search_uncached
from attn_lab.train.seeds import seed_map
from attn_lab.train.state import merge


def greedy_decode(state: dict, inputs: jax.Array, head_masks: dict | None = None, *, graphdef: Any,
                  max_len: int) -> jax.Array:
    """``inputs [B, S]`` -> greedy target ids ``[B, max_len]`` (0 after EOS); ``head_masks``: ``{kind: [L, N]}``.

    The encoder runs once; each loop step feeds one token to the decoder with ``decode=True`` so its self-attention
    reads and extends the KV cache; the loop stops early once every row has produced EOS.
    """
    model = merge(graphdef, state)
    batch = inputs.shape[0]
    memory = model.encode(inputs, head_masks=head_masks)  # (B, S, d)
    model.init_cache(batch, max_len)
    cache_def, cache_state = nnx.split(model)

    def cond(carry):
        i, _, _, _, done = carry
        return (i < max_len) & ~done.all()

    def body(carry):
        i, state, token, out, done = carry
        m = nnx.merge(cache_def, state)
        logits = m.decode(token[:, None], memory, inputs, Ctx(decode=True), start=i,
                          head_masks=head_masks)  # (B, 1, V)
        nxt = jnp.where(done, 0, logits[:, 0].argmax(-1)).astype(jnp.int32)  # (B,)
        return i + 1, nnx.state(m), nxt, out.at[:, i].set(nxt), done | (nxt == EOS)

    start = (jnp.int32(0), cache_state, jnp.full((batch,), BOS, jnp.int32), jnp.zeros((batch, max_len), jnp.int32),
             jnp.zeros((batch,), bool))
    return jax.lax.while_loop(cond, body, start)[3]


def greedy_decode_uncached(state: dict, inputs: jax.Array, head_masks: dict | None = None, *, graphdef: Any,
                           max_len: int) -> jax.Array:
    """Same result as :func:`greedy_decode` without a KV cache: step ``i`` runs the causal decoder over the whole
    ``[B, max_len]`` buffer and reads position ``i`` (later positions cannot affect it). O(max_len^2) work, for
    kernels that define causal attention but not incremental decoding."""
    model = merge(graphdef, state)
    batch = inputs.shape[0]
    memory = model.encode(inputs, head_masks=head_masks)  # (B, S, d)

    def body(i, carry):
        out, done = carry  # (B, max_len), (B,)
        decoder_inputs = jnp.pad(out, ((0, 0), (1, 0)), constant_values=BOS)[:, :-1]  # (B, max_len)
        logits = model.decode(decoder_inputs, memory, inputs, head_masks=head_masks)  # (B, max_len, V)
        nxt = jnp.where(done, 0, logits[:, i].argmax(-1)).astype(jnp.int32)  # (B,)
        return out.at[:, i].set(nxt), done | (nxt == EOS)

    start = (jnp.zeros((batch, max_len), jnp.int32), jnp.zeros((batch,), bool))
    return jax.lax.fori_loop(0, max_len, body, start)[0]


def split_beam_size(ecfg: Any, split: str) -> int:
    """The beam a run decodes ``split`` with: ``eval.validation_beam_size`` for validation when set, else
    ``eval.beam_size`` (runs from before those keys: 1, greedy)."""
    beam = ecfg.get("beam_size", 1)
    return (ecfg.get("validation_beam_size") or beam) if split == "validation" else beam


def compile_decode(graphdef: Any, max_len: int, cached: bool = True, num_seeds: int | None = None,
                   beam_size: int = 1, length_penalty: float = 0.6):
    """The jitted decoder for one model graph: greedy for ``beam_size=1`` (``cached=False``:
    :func:`greedy_decode_uncached`), else :mod:`attn_lab.train.beam`'s beam search with GNMT length penalty
    ``length_penalty`` (``config.eval.beam_size`` / ``config.eval.length_penalty``).

    ``num_seeds``: decode a state with a leading seed axis (the trainer's), inputs shared by all seeds, giving
    ``[S, B, max_len]``; None: a plain state.
    """
    if beam_size == 1:  # greedy's own program: every greedy number stays what it was
        fn = functools.partial(greedy_decode if cached else greedy_decode_uncached, graphdef=graphdef, max_len=max_len)
    else:
        fn = functools.partial(beam_search if cached else beam_search_uncached, graphdef=graphdef, max_len=max_len,
                               beam_size=beam_size, length_penalty=length_penalty)
    return jax.jit(fn if num_seeds is None else seed_map(fn, num_seeds, (0, None)))


def split_decoders(graphdef: Any, max_len: int, model: nnx.Module, num_seeds: int, ecfg: Any) -> dict[str, Any]:
    """The jitted decoder per split of a generating model ({} otherwise): ``test`` decodes with
    ``eval.beam_size``; ``validation`` gets its own program only when ``eval.validation_beam_size`` differs (greedy
    validation keeps a beam-4 run's periodic evaluations at about a sixth of their decoding time, and reported test
    numbers still come from the beam), else it shares the test decoder."""
    if not model.GENERATES:
        return {}
    cached = supports_cached_decoding(model)

    def decoder(beam_size: int) -> Any:
        return compile_decode(graphdef, max_len, cached, num_seeds=num_seeds, beam_size=beam_size,
                              length_penalty=ecfg.length_penalty)
    test, validation = split_beam_size(ecfg, "test"), split_beam_size(ecfg, "validation")
    return {"test": decoder(test)} | ({"validation": decoder(validation)} if validation != test else {})
