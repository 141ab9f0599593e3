"""The one shared Transformer block and what every model kind builds from it: the stack of blocks, the MLP, the
per-kind attention from config, position tables, head masks and L0 gates.

The model kinds themselves are one file each (``seq2seq.py``, ``classifier.py``, ``lm.py``), registered by name
and declaring their attention sites (:mod:`attn_lab.models.sites`). Every attention in them is
:class:`attn_lab.attention.MultiHeadAttention`; each attention *kind* (``encoder_self``, ``decoder_self``,
``cross``) takes its kernel, ``num_kv_heads`` and head mask from config, so a head-count, kernel or pruning
ablation is a config override, never a copied model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn_lab.attention import MultiHeadAttention
from attn_lab.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from attn_lab.models.gates import HeadGates

KINDS = ("encoder_self", "decoder_self", "cross")

PAD, BOS, EOS = PAD_ID, BOS_ID, EOS_ID  # the tokenizers' reserved ids


@dataclass(frozen=True)
class Ctx:
    """What every block of one forward pass shares (masks, mode, captured intermediates)."""
    deterministic: bool = True
    rngs: nnx.Rngs | None = None
    capture: bool | str = False  # True: attention maps and per-head outputs/values; 'heads': only the latter
    decode: bool = False


def parse_head_mask(text: str | None, num_layers: int, num_heads: int) -> tuple | None:
    """``'1,0,1,1'`` (every layer) or ``'1,0,1,1;1,1,1,1'`` (per layer) -> ``[num_layers][num_heads]`` floats.

    Kept as nested tuples: a static part of the model, folded into the compiled step as a constant. Raises a
    one-line ValueError starting ``head_mask='<text>'`` (the config prefixes the kind) for anything but numbers in
    [0, 1] in 1 or ``num_layers`` rows of ``num_heads``.
    """
    if text is None or str(text).strip() == "":
        return None
    rows = [[_mask_value(v) for v in row.split(",")] for row in str(text).split(";")]
    if any(v is None for row in rows for v in row):
        raise ValueError(f"head_mask='{text}': values must be numbers in [0, 1] (1 keeps a head, 0 masks it, "
                         "0.5 halves it), comma-separated, rows separated by ';'")
    rows = rows * num_layers if len(rows) == 1 else rows
    if len(rows) != num_layers or any(len(r) != num_heads for r in rows):
        raise ValueError(f"head_mask='{text}' must have {num_heads} values per row and 1 or {num_layers} rows "
                         "(rows separated by ';')")
    return tuple(tuple(r) for r in rows)


def _mask_value(text: str) -> float | None:
    """A head mask entry's multiplier in [0, 1]; None for anything else (letters, nan, 2, -1)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0.0 <= value <= 1.0 else None


def attention_spec(cfg: Any, kind: str) -> dict:
    """The kernel spec (``{'name': ..., '<kernel>': {options}}``) attention ``kind`` is built with: the model-level
    ``model.attention`` with the kind's own kernel name when ``model.kinds.<kind>.attention`` sets one."""
    attention = cfg.attention.to_dict() if hasattr(cfg.attention, "to_dict") else dict(cfg.attention)
    if cfg.kinds[kind].attention is not None:
        attention["name"] = cfg.kinds[kind].attention
    return attention


def make_attention(cfg: Any, kind: str, *, rngs: nnx.Rngs) -> MultiHeadAttention:
    """One attention layer of ``kind`` from the model config (kind-level overrides win over model-level values)."""
    over, attention = cfg.kinds[kind], attention_spec(cfg, kind)
    return MultiHeadAttention(
        cfg.num_heads, cfg.d_model, num_kv_heads=over.num_kv_heads or cfg.num_kv_heads, head_dim=cfg.head_dim,
        attention=attention, dropout_rate=cfg.attention_dropout, use_query_bias=cfg.use_query_bias, dtype=dtype(cfg),
        use_key_bias=cfg.use_key_bias, use_value_bias=cfg.use_value_bias, use_out_bias=cfg.use_out_bias,
        decode=False, keep_rngs=False, rngs=rngs)


