"""Transformer encoder-decoder (translation) and encoder classifier, built from one shared block.

Each model class carries what its task kind changes (:data:`MODELS` maps a kind to its class): which attention
kinds it has, whether it generates text, and the logits, labels and loss weights of a batch
(``forward_batch``). The train and eval steps, head analysis and capture call that one method, so no module outside
this one branches on the task kind.

Every attention in the models is :class:`attn_lab.attention.MultiHeadAttention`; the three attention *kinds*
(``encoder_self``, ``decoder_self``, ``cross``) each take their kernel, ``num_kv_heads`` and head mask from config,
so a head-count, kernel or pruning ablation is a config override, never a copied model.
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

# key_padding_note: the models mask padded *keys* only ([B, 1, 1, S]), never padded queries. A padded query's output
# is never read (not as a key, not by pooling, not by the loss), and a key-only mask is what efficient kernels
# (local, kernelized, low-rank) can apply without forming a [T, S] matrix.
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


def make_attention(cfg: Any, kind: str, *, rngs: nnx.Rngs) -> MultiHeadAttention:
    """One attention layer of ``kind`` from the model config (kind-level overrides win over model-level values)."""
    over = cfg.kinds[kind]
    attention = cfg.attention.to_dict() if hasattr(cfg.attention, "to_dict") else dict(cfg.attention)
    if over.attention is not None:
        attention["name"] = over.attention
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
    """The one Transformer block: self-attention, optional cross-attention, MLP; pre-LN or post-LN residuals."""

    def __init__(self, cfg: Any, *, self_kind: str, cross: bool, rngs: nnx.Rngs):
        self.self_kind = self_kind
        self.self_attn = make_attention(cfg, self_kind, rngs=rngs)
        self.cross_attn = make_attention(cfg, "cross", rngs=rngs) if cross else nnx.data(None)
        self.norms = nnx.List([nnx.LayerNorm(cfg.d_model, rngs=rngs, dtype=dtype(cfg))
                               for _ in range(3 if cross else 2)])
        self.mlp = Mlp(cfg.d_model, cfg.mlp_dim, cfg.dropout, rngs=rngs, dtype=dtype(cfg))
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
        table = self.learned_pos[...] if self.learned_pos is not None else sinusoidal(self.max_len, self.d_model)
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


def _embed(vocab_size: int, d_model: int, rngs: nnx.Rngs, dtype: Any = None) -> nnx.Embed:
    return nnx.Embed(vocab_size, d_model, embedding_init=nnx.initializers.normal(1.0), rngs=rngs, dtype=dtype)


class Seq2Seq(nnx.Module):
    """Encoder-decoder for translation. Token id 0 is padding, 1 is BOS (the decoder's first input)."""

    KIND = "translation"
    ATTENTION_KINDS = KINDS
    GENERATES = True  # greedy-decodes text, scored by BLEU and exact match

    def __init__(self, cfg: Any, *, vocab_size: int, max_len: int, rngs: nnx.Rngs, gates: Any = None,
                 num_classes: int | None = None):
        """``num_classes`` is ignored (the outputs are the vocabulary): every model class takes the same arguments,
        so :func:`build_model` needs no branch."""
        src_embed = _embed(vocab_size, cfg.d_model, rngs, dtype(cfg))
        tgt_embed = src_embed if cfg.tie_embeddings else _embed(vocab_size, cfg.d_model, rngs, dtype(cfg))
        self.encoder = Stack(cfg, src_embed, max_len, self_kind="encoder_self", cross=False,
                             num_layers=cfg.num_layers, rngs=rngs)
        self.decoder = Stack(cfg, tgt_embed, max_len, self_kind="decoder_self", cross=True,
                             num_layers=cfg.num_decoder_layers or cfg.num_layers, rngs=rngs)
        self.logits_proj = (nnx.data(None) if cfg.tie_embeddings
                            else nnx.Linear(cfg.d_model, vocab_size, rngs=rngs, dtype=dtype(cfg)))
        dec = (len(self.decoder.blocks), cfg.num_heads)
        self.gates = make_gates(gates, {"encoder_self": (cfg.num_layers, cfg.num_heads), "decoder_self": dec,
                                        "cross": dec})

    def encode(self, inputs: jax.Array, ctx: Ctx = Ctx(), head_masks: dict | None = None) -> jax.Array:
        """``inputs [B, S]`` token ids -> memory ``[B, S, d_model]``."""
        mask = (inputs != PAD)[:, None, None, :]  # (B, 1, 1, S): key padding only, see key_padding_note
        head_masks = gated(self.gates, head_masks, ("encoder_self",), ctx, inputs.shape[0])
        return self.encoder(self.encoder.embed(inputs), ctx, self_mask=mask, is_causal=False, head_masks=head_masks)

    def decode(self, decoder_inputs: jax.Array, memory: jax.Array, inputs: jax.Array, ctx: Ctx = Ctx(), *,
               start=0, head_masks: dict | None = None) -> jax.Array:
        """``decoder_inputs [B, T]`` (BOS-shifted targets) -> logits ``[B, T, vocab]``."""
        cross_mask = (inputs != PAD)[:, None, None, :]  # (B, 1, 1, S)
        head_masks = gated(self.gates, head_masks, ("decoder_self", "cross"), ctx, inputs.shape[0])
        y = self.decoder(self.decoder.embed(decoder_inputs), ctx, start=start, self_mask=None, is_causal=True,
                         memory=memory, cross_mask=cross_mask, head_masks=head_masks)
        if self.logits_proj is None:
            return self.decoder.embed.attend(y) / jnp.sqrt(y.shape[-1]).astype(y.dtype)  # (B, T, V)
        return self.logits_proj(y)  # (B, T, V)

    def __call__(self, inputs: jax.Array, targets: jax.Array, ctx: Ctx = Ctx(),
                 head_masks: dict | None = None) -> jax.Array:
        """Teacher-forced logits ``[B, T, vocab]`` for ``targets [B, T]`` given ``inputs [B, S]``."""
        decoder_inputs = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=BOS)[:, :-1]  # (B, T)
        memory = self.encode(inputs, ctx, head_masks)
        return self.decode(decoder_inputs, memory, inputs, ctx, head_masks=head_masks)

    def forward_batch(self, batch: dict, ctx: Ctx = Ctx(),
                      head_masks: dict | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Teacher-forced logits ``[B, T, V]``, labels ``[B, T]`` and weights ``[B, T]`` (0 on padded targets)."""
        logits = self(batch["inputs"], batch["targets"], ctx, head_masks)  # (B, T, V)
        return logits, batch["targets"], (batch["targets"] != PAD).astype(jnp.float32)

    def attention_rows(self, batch: dict) -> dict[str, tuple[jax.Array, jax.Array]]:
        """Per attention kind, which query rows are real ``[B, T]`` and which keys each row may see ``[B, T, S]``
        (padding and, in the causal decoder, the future excluded): what statistics of captured maps average over.
        The decoder's queries are its BOS-shifted inputs; row t is real when target t is (it is scored)."""
        src, tgt = batch["inputs"] != PAD, batch["targets"] != PAD  # (B, S), (B, T)
        t = tgt.shape[1]
        dec_keys = jnp.pad(tgt, ((0, 0), (1, 0)), constant_values=True)[:, :-1]  # (B, T): BOS, then targets
        causal = dec_keys[:, None, :] & jnp.tril(jnp.ones((t, t), bool))  # (B, T, T)
        return {"encoder_self": (src, jnp.broadcast_to(src[:, None, :], (*src.shape, src.shape[1]))),
                "decoder_self": (tgt, causal),
                "cross": (tgt, jnp.broadcast_to(src[:, None, :], (*tgt.shape, src.shape[1])))}

    def init_cache(self, batch_size: int, max_len: int) -> None:
        """Preallocates every decoder self-attention's KV cache for greedy decoding."""
        for block in self.decoder.blocks:
            block.self_attn.init_cache((batch_size, max_len, self.decoder.d_model),
                                       dtype=block.self_attn.dtype or jnp.float32)


class Classifier(nnx.Module):
    """Encoder + mean or CLS pooling + linear head (Long Range Arena style)."""

    KIND = "classification"
    ATTENTION_KINDS = ("encoder_self",)
    GENERATES = False  # scored by accuracy only

    def __init__(self, cfg: Any, *, vocab_size: int, max_len: int, num_classes: int, rngs: nnx.Rngs,
                 gates: Any = None):
        self.pooling = cfg.pooling
        self.cls = (nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (1, 1, cfg.d_model)))
                    if cfg.pooling == "cls" else nnx.data(None))
        self.encoder = Stack(cfg, _embed(vocab_size, cfg.d_model, rngs, dtype(cfg)), max_len + 1,
                             self_kind="encoder_self",
                             cross=False, num_layers=cfg.num_layers, rngs=rngs)
        self.head = nnx.Linear(cfg.d_model, num_classes, rngs=rngs, dtype=dtype(cfg))
        self.gates = make_gates(gates, {"encoder_self": (cfg.num_layers, cfg.num_heads)})

    def __call__(self, inputs: jax.Array, ctx: Ctx = Ctx(), head_masks: dict | None = None) -> jax.Array:
        """``inputs [B, L]`` token ids -> class logits ``[B, num_classes]``."""
        x = self.encoder.embed(inputs)  # (B, L, d)
        valid = inputs != PAD  # (B, L)
        if self.cls is not None:
            cls = jnp.broadcast_to(self.cls[...], (x.shape[0], 1, x.shape[-1])).astype(x.dtype)  # (B, 1, d)
            x = jnp.concatenate([cls, x], axis=1)
            valid = jnp.pad(valid, ((0, 0), (1, 0)), constant_values=True)  # (B, L + 1)
        mask = valid[:, None, None, :]  # (B, 1, 1, L)
        head_masks = gated(self.gates, head_masks, ("encoder_self",), ctx, inputs.shape[0])
        h = self.encoder(x, ctx, self_mask=mask, is_causal=False, head_masks=head_masks)
        if self.cls is not None:
            pooled = h[:, 0]  # (B, d)
        else:
            w = valid[..., None].astype(h.dtype)
            pooled = (h * w).sum(1) / jnp.maximum(w.sum(1), 1.0)  # (B, d)
        return self.head(pooled)

    def attention_rows(self, batch: dict) -> dict[str, tuple[jax.Array, jax.Array]]:
        """``{'encoder_self': (real query rows [B, T], visible keys [B, T, T])}``; T counts the CLS token in front
        (always real) when pooling is 'cls'."""
        valid = batch["inputs"] != PAD  # (B, L)
        if self.cls is not None:
            valid = jnp.pad(valid, ((0, 0), (1, 0)), constant_values=True)  # (B, L + 1)
        return {"encoder_self": (valid, jnp.broadcast_to(valid[:, None, :], (*valid.shape, valid.shape[1])))}

    def forward_batch(self, batch: dict, ctx: Ctx = Ctx(),
                      head_masks: dict | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Class logits ``[B, C]``, labels ``[B]`` and weights ``[B]`` (0 on the fill rows of a last batch)."""
        return self(batch["inputs"], ctx, head_masks), batch["targets"], batch["mask"].astype(jnp.float32)


MODELS = {cls.KIND: cls for cls in (Seq2Seq, Classifier)}


def model_class(kind: str) -> type[Seq2Seq] | type[Classifier]:
    """The model class of a task kind (what it has and does, before any model is built)."""
    if kind not in MODELS:
        raise ValueError(f"task kind {kind!r} has no model; known kinds: {', '.join(MODELS)}")
    return MODELS[kind]


def build_model(cfg: Any, *, kind: str, vocab_size: int, max_len: int, num_classes: int | None = None,
                seed: int = 0, gates: Any = None) -> Seq2Seq | Classifier:
    """The model for a task ``kind`` (a key of :data:`MODELS`) from ``config.model``; ``gates``:
    ``config.heads.gates`` (L0 head gates when enabled)."""
    return model_class(kind)(cfg, vocab_size=vocab_size, max_len=max_len, num_classes=num_classes,
                             rngs=nnx.Rngs(params=seed), gates=gates)


def attention_layers(model: nnx.Module) -> list[tuple[str, int, nnx.Module]]:
    """(kind, layer, attention module) for every attention of a Seq2Seq or Classifier, in order."""
    out = []
    for stack in (getattr(model, "encoder", None), getattr(model, "decoder", None)):
        if stack is None:
            continue
        for layer, block in enumerate(stack.blocks):
            out.append((block.self_kind, layer, block.self_attn))
            if block.cross_attn is not None:
                out.append(("cross", layer, block.cross_attn))
    return out


def count_params(model: nnx.Module) -> int:
    """Number of trainable parameters."""
    return int(sum(np.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param))))
