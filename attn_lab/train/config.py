"""The config schema shared by every task, and its validation.

Task config files (``configs/<task>.py``) start from :func:`base_config` and set the task block plus their own
defaults; a ``:quick`` preset shrinks everything. :func:`validate_config` runs before any data is prepared or any
function compiles, and names the bad key in one line.
"""

from __future__ import annotations

import os
from typing import Any

import ml_collections
from flax import nnx
from ml_collections import config_dict

from attn_lab.attention import KERNELS, build_kernel, validate_spec
from attn_lab.attention.registry import default_options
from attn_lab.data import task_kind, validate_task_config
from attn_lab.models import KINDS, parse_head_mask
from attn_lab.train import diversity
from attn_lab.train.logging import check_wandb_mode


def _kind_overrides() -> ml_collections.ConfigDict:
    kind = lambda: ml_collections.ConfigDict({
        "attention": config_dict.placeholder(str),  # kernel name for this kind only (options: model.attention)
        "num_kv_heads": config_dict.placeholder(int),
        "head_mask": config_dict.placeholder(str),  # '1,0,1,1' every layer, or 'row;row;...' one per layer
    })
    return ml_collections.ConfigDict({k: kind() for k in KINDS})


def attention_config(name: str = "dense") -> ml_collections.ConfigDict:
    """``model.attention``: the kernel name plus every registered kernel's options under its own name.

    Built from the registry, so a new kernel file's options are overridable at once:
    ``--config.model.attention.name=local --config.model.attention.local.window=256``.
    """
    c = ml_collections.ConfigDict({"name": name})
    for kernel in sorted(KERNELS):
        c[kernel] = ml_collections.ConfigDict(
            {k: config_dict.placeholder(int) if v is None else v for k, v in default_options(kernel).items()})
    return c


