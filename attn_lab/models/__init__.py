"""Transformer models built from one shared block."""

from attn_lab.models.transformer import (
                                         KINDS,
                                         MODELS,
                                         Classifier,
                                         Ctx,
                                         Seq2Seq,
                                         attention_layers,
                                         build_model,
                                         count_params,
                                         model_class,
                                         parse_head_mask,
)

__all__ = ["KINDS", "MODELS", "Classifier", "Ctx", "Seq2Seq", "attention_layers", "build_model", "count_params",
           "model_class", "parse_head_mask"]