def sinusoidal(length: int, dim: int) -> jax.Array:
    """Fixed sin/cos position table ``[length, dim]`` (Vaswani et al. 2017, section 3.5)."""
    pos = np.arange(length)[:, None]
    inv = np.exp(-math.log(10000.0) * np.arange(0, dim, 2) / dim)[None, :]
    table = np.zeros((length, dim), np.float32)
    table[:, 0::2], table[:, 1::2] = np.sin(pos * inv), np.cos(pos * inv[:, : dim // 2])
    return jnp.asarray(table)


def dtype(cfg: Any) -> Any:
    """The computation dtype (``model.dtype``): 'bfloat16' computes in bf16; parameters and optimizer stay float32."""
    return jnp.dtype(cfg.get("dtype", "float32"))


class Mlp(nnx.Module):
    def __init__(self, d_model: int, mlp_dim: int, dropout: float, *, rngs: nnx.Rngs, dtype: Any = None):
        self.up = nnx.Linear(d_model, mlp_dim, rngs=rngs, dtype=dtype)
        self.down = nnx.Linear(mlp_dim, d_model, rngs=rngs, dtype=dtype)
        self.dropout = nnx.Dropout(dropout)

    def __call__(self, x: jax.Array, ctx: Ctx) -> jax.Array:
        return self.down(self.dropout(jax.nn.gelu(self.up(x)), deterministic=ctx.deterministic, rngs=ctx.rngs))


class Block(nnx.Module):
    """The one Transformer block: self-attention, optional cross-attention, MLP; pre-LN or post-LN residuals.

    ``model.mlp_dim=0`` leaves the MLP out (attention-only blocks, as Zoology's MQAR models: its 'state mixer' is
    the identity)."""

    def __init__(self, cfg: Any, *, self_kind: str, cross: bool, rngs: nnx.Rngs):
        self.self_kind = self_kind
        self.self_attn = make_attention(cfg, self_kind, rngs=rngs)
        self.cross_attn = make_attention(cfg, "cross", rngs=rngs) if cross else nnx.data(None)
        sublayers = 1 + cross + (cfg.mlp_dim > 0)
        self.norms = nnx.List([nnx.LayerNorm(cfg.d_model, rngs=rngs, dtype=dtype(cfg)) for _ in range(sublayers)])
        self.mlp = (Mlp(cfg.d_model, cfg.mlp_dim, cfg.dropout, rngs=rngs, dtype=dtype(cfg)) if cfg.mlp_dim > 0
                    else nnx.data(None))
        self.dropout = nnx.Dropout(cfg.dropout)
        self.post_ln = cfg.norm == "post"

    def _residual(self, i: int, x: jax.Array, fn, ctx: Ctx) -> jax.Array:
        if self.post_ln:  # Vaswani et al.: LN(x + sublayer(x))
            return self.norms[i](x + self.dropout(fn(x), deterministic=ctx.deterministic, rngs=ctx.rngs))
        return x + self.dropout(fn(self.norms[i](x)), deterministic=ctx.deterministic, rngs=ctx.rngs)

    def __call__(self, x: jax.Array, ctx: Ctx, *, self_mask, is_causal: bool, head_masks: dict,
                 memory: jax.Array | None = None, cross_mask: jax.Array | None = None) -> jax.Array:
        """``x [B, T, d_model]`` -> ``[B, T, d_model]``; ``head_masks[kind]`` is ``[N]`` or ``[B, N]`` or None."""
        def attend(layer, kind, mask, kv=None, causal=False, decode=False):
            return lambda h: layer(h, kv, mask=mask, is_causal=causal, head_mask=head_masks.get(kind),
                                   deterministic=ctx.deterministic, rngs=ctx.rngs, decode=decode,
                                   sow_weights=ctx.capture is True, sow_head_outputs=bool(ctx.capture))
        x = self._residual(0, x, attend(self.self_attn, self.self_kind, self_mask, causal=is_causal and not ctx.decode,
                                        decode=ctx.decode), ctx)
        if self.cross_attn is not None:
            x = self._residual(1, x, attend(self.cross_attn, "cross", cross_mask, kv=memory), ctx)
        if self.mlp is None:
            return x
        return self._residual(len(self.norms) - 1, x, lambda h: self.mlp(h, ctx), ctx)


class Stack(nnx.Module):
    """Embeddings + positions + N blocks + final LN (pre-LN); shared by the encoder and the decoder."""

    def __init__(self, cfg: Any, embed: nnx.Embed, max_len: int, *, self_kind: str, cross: bool, num_layers: int,
                 rngs: nnx.Rngs):
        self.embed = embed
        self.kinds = (self_kind, "cross") if cross else (self_kind,)
        self.blocks = nnx.List([Block(cfg, self_kind=self_kind, cross=cross, rngs=rngs) for _ in range(num_layers)])
        self.final_norm = (nnx.LayerNorm(cfg.d_model, rngs=rngs, dtype=dtype(cfg)) if cfg.norm == "pre"
                           else nnx.data(None))
        self.dropout = nnx.Dropout(cfg.dropout)
        self.learned_pos = (nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (max_len, cfg.d_model)))
                            if cfg.positions == "learned" else nnx.data(None))
        self.max_len, self.d_model = max_len, cfg.d_model
        self.static_masks = {k: parse_head_mask(cfg.kinds[k].head_mask, num_layers, cfg.num_heads)
                             for k in self.kinds}

    def positions(self, start: jax.Array | int, length: int) -> jax.Array:
        """Rows ``start .. start + length`` of the position table ``[T, d_model]``. A batch padded to its length
        bucket can be longer than the table (a task of 9 tokens pads to 12); the rows past it hold only padding,
        which no real position sees, so they get zeros rather than a bigger table (that would change recorded
        runs' parameters)."""
        table = self.learned_pos[...] if self.learned_pos is not None else sinusoidal(self.max_len, self.d_model)
        if length > table.shape[0]:
            table = jnp.pad(table, ((0, length - table.shape[0]), (0, 0)))
        return jax.lax.dynamic_slice_in_dim(table, start, length)  # (T, d_model)

    def layer_masks(self, head_masks: dict | None, layer: int) -> dict:
        """Combines the config's static head masks with call-time masks ``[L, N]`` or ``[B, L, N]`` for one layer."""
        out = {}
        for kind in self.kinds:
            static, given = self.static_masks[kind], (head_masks or {}).get(kind)
            mask = None if static is None else jnp.asarray(static[layer])
            if given is not None:
                given = given[..., layer, :]
                mask = given if mask is None else given * mask
            out[kind] = mask
        return out

    def __call__(self, x: jax.Array, ctx: Ctx, *, start=0, head_masks=None, **block_kw) -> jax.Array:
        """``x [B, T, d_model]`` embedded tokens -> ``[B, T, d_model]``."""
        x = x + self.positions(start, x.shape[1])[None].astype(x.dtype)
        x = self.dropout(x, deterministic=ctx.deterministic, rngs=ctx.rngs)
        for i, block in enumerate(self.blocks):
            x = block(x, ctx, head_masks=self.layer_masks(head_masks, i), **block_kw)
        return self.final_norm(x) if self.final_norm is not None else x


