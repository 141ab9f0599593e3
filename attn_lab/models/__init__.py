"""Model kinds, each one file registered by name, built from one shared Transformer block.

``transformer.py`` holds the shared block and stack; ``sites.py`` the registry and the attention sites each model
declares; every other module in this package is a model kind (``seq2seq``, ``classifier``, ``lm``) and is imported
here, so a new model file registers itself (:func:`register_model`) with no edit elsewhere.
"""

import importlib
import pkgutil

from attn_lab.models.sites import (
    KindSpec,
    Site,
    attention_kinds,
    attention_layers,
    build_model,
    decoding_attentions,
    mask_shapes,
    model_class,
    model_names,
    register_model,
    resolve,
    set_module,
    stack_sites,
    supports_cached_decoding,
)
from attn_lab.models.transformer import KINDS, Ctx, count_params, parse_head_mask

_SHARED = {"transformer", "sites", "gates"}  # not model kinds
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _SHARED:
        importlib.import_module(f"{__name__}.{_module.name}")

from attn_lab.models.classifier import Classifier  # noqa: E402  (registered above; re-exported)
from attn_lab.models.lm import LanguageModel  # noqa: E402
from attn_lab.models.seq2seq import Seq2Seq  # noqa: E402

__all__ = ["KINDS", "Classifier", "Ctx", "KindSpec", "LanguageModel", "Seq2Seq", "Site", "attention_kinds",
           "attention_layers", "build_model", "count_params", "decoding_attentions", "mask_shapes", "model_class",
           "model_names", "parse_head_mask", "register_model", "resolve", "set_module", "stack_sites",
           "supports_cached_decoding"]
