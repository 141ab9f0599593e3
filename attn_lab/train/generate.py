"""Sampling from a language model: greedy, temperature and top-k, through the KV cache or by re-running the prefix.

:func:`generate` continues prompts ``[B, P]`` by ``new_tokens`` tokens in one compiled loop. With a cache
(every kernel of the model supports decoding) the prompt is fed one token per step (prefill) and each new token
costs one query against the cache -- O(T) per token; without one (local, sparse, lsh kernels) step t re-runs the
causal model over the whole buffer and reads position t, O(T^2) per token. Both give the same tokens
(tests/test_lm.py); ``scripts/bench_train.py --loop`` times them side by side.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from attn_lab.models.transformer import Ctx
from attn_lab.train.state import merge


def pick(logits: jax.Array, key: jax.Array, temperature: float, top_k: int | None) -> jax.Array:
    """``logits [B, V]`` -> next tokens ``[B]``: argmax at temperature 0, else a sample from the softmax of
    ``logits / temperature`` restricted to the ``top_k`` largest (all when None)."""
    if temperature == 0.0:
        return logits.argmax(-1).astype(jnp.int32)
    scaled = logits.astype(jnp.float32) / temperature
    if top_k is not None:
        kth = jax.lax.top_k(scaled, top_k)[0][:, -1:]  # (B, 1): the k-th largest logit
        scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    return jax.random.categorical(key, scaled).astype(jnp.int32)


def generate_cached(state: dict, prompt: jax.Array, key: jax.Array, *, graphdef: Any, new_tokens: int,
                    temperature: float = 0.0, top_k: int | None = None) -> jax.Array:
    """``prompt [B, P]`` -> ``[B, P + new_tokens]`` through the KV cache: step i feeds token i, and from the
    prompt's last token on, each step's logits choose the next token."""
    model = merge(graphdef, state)
    batch, prompt_len = prompt.shape
    total = prompt_len + new_tokens
    model.init_cache(batch, total)
    cache_def, cache_state = nnx.split(model)
    tokens = jnp.zeros((batch, total), jnp.int32).at[:, :prompt_len].set(prompt)

    def body(i, carry):
        state, tokens = carry
        m = nnx.merge(cache_def, state)
        logits = m(jax.lax.dynamic_slice_in_dim(tokens, i, 1, axis=1), Ctx(decode=True), start=i)  # (B, 1, V)
        nxt = pick(logits[:, 0], jax.random.fold_in(key, i), temperature, top_k)  # (B,)
        keep = i + 1 < prompt_len  # still inside the prompt: the next token is given
        nxt = jnp.where(keep, jax.lax.dynamic_index_in_dim(tokens, jnp.minimum(i + 1, total - 1), 1, False), nxt)
        return nnx.state(m), jax.lax.dynamic_update_slice_in_dim(tokens, nxt[:, None], jnp.minimum(i + 1, total - 1),
                                                                 axis=1)

    return jax.lax.fori_loop(0, total - 1, body, (cache_state, tokens))[1]


def generate_uncached(state: dict, prompt: jax.Array, key: jax.Array, *, graphdef: Any, new_tokens: int,
                      temperature: float = 0.0, top_k: int | None = None) -> jax.Array:
    """The same tokens as :func:`generate_cached`, without a cache: each new token re-runs the causal model over
    the whole ``[B, P + new_tokens]`` buffer (later positions cannot affect earlier ones)."""
    model = merge(graphdef, state)
    batch, prompt_len = prompt.shape
    tokens = jnp.zeros((batch, prompt_len + new_tokens), jnp.int32).at[:, :prompt_len].set(prompt)

    def body(i, tokens):
        logits = model(tokens)  # (B, T, V)
        last = jax.lax.dynamic_index_in_dim(logits, i - 1, 1, False)  # (B, V): the logits that predict token i
        nxt = pick(last, jax.random.fold_in(key, i - 1), temperature, top_k)
        return jax.lax.dynamic_update_slice_in_dim(tokens, nxt[:, None], i, axis=1)

    return jax.lax.fori_loop(prompt_len, prompt_len + new_tokens, body, tokens)


def check_prompt(prompt: Any, vocab_size: int | None) -> None:
    """One-line ValueErrors for a prompt that is not ``[batch, tokens]`` integer ids of the model's vocabulary (an id
    past the embedding table is clamped by the gather and a negative one wraps: either would continue garbage)."""
    shape, dtype = getattr(prompt, "shape", None), getattr(prompt, "dtype", None)
    if shape is None or len(shape) != 2:
        raise ValueError(f"prompt must be token ids of shape [batch, tokens], got shape {shape}"
                         + (": use prompt[None] for one sequence" if shape is not None and len(shape) == 1 else ""))
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"prompt must hold integer token ids, got dtype {dtype}")
    if vocab_size is not None and prompt.size:
        low, high = int(jnp.min(prompt)), int(jnp.max(prompt))
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"prompt token id {bad} is outside the model's vocabulary: ids must be "
                             f"0..{vocab_size - 1}")


def check_request(prompt_len: int, new_tokens: int, max_positions: int | None) -> None:
    """One-line ValueErrors, before anything compiles, for a prompt the model cannot continue: an empty prompt (the
    loop would feed the pad id as the first token) or one whose continuation passes the model's positions (their
    table ends there: the positions would repeat and so would the output)."""
    if prompt_len < 1:
        raise ValueError("prompt is empty: give at least one token to continue (shape [batch, tokens])")
    if max_positions is not None and prompt_len + new_tokens > max_positions:
        raise ValueError(f"prompt ({prompt_len} tokens) + new_tokens ({new_tokens}) = {prompt_len + new_tokens} "
                         f"passes the model's {max_positions} positions; generate at most "
                         f"{max(max_positions - prompt_len, 0)} tokens after this prompt")


def compile_generate(graphdef: Any, new_tokens: int, *, cached: bool = True, temperature: float = 0.0,
                     top_k: int | None = None):
    """The jitted ``(state, prompt [B, P], key) -> [B, P + new_tokens]`` for one model graph; each call first checks
    the prompt against the model's positions (:func:`check_request`). Arguments that cannot work are one-line
    ValueErrors naming them, here, before anything compiles."""
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise ValueError(f"new_tokens must be a positive integer, got {new_tokens!r}")
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    fn = generate_cached if cached else generate_uncached
    run = jax.jit(functools.partial(fn, graphdef=graphdef, new_tokens=new_tokens, temperature=temperature,
                                    top_k=top_k))

    limits: list[tuple] = []  # the graph's (positions, vocabulary) (static): read once, from the first state

    def check(state: dict, prompt: jax.Array) -> None:
        if not limits:
            model = merge(graphdef, state)
            limits.append((getattr(model, "max_positions", None), getattr(model, "vocab_size", None)))
        check_prompt(prompt, limits[0][1])
        check_request(prompt.shape[-1], new_tokens, limits[0][0])

    def checked(state: dict, prompt: jax.Array, key: jax.Array) -> jax.Array:
        check(state, prompt)
        return run(state, prompt, key)

    def lower(state: dict, prompt: jax.Array, key: jax.Array):  # as jax.jit's: benchmarks compile ahead of time
        check(state, prompt)
        return run.lower(state, prompt, key)
    checked.lower = lower
    return checked