def make_gates(gates: Any, shapes: dict[str, tuple[int, int]]) -> HeadGates | None:
    """L0 head gates when ``config.heads.gates.enabled`` (see :mod:`attn_lab.models.gates`)."""
    return HeadGates(shapes, gates.init, gates.target) if gates is not None and gates.enabled else nnx.data(None)


def gated(gates: HeadGates | None, head_masks: dict | None, kinds: tuple[str, ...], ctx: Ctx,
          batch: int) -> dict | None:
    """``head_masks`` times the gates of ``kinds`` (sampled per example in training, binary at test)."""
    if gates is None:
        return head_masks
    out = dict(head_masks or {})
    for kind, g in gates(kinds, batch, ctx.deterministic, ctx.rngs).items():  # (B, L, N) or (L, N)
        out[kind] = g if out.get(kind) is None else out[kind] * g
    return out


def embedding(vocab_size: int, d_model: int, rngs: nnx.Rngs, dtype: Any = None) -> nnx.Embed:
    """A token embedding, N(0, 1) initialized (its tied read-out divides logits by sqrt(d), see
    :func:`output_logits`)."""
    return nnx.Embed(vocab_size, d_model, embedding_init=nnx.initializers.normal(1.0), rngs=rngs, dtype=dtype)


def output_logits(embed: nnx.Embed, proj: nnx.Linear | None, y: jax.Array) -> jax.Array:
    """``y [B, T, d]`` -> logits ``[B, T, V]``: the tied embedding's read-out scaled by 1/sqrt(d) (the embedding is
    N(0, 1)), or the separate projection ``proj``."""
    if proj is None:
        return embed.attend(y) / jnp.sqrt(y.shape[-1]).astype(y.dtype)
    return proj(y)


def rows_seeing(valid_keys: jax.Array, rows: int, causal: bool = False) -> jax.Array:
    """``valid_keys [B, S]`` -> ``[B, rows, S]``: the keys each query row may see (every valid key, or with
    ``causal`` the valid keys at or before the row)."""
    seen = jnp.broadcast_to(valid_keys[:, None, :], (valid_keys.shape[0], rows, valid_keys.shape[1]))
    return seen & jnp.tril(jnp.ones((rows, valid_keys.shape[1]), bool)) if causal else seen


def count_params(model: nnx.Module) -> int:
    """Number of trainable parameters."""
    return int(sum(np.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param))))
