"""Decoder-only causal language model (GPT-style), built from the shared block: one stack of causal
self-attention blocks, pre-LN or post-LN as ``model.norm`` says, tied or separate output embeddings.

Its one attention kind is ``decoder_self`` (causal, unmasked, cached when generating), so every per-kind option --
``model.kinds.decoder_self.*`` (kernel, key/value heads, head mask), L0 gates, diversity terms, head importance,
ablations, pruning -- applies to it as to the translator's decoder. A batch is ``inputs [B, T]`` (token ids) and
``targets [B, T]`` (the next token at each position; the pad id where a position is not scored, e.g. MQAR's
non-query positions). Padding sits at the end of a row, after every real token, so the causal mask alone keeps
real positions from seeing it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from attn_lab.models.sites import KindSpec, Site, register_model, stack_sites
from attn_lab.models.transformer import PAD, Ctx, Stack, dtype, embedding, gated, make_gates, output_logits, rows_seeing


@register_model("lm", default=True)
class LanguageModel(nnx.Module):
    """Token embedding + positions + causal blocks + final norm + logits."""

    TASK_KINDS = ("lm",)
    ATTENTION = {"decoder_self": KindSpec(causal=True, mask="none", decodes=True)}
    GENERATES = False  # scored by loss / accuracy / perplexity; generation is attn_lab.train.generate
    UNUSED = {"num_decoder_layers": None, "pooling": "mean"}  # encoder-decoder / classifier options: left alone

    def __init__(self, cfg: Any, *, vocab_size: int, max_len: int, rngs: nnx.Rngs, gates: Any = None,
                 num_classes: int | None = None):
        embed = embedding(vocab_size, cfg.d_model, rngs, dtype(cfg))
        self.decoder = Stack(cfg, embed, max_len, self_kind="decoder_self", cross=False, num_layers=cfg.num_layers,
                             rngs=rngs)
        self.logits_proj = (nnx.data(None) if cfg.tie_embeddings
                            else nnx.Linear(cfg.d_model, vocab_size, rngs=rngs, dtype=dtype(cfg)))
        self.gates = make_gates(gates, {"decoder_self": (cfg.num_layers, cfg.num_heads)})

    @property
    def max_positions(self) -> int:
        """How many positions the model has (its position table's length): generation stops short of it."""
        return self.decoder.max_len

    @property
    def vocab_size(self) -> int:
        """How many token ids the embedding holds: a prompt id at or past it has no embedding row."""
        return self.decoder.embed.num_embeddings

    @staticmethod
    def layout(cfg: Any, inputs: int, targets: int | None) -> dict[str, tuple[int, int]]:
        """(layers, longest keys): the stack sees the whole padded sequence."""
        return {"decoder_self": (cfg.num_layers, inputs)}

    def sites(self) -> list[Site]:
        return stack_sites("decoder", self.decoder)

    def __call__(self, tokens: jax.Array, ctx: Ctx = Ctx(), head_masks: dict | None = None, *,
                 start: int | jax.Array = 0) -> jax.Array:
        """``tokens [B, T]`` -> next-token logits ``[B, T, vocab]``; with ``ctx.decode`` the tokens are the ones at
        positions ``start ...`` and each attention reads and extends its KV cache."""
        head_masks = gated(self.gates, head_masks, ("decoder_self",), ctx, tokens.shape[0])
        y = self.decoder(self.decoder.embed(tokens), ctx, start=start, self_mask=None, is_causal=True,
                         head_masks=head_masks)
        return output_logits(self.decoder.embed, self.logits_proj, y)  # (B, T, V)

    def forward_batch(self, batch: dict, ctx: Ctx = Ctx(),
                      head_masks: dict | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Logits ``[B, T, V]``, labels ``[B, T]`` and weights ``[B, T]`` (0 where the target is the pad id)."""
        logits = self(batch["inputs"], ctx, head_masks)
        return logits, batch["targets"], (batch["targets"] != PAD).astype(jnp.float32)

    def attention_rows(self, batch: dict) -> dict[str, tuple[jax.Array, jax.Array]]:
        """``decoder_self``: real query rows are the non-padding inputs; each sees the real inputs up to itself."""
        real = batch["inputs"] != PAD  # (B, T)
        return {"decoder_self": (real, rows_seeing(real, real.shape[1], causal=True))}

    def init_cache(self, batch_size: int, max_len: int) -> None:
        """Preallocates every attention's KV cache for generation."""
        for block in self.decoder.blocks:
            block.self_attn.init_cache((batch_size, max_len, self.decoder.d_model),
                                       dtype=block.self_attn.dtype or jnp.float32)
