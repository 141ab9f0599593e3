"""Greedy decoding through the decoder's preallocated KV cache (one token per step, one compiled loop)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from attn_lab.models.transformer import BOS, EOS, Ctx
from attn_lab.train.steps import merge


def greedy_decode(state: dict, inputs: jax.Array, *, graphdef: Any, max_len: int) -> jax.Array:
    """``inputs [B, S]`` -> greedy target ids ``[B, max_len]`` (0 after EOS).

    The encoder runs once; each loop step feeds one token to the decoder with ``decode=True`` so its self-attention
    reads and extends the KV cache; the loop stops early once every row has produced EOS.
    """
    model = merge(graphdef, state)
    batch = inputs.shape[0]
    memory = model.encode(inputs)  # (B, S, d)
    model.init_cache(batch, max_len)
    cache_def, cache_state = nnx.split(model)

    def cond(carry):
        i, _, _, _, done = carry
        return (i < max_len) & ~done.all()

    def body(carry):
        i, state, token, out, done = carry
        m = nnx.merge(cache_def, state)
        logits = m.decode(token[:, None], memory, inputs, Ctx(decode=True), start=i)  # (B, 1, V)
        nxt = jnp.where(done, 0, logits[:, 0].argmax(-1)).astype(jnp.int32)  # (B,)
        return i + 1, nnx.state(m), nxt, out.at[:, i].set(nxt), done | (nxt == EOS)

    start = (jnp.int32(0), cache_state, jnp.full((batch,), BOS, jnp.int32), jnp.zeros((batch, max_len), jnp.int32),
             jnp.zeros((batch,), bool))
    return jax.lax.while_loop(cond, body, start)[3]


def compile_decode(graphdef: Any, max_len: int):
    """The jitted greedy decoder for one model graph."""
    return jax.jit(functools.partial(greedy_decode, graphdef=graphdef, max_len=max_len))
