"""Encoder classifier (Long Range Arena style): the shared block's encoder, mean or CLS pooling, a linear head."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from attn_lab.models.sites import KindSpec, Site, register_model, stack_sites
from attn_lab.models.transformer import PAD, Ctx, Stack, dtype, embedding, gated, make_gates, rows_seeing


@register_model("classifier", default=True)
class Classifier(nnx.Module):
    """Encoder + mean or CLS pooling + linear head; padded keys are masked, as in the encoder-decoder."""

    TASK_KINDS = ("classification",)
    ATTENTION = {"encoder_self": KindSpec(mask="key_padding")}
    GENERATES = False  # scored by accuracy only

    def __init__(self, cfg: Any, *, vocab_size: int, max_len: int, num_classes: int, rngs: nnx.Rngs,
                 gates: Any = None):
        self.pooling = cfg.pooling
        self.cls = (nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (1, 1, cfg.d_model)))
                    if cfg.pooling == "cls" else nnx.data(None))
        self.encoder = Stack(cfg, embedding(vocab_size, cfg.d_model, rngs, dtype(cfg)), max_len + 1,
                             self_kind="encoder_self", cross=False, num_layers=cfg.num_layers, rngs=rngs)
        self.head = nnx.Linear(cfg.d_model, num_classes, rngs=rngs, dtype=dtype(cfg))
        self.gates = make_gates(gates, {"encoder_self": (cfg.num_layers, cfg.num_heads)})

    @staticmethod
    def layout(cfg: Any, inputs: int, targets: int | None) -> dict[str, tuple[int, int]]:
        """The encoder's (layers, longest keys): the padded input, plus the CLS token in front with 'cls' pooling."""
        return {"encoder_self": (cfg.num_layers, inputs + (cfg.pooling == "cls"))}

    def sites(self) -> list[Site]:
        return stack_sites("encoder", self.encoder)

    def __call__(self, inputs: jax.Array, ctx: Ctx = Ctx(), head_masks: dict | None = None) -> jax.Array:
        """``inputs [B, L]`` token ids -> class logits ``[B, num_classes]``."""
        x = self.encoder.embed(inputs)  # (B, L, d)
        valid = self._valid(inputs)  # (B, L) or (B, L + 1)
        if self.cls is not None:
            cls = jnp.broadcast_to(self.cls[...], (x.shape[0], 1, x.shape[-1])).astype(x.dtype)  # (B, 1, d)
            x = jnp.concatenate([cls, x], axis=1)
        mask = valid[:, None, None, :]  # (B, 1, 1, L)
        head_masks = gated(self.gates, head_masks, ("encoder_self",), ctx, inputs.shape[0])
        h = self.encoder(x, ctx, self_mask=mask, is_causal=False, head_masks=head_masks)
        if self.cls is not None:
            pooled = h[:, 0]  # (B, d)
        else:
            w = valid[..., None].astype(h.dtype)
            pooled = (h * w).sum(1) / jnp.maximum(w.sum(1), 1.0)  # (B, d)
        return self.head(pooled)

    def _valid(self, inputs: jax.Array) -> jax.Array:
        """Real positions ``[B, T]``: the non-padding inputs, after the CLS token (always real) when there is one."""
        valid = inputs != PAD
        return jnp.pad(valid, ((0, 0), (1, 0)), constant_values=True) if self.cls is not None else valid

    def attention_rows(self, batch: dict) -> dict[str, tuple[jax.Array, jax.Array]]:
        """``{'encoder_self': (real query rows [B, T], visible keys [B, T, T])}``; T counts the CLS token."""
        valid = self._valid(batch["inputs"])
        return {"encoder_self": (valid, rows_seeing(valid, valid.shape[1]))}

    def forward_batch(self, batch: dict, ctx: Ctx = Ctx(),
                      head_masks: dict | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Class logits ``[B, C]``, labels ``[B]`` and weights ``[B]`` (0 on the fill rows of a last batch)."""
        return self(batch["inputs"], ctx, head_masks), batch["targets"], batch["mask"].astype(jnp.float32)