def base_config() -> ml_collections.ConfigDict:
    """Defaults for every key; task files override what differs."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.compile_cache = "~/.cache/attn_lab/jax_compile"  # JAX's persistent compilation cache; '' turns it off
    c.task = ml_collections.ConfigDict({"name": "numbers", "data_dir": config_dict.placeholder(str)})
    c.model = ml_collections.ConfigDict({
        "num_layers": 2, "num_decoder_layers": config_dict.placeholder(int), "d_model": 128, "num_heads": 4,
        "num_kv_heads": config_dict.placeholder(int), "head_dim": config_dict.placeholder(int), "mlp_dim": 512,
        "dropout": 0.1, "attention_dropout": 0.0, "attention": attention_config(),
        "norm": "pre", "positions": "sinusoidal", "tie_embeddings": True, "pooling": "mean",
        "dtype": "float32",  # computation dtype; 'bfloat16' keeps float32 parameters and optimizer state
        "use_query_bias": True, "use_key_bias": True, "use_value_bias": True, "use_out_bias": True,
        "kinds": _kind_overrides(),
    })
    c.train = ml_collections.ConfigDict({
        "num_steps": 2000, "batch_size": 64, "learning_rate": 1e-3, "warmup_steps": 200, "schedule": "rsqrt",
        "weight_decay": 0.01, "label_smoothing": 0.1, "grad_clip": 1.0, "log_every": 50, "eval_every": 500,
        "checkpoint_every": 500, "max_eval_batches": config_dict.placeholder(int),
        "init_from": config_dict.placeholder(str),  # a finished run's folder: start from its parameters
    })
    c.loss = ml_collections.ConfigDict({"diversity": diversity.default_config()})
    c.heads = ml_collections.ConfigDict({
        "track": False,  # per-head diagnostics logged at every evaluation
        # L0 head gates (attn_lab/models/gates.py): penalty l0 * E[open gates], or keep at most `target` of heads
        "gates": {"enabled": False, "l0": 0.0, "target": config_dict.placeholder(float), "dual_lr": 0.3,
                  "init": 3.0, "lr": 0.05, "anneal": 0.5},
    })
    c.parallel = ml_collections.ConfigDict({  # data parallel over all devices; multi-host (attn_lab/train/parallel.py)
        "shard_params": False, "distributed": False, "coordinator_address": config_dict.placeholder(str),
        "num_processes": config_dict.placeholder(int), "process_id": config_dict.placeholder(int)})
    c.eval = ml_collections.ConfigDict({"bleu_tokenize": "13a"})  # sacrebleu tokenizer ('char' for one-word targets)
    c.wandb = ml_collections.ConfigDict({"mode": "offline", "project": "attn_lab",
                                         "group": config_dict.placeholder(str), "tags": (),
                                         "name": config_dict.placeholder(str)})
    return c


CHOICES = {"model.norm": ("pre", "post"), "model.dtype": ("float32", "bfloat16"), "model.positions": ("sinusoidal", "learned"),
           "model.pooling": ("mean", "cls"), "train.schedule": ("rsqrt", "cosine")}
POSITIVE = ("model.num_layers", "model.d_model", "model.num_heads", "model.mlp_dim", "train.num_steps",
            "train.batch_size", "train.learning_rate", "train.eval_every", "train.checkpoint_every",
            "train.log_every", "model.num_kv_heads", "model.head_dim", "model.num_decoder_layers",
            "train.max_eval_batches")
FRACTIONS = ("model.dropout", "model.attention_dropout", "train.label_smoothing")


def _get(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = config[part]
    return config


def _check_model(m: Any, task_type: str) -> dict[str, Any]:
    """Checks the model block; returns the kernel each attention kind builds (one tiny instance each)."""
    kernels = {}
    if m.head_dim is None and m.d_model % m.num_heads:
        raise ValueError(f"model.num_heads={m.num_heads} does not divide model.d_model={m.d_model}; "
                         "set model.head_dim to decouple them")
    causal_kinds = {"decoder_self"}
    for kind in KINDS if task_type == "translation" else ("encoder_self",):
        over = m.kinds[kind]
        kv = over.num_kv_heads or m.num_kv_heads or m.num_heads
        if over.num_kv_heads is not None and over.num_kv_heads <= 0:
            raise ValueError(f"model.kinds.{kind}.num_kv_heads must be positive, got {over.num_kv_heads}")
        if m.num_heads % kv:
            raise ValueError(f"model.num_heads={m.num_heads} is not divisible by num_kv_heads={kv} ({kind})")
        spec = m.attention.to_dict()
        if over.attention is not None:
            spec["name"] = over.attention
        name, _ = validate_spec(spec, where="model.attention" if over.attention is None
                                else f"model.kinds.{kind}.attention")
        try:  # option values are checked by the kernel's constructor: build one tiny instance, compile nothing
            kernel = build_kernel(spec, num_heads=m.num_heads, num_kv_heads=kv,
                                  head_dim=m.head_dim or m.d_model // m.num_heads, rngs=nnx.Rngs(0))
        except (ValueError, TypeError) as e:
            raise ValueError(f"model.attention.{name}: {e}") from None
        try:
            kernel.check(causal=kind in causal_kinds, cross=kind == "cross", dropout=m.attention_dropout > 0)
        except ValueError as e:
            raise ValueError(f"{e} (used by {kind})") from None
        try:
            parse_head_mask(over.head_mask, m.num_decoder_layers or m.num_layers if kind != "encoder_self"
                            else m.num_layers, m.num_heads)
        except ValueError as e:
            raise ValueError(f"model.kinds.{kind}.{e}") from None
        kernels[kind] = kernel
    return kernels


def _check_gates(g: Any) -> None:
    if (g.l0 > 0 or g.target is not None) and not g.enabled:
        raise ValueError("heads.gates.l0 / heads.gates.target need heads.gates.enabled=True")
    if g.l0 < 0:
        raise ValueError(f"heads.gates.l0 must be >= 0, got {g.l0}")
    if g.target is not None and not 0.0 < g.target <= 1.0:
        raise ValueError(f"heads.gates.target is the share of heads to keep, in (0, 1]; got {g.target}")
    if not 0.0 <= g.anneal <= 1.0:
        raise ValueError(f"heads.gates.anneal is a share of train.num_steps, in [0, 1]; got {g.anneal}")
    if g.dual_lr <= 0:
        raise ValueError(f"heads.gates.dual_lr must be positive, got {g.dual_lr}")


def _check_init_from(path: str | None) -> None:
    if path is not None and not os.path.isdir(os.path.join(path, "checkpoints")):
        raise ValueError(f"train.init_from='{path}' is not a run folder with checkpoints")


def validate_config(config: Any) -> None:
    """Raises ValueError with one line naming the first bad key; never prepares data or compiles."""
    for key in POSITIVE:
        value = _get(config, key)
        if value is not None and not value > 0:
            raise ValueError(f"{key} must be positive, got {value}")
    for key in FRACTIONS:
        if not 0.0 <= _get(config, key) < 1.0:
            raise ValueError(f"{key} must be in [0, 1), got {_get(config, key)}")
    for key, choices in CHOICES.items():
        if _get(config, key) not in choices:
            raise ValueError(f"{key}='{_get(config, key)}' is not one of: {', '.join(choices)}")
    if config.train.warmup_steps < 0:
        raise ValueError(f"train.warmup_steps must be >= 0, got {config.train.warmup_steps}")
    _check_gates(config.heads.gates)
    _check_init_from(config.train.init_from)
    validate_task_config(config.task)
    kernels = _check_model(config.model, task_kind(config.task))
    diversity.check_config(config.loss.diversity, kernels)
    check_wandb_mode(config.wandb.mode)
