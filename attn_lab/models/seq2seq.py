"""Encoder-decoder Transformer for translation (Vaswani et al. 2017), built from the shared block."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from attn_lab.models.sites import KindSpec, Site, register_model, stack_sites
from attn_lab.models.transformer import (
    BOS,
    PAD,
    Ctx,
    Stack,
    dtype,
    embedding,
    gated,
    make_gates,
    output_logits,
    rows_seeing,
)


@register_model("seq2seq", default=True)
class Seq2Seq(nnx.Module):
    """Encoder-decoder for translation. Token id 0 is padding, 1 is BOS (the decoder's first input).

    key_padding_note: the encoder and the cross-attention mask padded *keys* only (``[B, 1, 1, S]``), never padded
    queries -- a padded query's output is never read (not as a key, not by the loss), and a key-only mask is what
    efficient kernels (local, kernelized, low-rank) can apply without forming a ``[T, S]`` matrix. The decoder's
    self-attention is causal and unmasked: its padding sits after every real target.
    """

    TASK_KINDS = ("translation",)
    ATTENTION = {"encoder_self": KindSpec(mask="key_padding"),
                 "decoder_self": KindSpec(causal=True, mask="none", decodes=True),
                 "cross": KindSpec(cross=True, mask="key_padding")}
    GENERATES = True  # decodes text, scored by BLEU and exact match

    def __init__(self, cfg: Any, *, vocab_size: int, max_len: int, rngs: nnx.Rngs, gates: Any = None,
                 num_classes: int | None = None):
        """``num_classes`` is ignored (the outputs are the vocabulary): every model class takes the same arguments,
        so :func:`attn_lab.models.build_model` needs no branch."""
        src_embed = embedding(vocab_size, cfg.d_model, rngs, dtype(cfg))
        tgt_embed = src_embed if cfg.tie_embeddings else embedding(vocab_size, cfg.d_model, rngs, dtype(cfg))
        self.encoder = Stack(cfg, src_embed, max_len, self_kind="encoder_self", cross=False,
                             num_layers=cfg.num_layers, rngs=rngs)
        self.decoder = Stack(cfg, tgt_embed, max_len, self_kind="decoder_self", cross=True,
                             num_layers=cfg.num_decoder_layers or cfg.num_layers, rngs=rngs)
        self.logits_proj = (nnx.data(None) if cfg.tie_embeddings
                            else nnx.Linear(cfg.d_model, vocab_size, rngs=rngs, dtype=dtype(cfg)))
        dec = (len(self.decoder.blocks), cfg.num_heads)
        self.gates = make_gates(gates, {"encoder_self": (cfg.num_layers, cfg.num_heads), "decoder_self": dec,
                                        "cross": dec})

    @staticmethod
    def layout(cfg: Any, inputs: int, targets: int | None) -> dict[str, tuple[int, int]]:
        """Per attention kind, (layers, longest keys) for padded input / target lengths (known before building)."""
        decoder = cfg.num_decoder_layers or cfg.num_layers
        return {"encoder_self": (cfg.num_layers, inputs), "decoder_self": (decoder, targets or 0),
                "cross": (decoder, inputs)}

    def sites(self) -> list[Site]:
        return stack_sites("encoder", self.encoder) + stack_sites("decoder", self.decoder)

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
        return output_logits(self.decoder.embed, self.logits_proj, y)  # (B, T, V)

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
        dec_keys = jnp.pad(tgt, ((0, 0), (1, 0)), constant_values=True)[:, :-1]  # (B, T): BOS, then targets
        return {"encoder_self": (src, rows_seeing(src, src.shape[1])),
                "decoder_self": (tgt, rows_seeing(dec_keys, tgt.shape[1], causal=True)),
                "cross": (tgt, rows_seeing(src, tgt.shape[1]))}

    def init_cache(self, batch_size: int, max_len: int) -> None:
        """Preallocates every decoder self-attention's KV cache for decoding."""
        for block in self.decoder.blocks:
            block.self_attn.init_cache((batch_size, max_len, self.decoder.d_model),
                                       dtype=block.self_attn.dtype or jnp.float32)
