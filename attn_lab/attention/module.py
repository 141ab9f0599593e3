"""Drop-in replacement for ``flax.nnx.MultiHeadAttention`` with pluggable kernels, head masks and capture.

Same constructor arguments and call as flax, and with the ``dense`` kernel the same parameter tree
(``query``/``key``/``value``/``out`` ``LinearGeneral`` layers), so flax weights load with ``nnx.update`` and give the
same outputs. Added on top, each for an ablation the source articles ask about:

- ``attention=``: the kernel by registered name or ``{'name': ..., **options}`` (see ``registry.py``);
- ``head_dim=``: decouples per-head size from ``in_features / num_heads`` (fixed-d_k head-count sweeps);
- ``use_query_bias``/``use_key_bias``/``use_value_bias``/``use_out_bias``: per-projection bias switches;
- ``head_mask=`` at call time: ``[num_heads]`` or ``[batch, num_heads]`` multiplying each head's output before the
  output projection -- differentiable, so heads can be masked, scored by gradient (Michel et al. 2019) and gated;
- ``sow_weights`` / ``sow_head_outputs``: capture the attention matrix and per-head outputs in the same pass.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import initializers
from flax.nnx.nn.attention import combine_masks

from attn_lab.attention.registry import build_kernel

Array = jax.Array
default_kernel_init = initializers.lecun_normal()


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
        """Attends from ``inputs_q [batch, q_len, in_features]`` to ``inputs_k``/``inputs_v`` (default: itself).

        Args (beyond flax's):
          head_mask: ``[num_heads]`` or ``[batch, num_heads]`` multiplier of each head's output.
          sow_head_outputs: sow the masked per-head outputs ``[batch, q_len, num_heads, head_dim]`` as
            ``nnx.Intermediate`` ``'head_outputs'`` and the per-head values ``[batch, kv_len, num_kv_heads,
            head_dim]`` as ``'values'`` (``sow_weights`` sows ``'attention_weights'``).

        Returns:
          ``[batch, q_len, out_features]``.
        """
        if inputs_k is None:
            if inputs_v is not None:
                raise ValueError("`inputs_k` cannot be None if `inputs_v` is not None")
            inputs_k = inputs_q
        inputs_v = inputs_k if inputs_v is None else inputs_v
        if inputs_q.shape[-1] != self.in_features:
            raise ValueError(f"inputs_q has {inputs_q.shape[-1]} features, module expects {self.in_features}")
        decode = bool(self.decode if decode is None else decode)
        self.kernel.check(causal=is_causal or decode, cross=inputs_k is not inputs_q, decode=decode)
        query = self.query(inputs_q)  # (B, T, N, H)
        key = self.key(inputs_k)  # (B, S, K, H)
        value = self.value(inputs_v)  # (B, S, K, H)
        if self.normalize_qk:
            query, key = self.query_ln(query), self.key_ln(key)
        if decode:
            key, value, mask = self._update_cache(key, value, mask)  # (B, S_max, K, H)
        dropout_rng, deterministic = self._dropout_rng(deterministic, rngs)
        out, weights = self._attend(query, key, value, mask, is_causal, dropout_rng, deterministic, sow_weights)
        if sow_weights and weights is not None:
            self.sow(nnx.Intermediate, "attention_weights", weights)
        if head_mask is not None:
            out = out * self._expand_head_mask(head_mask, out)  # (B, T, N, H)
        if sow_head_outputs:
            self.sow(nnx.Intermediate, "head_outputs", out)
            self.sow(nnx.Intermediate, "values", value)  # (B, S, K, H), for value-subspace diversity
        return self.out(out)

    def _attend(self, query, key, value, mask, is_causal, dropout_rng, deterministic, sow_weights):
        common = dict(mask=mask, dropout_rng=dropout_rng, dropout_rate=self.dropout_rate,
                      broadcast_dropout=self.broadcast_dropout, deterministic=deterministic,
                      precision=self.precision, is_causal=is_causal)
        if self.attention_fn is not None:  # a user's flax-style attention function, called exactly as flax does
            return self.attention_fn(query, key, value, dtype=self.dtype, module=self if sow_weights else None,
                                     **common), None
        return self.kernel(query, key, value, need_weights=sow_weights, **common)

    @staticmethod
    def _expand_head_mask(head_mask: Array, out: Array) -> Array:
        head_mask = jnp.asarray(head_mask, out.dtype)
        if head_mask.ndim == 1:
            return head_mask[None, None, :, None]  # (1, 1, N, 1)
        return head_mask[:, None, :, None]  # (B, 1, N, 1)

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

    def _update_cache(self, key: Array, value: Array, mask: Array | None):
        """Writes one step's key/value at the cache index; masks the slots not yet written."""
        if self.cached_key is None:
            raise ValueError("autoregressive cache not initialized: call init_cache(input_shape) first")
        batch, max_length, num_kv_heads, head_dim = self.cached_key.shape
        if key.shape != (batch, 1, num_kv_heads, head_dim):
            raise ValueError(f"decode expects one token per call: key shape {key.shape}, "
                             f"cache wants {(batch, 1, num_kv_heads, head_dim)}")
        i = self.cache_index[...]
        zero = jnp.zeros((), i.dtype)
        key = jax.lax.dynamic_update_slice(self.cached_key[...], key.astype(self.cached_key.dtype), (zero, i, zero, zero))
        value = jax.lax.dynamic_update_slice(self.cached_value[...], value.astype(self.cached_value.dtype),
                                             (zero, i, zero, zero))
        self.cached_key[...], self.cached_value[...] = key, value
        self.cache_index[...] = i + 1
        written = jnp.broadcast_to(jnp.arange(max_length) <= i, (batch, 1, 1, max_length))  # (B, 1, 1, S_max)
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
        """Preallocates the KV cache for ``input_shape = (batch, max_length, features)``; then call with decode=True."""
        shape = (*input_shape[:-1], self.num_kv_heads, self.head_dim)  # (B, S_max, K, H)
        self.cached_key = nnx.Cache(jnp.zeros(shape, dtype))
        self.cached_value = nnx.Cache(jnp.zeros(shape, dtype))
        self.cache_index = nnx.Cache(jnp.array(0, dtype=jnp.int32))
