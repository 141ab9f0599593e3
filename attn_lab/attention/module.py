"""Drop-in replacement for ``flax.nnx.MultiHeadAttention`` with pluggable kernels, head masks and capture.

Same constructor arguments and call as flax, and with the ``dense`` kernel the same parameter tree
(``query``/``key``/``value``/``out`` ``LinearGeneral`` layers), so flax weights load with ``nnx.update`` and give the
same outputs. Added on top, each for an ablation this lab runs:

- ``attention=``: the kernel by registered name or ``{'name': ..., **options}`` (see ``registry.py``);
- ``head_dim=``: decouples per-head size from ``in_features / num_heads`` (fixed-d_k head-count sweeps);
- ``use_query_bias``/``use_key_bias``/``use_value_bias``/``use_out_bias``: per-projection bias switches;
- ``head_mask=`` at call time: ``[num_heads]`` or ``[batch..., num_heads]`` multiplying each head's output before
  the output projection -- differentiable, so heads can be masked, scored by gradient (Michel et al. 2019) and gated;
- ``sow_weights`` / ``sow_head_outputs``: capture the attention matrix and per-head outputs in the same pass.

Layouts are flax's: inputs ``[batch..., length, features]`` with any number of batch dimensions (zero included), in
forward, masks and decode. Kernels only ever see one batch axis (``[B, T, N, H]``, masks ``[B|1, N|1, T|1, S]``):
the leading dimensions are merged at the module boundary and restored on the output, the sown intermediates and the
decode cache, so a kernel file never deals with batch rank and every kernel gets every layout.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import initializers
from flax.nnx.nn.attention import combine_masks

from attn_lab.attention.registry import build_kernel

Array = jax.Array
default_kernel_init = initializers.lecun_normal()


def merge_batch(x: Array, batch: tuple[int, ...], what: str) -> Array:
    """``[*lead, *rest] -> [B|1, *rest]``: the ``len(batch)`` leading dims (each 1 or equal to ``batch``'s) merged.

    All-singleton leading dims stay one singleton axis, so a mask shared by the batch is never materialized per
    example; otherwise they are broadcast to ``batch`` first (numpy semantics, as flax's masks).
    """
    lead, rest = x.shape[:len(batch)], x.shape[len(batch):]
    if len(lead) != len(batch) or any(d not in (1, b) for d, b in zip(lead, batch)):
        raise ValueError(f"{what} shape {tuple(x.shape)} does not broadcast to the inputs' batch dims {batch}")
    if all(d == 1 for d in lead):
        return x.reshape((1, *rest))
    return jnp.broadcast_to(x, (*batch, *rest)).reshape((math.prod(batch), *rest))


def split_batch(x: Array, batch: tuple[int, ...]) -> Array:
    """Inverse of :func:`merge_batch`: ``[B|1, *rest] -> [*batch, *rest]`` (or ``[1, ..., 1, *rest]``)."""
    lead = batch if x.shape[0] == math.prod(batch) else (1,) * len(batch)
    return x.reshape((*lead, *x.shape[1:]))


def merge_mask(mask: Array | None, batch: tuple[int, ...]) -> Array | None:
    """A mask broadcastable to ``[*batch, num_heads, q_len, kv_len]`` -> ``[B|1, N|1, T|1, S]`` (what kernels take).

    Missing leading dims count as 1 (numpy broadcasting), so ``[T, S]`` or ``[1, T, S]`` masks work at any batch rank.
    """
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    rank = len(batch) + 3
    if mask.ndim > rank:
        raise ValueError(f"mask has {mask.ndim} dims; with batch dims {batch} it must broadcast to "
                         f"[*batch, num_heads, q_len, kv_len] ({rank} dims)")
    mask = mask.reshape((1,) * (rank - mask.ndim) + mask.shape)
    return merge_batch(mask, batch, "mask")  # (B|1, N|1, T|1, S)


class MultiHeadAttention(nnx.Module):
    """Multi-head attention; see the module docstring and ``flax.nnx.MultiHeadAttention`` for the shared args.

    Args beyond flax:
      attention: kernel name or ``{'name': name, **options}``; default ``'dense'`` (exact softmax).
      head_dim: size of each head; default ``qkv_features // num_heads`` as in flax.
      use_query_bias, use_key_bias, use_value_bias, use_out_bias: per-projection bias; ``None`` follows ``use_bias``.
    """

    def __init__(self, num_heads: int, in_features: int, qkv_features: int | None = None,
                 out_features: int | None = None, num_kv_heads: int | None = None,
                 in_kv_features: int | None = None, *, attention: Any = "dense", head_dim: int | None = None,
                 use_query_bias: bool | None = None, use_key_bias: bool | None = None,
                 use_value_bias: bool | None = None, use_out_bias: bool | None = None,
                 dtype: Any = None, param_dtype: Any = jnp.float32, broadcast_dropout: bool = True,
                 dropout_rate: float = 0.0, deterministic: bool | None = None, precision: Any = None,
                 kernel_init: Any = default_kernel_init, out_kernel_init: Any = None,
                 bias_init: Any = initializers.zeros_init(), out_bias_init: Any = None, use_bias: bool = True,
                 attention_fn: Any = None, decode: bool | None = None, normalize_qk: bool = False,
                 qkv_dot_general: Any = None, out_dot_general: Any = None, rngs: nnx.Rngs,
                 keep_rngs: bool = True):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        self.in_features = in_features
        self.in_kv_features = in_kv_features or in_features
        self.out_features = out_features or in_features
        self.head_dim = self._resolve_head_dim(qkv_features, head_dim)
        self.qkv_features = num_heads * self.head_dim
        if num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be divisible by num_kv_heads ({self.num_kv_heads})")
        self.dtype, self.param_dtype, self.precision = dtype, param_dtype, precision
        self.broadcast_dropout, self.dropout_rate, self.deterministic = broadcast_dropout, dropout_rate, deterministic
        self.decode, self.normalize_qk, self.attention_fn = decode, normalize_qk, attention_fn

        def proj(in_f, heads, bias, **kw):
            return nnx.LinearGeneral(in_f, (heads, self.head_dim), use_bias=use_bias if bias is None else bias,
                                     kernel_init=kernel_init, bias_init=bias_init, dtype=dtype,
                                     param_dtype=param_dtype, precision=precision, dot_general=qkv_dot_general,
                                     rngs=rngs, **kw)

        self.query = proj(in_features, num_heads, use_query_bias)
        self.key = proj(self.in_kv_features, self.num_kv_heads, use_key_bias)
        self.value = proj(self.in_kv_features, self.num_kv_heads, use_value_bias)
        ln = lambda: nnx.LayerNorm(self.head_dim, use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.query_ln = ln() if normalize_qk else nnx.data(None)
        self.key_ln = ln() if normalize_qk else nnx.data(None)
        self.out = nnx.LinearGeneral((num_heads, self.head_dim), self.out_features, axis=(-2, -1),
                                     use_bias=use_bias if use_out_bias is None else use_out_bias,
                                     kernel_init=out_kernel_init or kernel_init,
                                     bias_init=out_bias_init or bias_init, dtype=dtype, param_dtype=param_dtype,
                                     precision=precision, dot_general=out_dot_general, rngs=rngs)
        self.kernel = build_kernel(attention, num_heads=num_heads, num_kv_heads=self.num_kv_heads,
                                   head_dim=self.head_dim, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.kernel.check(dropout=dropout_rate > 0)
        self.rngs = rngs.dropout.fork() if keep_rngs and dropout_rate > 0 else nnx.data(None)
        self.cached_key: nnx.Cache | None = nnx.data(None)
        self.cached_value: nnx.Cache | None = nnx.data(None)
        self.cache_index: nnx.Cache | None = nnx.data(None)

    def _resolve_head_dim(self, qkv_features: int | None, head_dim: int | None) -> int:
        if head_dim is None:
            qkv = qkv_features or self.in_features
            if qkv % self.num_heads:
                raise ValueError(f"qkv_features ({qkv}) must be divisible by num_heads ({self.num_heads}); "
                                 "or set head_dim")
            return qkv // self.num_heads
        if qkv_features is not None and qkv_features != self.num_heads * head_dim:
            raise ValueError(f"qkv_features ({qkv_features}) != num_heads * head_dim "
                             f"({self.num_heads} * {head_dim}); set only one of them")
        return head_dim

    def __call__(self, inputs_q: Array, inputs_k: Array | None = None, inputs_v: Array | None = None, *,
                 mask: Array | None = None, deterministic: bool | None = None,
                 rngs: nnx.Rngs | nnx.RngStream | None = None, sow_weights: bool = False,
                 decode: bool | None = None, is_causal: bool = False, head_mask: Array | None = None,
                 sow_head_outputs: bool = False) -> Array:
        """Attends from ``inputs_q [batch..., q_len, in_features]`` to ``inputs_k``/``inputs_v`` (default: itself).

        Any number of batch dims, zero included, as flax; ``inputs_k``/``inputs_v`` have ``inputs_q``'s batch dims.
        As in flax, ``mask`` is boolean and broadcastable to ``[batch..., num_heads, q_len, kv_len]``, and
        ``is_causal`` is ignored in decode mode (the cache already hides unwritten slots; a causal mask on a
        one-row query would keep only the first key).

        Args (beyond flax's):
          head_mask: multiplier of each head's output, ``[num_heads]`` (every example) or
            ``[batch..., num_heads]`` (per example; batch dims of size 1 broadcast).
          sow_head_outputs: sow the masked per-head outputs ``[batch..., q_len, num_heads, head_dim]`` as
            ``nnx.Intermediate`` ``'head_outputs'`` and the per-head values ``[batch..., kv_len, num_kv_heads,
            head_dim]`` as ``'values'`` (``sow_weights`` sows ``'attention_weights'``
            ``[batch..., num_heads, q_len, kv_len]``, as flax).

        Returns:
          ``[batch..., q_len, out_features]``.
        """
        inputs_q, inputs_k, inputs_v = self._inputs(inputs_q, inputs_k, inputs_v)
        batch = tuple(inputs_q.shape[:-2])
        decode = bool(self.decode if decode is None else decode)
        self.kernel.check(causal=is_causal or decode, cross=inputs_k is not inputs_q, decode=decode)
        flat = [x.reshape((math.prod(batch), *x.shape[-2:])) for x in (inputs_q, inputs_k, inputs_v)]  # (B, T|S, F)
        query = self.query(flat[0])  # (B, T, N, H)
        key = self.key(flat[1])  # (B, S, K, H)
        value = self.value(flat[2])  # (B, S, K, H)
        if self.normalize_qk:
            query, key = self.query_ln(query), self.key_ln(key)
        mask = merge_mask(mask, batch)  # (B|1, N|1, T|1, S)
        position = None
        if decode:
            key, value, mask = self._update_cache(key, value, mask, batch)  # (B, S_max, K, H)
            position = self.cache_index[...] - 1  # (): the slot just written, the decoded query's position
        dropout_rng, deterministic = self._dropout_rng(deterministic, rngs)
        out, weights = self._attend(query, key, value, mask, batch, is_causal and not decode, dropout_rng,
                                    deterministic, sow_weights, position)  # (B, T, N, H)
        if sow_weights and weights is not None:
            self.sow(nnx.Intermediate, "attention_weights", split_batch(weights, batch))  # (*batch, N, T, S)
        if head_mask is not None:
            out = out * self._expand_head_mask(head_mask, batch, out.dtype)  # (B, T, N, H)
        if sow_head_outputs:
            self.sow(nnx.Intermediate, "head_outputs", split_batch(out, batch))  # (*batch, T, N, H)
            self.sow(nnx.Intermediate, "values", split_batch(value, batch))  # (*batch, S, K, H): value diversity
        return split_batch(self.out(out), batch)  # (*batch, T, out_features)

    def _inputs(self, inputs_q: Array, inputs_k: Array | None, inputs_v: Array | None) -> tuple[Array, Array, Array]:
        """flax's defaults (keys = queries, values = keys) and layout checks, with one-line errors."""
        if inputs_k is None:
            if inputs_v is not None:
                raise ValueError("`inputs_k` cannot be None if `inputs_v` is not None")
            inputs_k = inputs_q
        inputs_v = inputs_k if inputs_v is None else inputs_v
        if inputs_q.ndim < 2:
            raise ValueError(f"inputs_q must be [batch..., length, features], got shape {tuple(inputs_q.shape)}")
        if inputs_q.shape[-1] != self.in_features:
            raise ValueError(f"inputs_q has {inputs_q.shape[-1]} features, module expects {self.in_features}")
        for name, x in (("inputs_k", inputs_k), ("inputs_v", inputs_v)):
            if x.ndim != inputs_q.ndim or x.shape[:-2] != inputs_q.shape[:-2]:
                raise ValueError(f"{name} shape {tuple(x.shape)} must have the batch dims of inputs_q "
                                 f"{tuple(inputs_q.shape)}: [batch..., length, features]")
        return inputs_q, inputs_k, inputs_v

    def _attend(self, query, key, value, mask, batch, is_causal, dropout_rng, deterministic, sow_weights, position):
        common = dict(dropout_rng=dropout_rng, dropout_rate=self.dropout_rate, broadcast_dropout=self.broadcast_dropout,
                      deterministic=deterministic, precision=self.precision, is_causal=is_causal)
        if self.attention_fn is not None:  # a user's flax-style function, called as flax does: [batch..., T, N, H]
            split = lambda x: None if x is None else split_batch(x, batch)
            out = self.attention_fn(split(query), split(key), split(value), mask=split(mask), dtype=self.dtype,
                                    module=self if sow_weights else None, **common)  # (*batch, T, N, H)
            return out.reshape((math.prod(batch), *out.shape[len(batch):])), None
        if position is not None and self.kernel.decode_needs_position:
            common["query_position"] = position
        return self.kernel(query, key, value, mask=mask, need_weights=sow_weights, **common)

    def _expand_head_mask(self, head_mask: Array, batch: tuple[int, ...], dtype: Any) -> Array:
        """``[num_heads]`` or ``[*batch, num_heads]`` -> ``[B|1, 1, N, 1]``, broadcast over positions and head_dim."""
        head_mask = jnp.asarray(head_mask, dtype)
        if head_mask.ndim not in (1, len(batch) + 1) or head_mask.shape[-1] != self.num_heads:
            raise ValueError(f"head_mask must be [num_heads] or [*batch, num_heads] = {(*batch, self.num_heads)}, "
                             f"got shape {tuple(head_mask.shape)}")
        head_mask = head_mask.reshape((1,) * (len(batch) + 1 - head_mask.ndim) + head_mask.shape)  # (*batch|1, N)
        return merge_batch(head_mask, batch, "head_mask")[:, None, :, None]  # (B|1, 1, N, 1)

    def _dropout_rng(self, deterministic: bool | None, rngs: Any) -> tuple[Array | None, bool]:
        """(dropout key or None, deterministic). The flag reaches the kernel even without dropout: stateful
        kernels (Performer's feature redraw) act only in training calls."""
        deterministic = self.deterministic if deterministic is None else deterministic
        if self.dropout_rate <= 0.0:
            return None, True if deterministic is None else bool(deterministic)
        if deterministic is None:
            raise ValueError("MultiHeadAttention with dropout needs `deterministic` (argument or attribute)")
        if deterministic:
            return None, True
        stream = rngs.dropout if isinstance(rngs, nnx.Rngs) else (rngs if rngs is not None else self.rngs)
        if stream is None:
            raise ValueError("'rngs' must be passed to __call__ when the module was built with keep_rngs=False")
        return stream(), False

    def _update_cache(self, key: Array, value: Array, mask: Array | None, batch: tuple[int, ...]):
        """Writes one step's key/value ``[B, 1, K, H]`` at the cache index; masks the slots not yet written.

        The cache keeps ``init_cache``'s shape ``[*batch, S_max, K, H]`` (flax's, so cache state moves between the
        two modules); only here is it viewed with one batch axis.
        """
        if self.cached_key is None:
            raise ValueError("autoregressive cache not initialized: call init_cache(input_shape) first")
        shape = tuple(self.cached_key.shape)
        *cache_batch, max_length, num_kv_heads, head_dim = shape
        wanted = (*cache_batch, 1, num_kv_heads, head_dim)
        if (*batch, *key.shape[1:]) != wanted:
            raise ValueError(f"decode expects one token per call with the cache's batch dims: got key shape "
                             f"{(*batch, *key.shape[1:])}, cache {shape} wants {wanted}")
        flat = (math.prod(batch), max_length, num_kv_heads, head_dim)
        i = self.cache_index[...]
        zero = jnp.zeros((), i.dtype)

        def write(cache: nnx.Cache, new: Array) -> Array:
            updated = jax.lax.dynamic_update_slice(cache[...].reshape(flat), new.astype(cache.dtype),
                                                   (zero, i, zero, zero))  # (B, S_max, K, H)
            cache[...] = updated.reshape(shape)
            return updated

        key, value = write(self.cached_key, key), write(self.cached_value, value)
        self.cache_index[...] = i + 1
        written = jnp.broadcast_to(jnp.arange(max_length) <= i, (flat[0], 1, 1, max_length))  # (B, 1, 1, S_max)
        return key, value, combine_masks(mask, written, dtype=jnp.bool_)

    def keep_heads(self, keep: Any) -> "MultiHeadAttention":
        """A copy holding only the heads ``keep`` (indices): smaller query/key/value/output projections, so the
        compiled forward does less work (Michel et al. 2019, structural pruning). Equals this module with the other
        heads masked by ``head_mask``. Needs one key/value head per query head and a kernel without variables (a
        kernel's own per-head state, e.g. unshared Linformer projections, is not sliced)."""
        keep = [int(h) for h in keep]
        if not keep or len(set(keep)) != len(keep) or not all(0 <= h < self.num_heads for h in keep):
            raise ValueError(f"keep_heads: {keep} must be distinct head indices in [0, {self.num_heads})")
        if self.num_kv_heads != self.num_heads:
            raise ValueError(f"keep_heads needs num_kv_heads == num_heads (got {self.num_kv_heads} key/value heads "
                             f"for {self.num_heads} query heads); mask grouped heads with head_mask instead")
        if jax.tree.leaves(nnx.state(self.kernel)):
            raise ValueError(f"keep_heads: kernel {type(self.kernel).__name__} holds variables that are not sliced "
                             "by head; mask its heads with head_mask instead")
        new = nnx.clone(self)
        idx = jnp.asarray(keep)
        for proj in (new.query, new.key, new.value):
            proj.kernel = nnx.Param(proj.kernel[...][:, idx])  # (d, n, H)
            if proj.bias is not None:
                proj.bias = nnx.Param(proj.bias[...][idx])  # (n, H)
            proj.out_features = (len(keep), self.head_dim)
        new.out.kernel = nnx.Param(new.out.kernel[...][idx])  # (n, H, d)
        new.out.in_features = (len(keep), self.head_dim)
        new.num_heads = new.num_kv_heads = new.kernel.num_heads = new.kernel.num_kv_heads = len(keep)
        new.qkv_features = len(keep) * self.head_dim
        return new

    def init_cache(self, input_shape: tuple[int, ...], dtype: Any = jnp.float32) -> None:
        """Preallocates the KV cache for ``input_shape = (*batch, max_length, features)``, any number of batch dims
        (zero included), as flax; then call with decode=True, one token ``[*batch, 1, features]`` per call."""
        shape = (*input_shape[:-1], self.num_kv_heads, self.head_dim)  # (*batch, S_max, K, H)
        self.cached_key = nnx.Cache(jnp.zeros(shape, dtype))
        self.cached_value = nnx.Cache(jnp.zeros(shape, dtype))
        self.cache_index = nnx.Cache(jnp.array(0, dtype=jnp.int32))
