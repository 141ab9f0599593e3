"""Transformer models built from one shared block."""

from attn_lab.models.transformer import (KINDS, Classifier, Ctx, Seq2Seq, attention_layers, build_model,
                                         count_params, parse_head_mask)

__all__ = ["KINDS", "Classifier", "Ctx", "Seq2Seq", "attention_layers", "build_model", "count_params",
           "parse_head_mask"]
