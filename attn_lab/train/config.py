"""The config schema shared by every task, and its validation.

Task config files (``configs/<task>.py``) start from :func:`base_config` and set the task block plus their own
defaults; a ``:quick`` preset shrinks everything. :func:`validate_config` runs before any data is prepared, any
function compiles or any file is written, and names the bad key, its value and what is allowed in one line: every
key's type and range, the paths the run reads or writes, and the options only used late (the BLEU tokenizer, a
kernel's length limit against the task's lengths, the batch size against the training split).
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

import jax
import ml_collections
from flax import nnx
from ml_collections import config_dict
from sacrebleu.metrics import BLEU

from attn_lab.attention import KERNELS, build_kernel, validate_spec
from attn_lab.attention.registry import default_options
from attn_lab.checks import SEEDS, check_writable
from attn_lab.data import task_kind, validate_task_config
from attn_lab.data.builders import resolve_data_dir
from attn_lab.data.pipeline import bucket_lengths
from attn_lab.data.tasks import is_prepared, max_train_examples, sequence_lengths
from attn_lab.models import attention_kinds, model_class, parse_head_mask
from attn_lab.models.transformer import attention_spec
from attn_lab.train import diversity, learned
from attn_lab.train.logging import check_wandb_mode


def _kind_overrides() -> ml_collections.ConfigDict:
    kind = lambda: ml_collections.ConfigDict({
        "attention": config_dict.placeholder(str),  # kernel name for this kind only (options: model.attention)
        "num_kv_heads": config_dict.placeholder(int),
        "head_mask": config_dict.placeholder(str),  # '1,0,1,1' every layer, or 'row;row;...' one per layer
    })
    return ml_collections.ConfigDict({k: kind() for k in attention_kinds()})


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
        "name": config_dict.placeholder(str),  # a registered model (attn_lab/models); unset: the task kind's default
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
        "weight_decay": 0.01, "weight_decay_on": "matrices", "label_smoothing": 0.1, "grad_clip": 1.0,
        "log_every": 50, "eval_every": 500,
        "checkpoint_every": 500, "max_eval_batches": config_dict.placeholder(int),
        "init_from": config_dict.placeholder(str),  # a finished run's folder: start from its parameters
    })
    c.loss = ml_collections.ConfigDict({"diversity": diversity.default_config(), **learned.default_config()})
    c.heads = ml_collections.ConfigDict({
        "track": False,  # per-head diagnostics logged at every evaluation
        # L0 head gates (attn_lab/models/gates.py): penalty l0 * E[open gates], or keep at most `target` of heads
        "gates": {"enabled": False, "l0": 0.0, "target": config_dict.placeholder(float), "dual_lr": 0.3,
                  "init": 3.0, "lr": 0.05, "anneal": 0.5},
    })
    c.parallel = ml_collections.ConfigDict({  # data parallel over all devices; multi-host (attn_lab/train/parallel.py)
        "shard_params": False, "distributed": False, "coordinator_address": config_dict.placeholder(str),
        "num_processes": config_dict.placeholder(int), "process_id": config_dict.placeholder(int)})
    c.eval = ml_collections.ConfigDict({
        "bleu_tokenize": "13a",  # sacrebleu tokenizer ('char' for one-word targets)
        "beam_size": 1,  # 1: greedy decoding; Vaswani et al. used 4 (attn_lab/train/beam.py)
        "length_penalty": 0.6,  # GNMT's alpha, ranking beams by log P / ((5 + |Y|) / 6)^alpha; unused at beam 1
        "validation_beam_size": config_dict.placeholder(int),  # periodic validation's beam; unset: eval.beam_size
    })
    c.wandb = ml_collections.ConfigDict({"mode": "offline", "project": "attn_lab",
                                         "group": config_dict.placeholder(str), "tags": (),
                                         "name": config_dict.placeholder(str)})
    return c


CHOICES = {"model.norm": ("pre", "post"), "model.dtype": ("float32", "bfloat16"),
           "model.positions": ("sinusoidal", "learned"), "model.pooling": ("mean", "cls"),
           "train.schedule": ("rsqrt", "cosine"),
           "train.weight_decay_on": ("matrices", "all")}  # see attn_lab/train/steps.py: decayed
TYPES = {int: "an integer", float: "a number", bool: "True or False", str: "a string"}


def _rule(kind: type, allowed: str = "", test: Callable[[Any], bool] = lambda v: True,
          optional: bool = False) -> tuple:
    """A scalar key's type, what is allowed (for the message) and its test; ``optional``: None (unset) passes."""
    return kind, allowed, test, optional


_POSITIVE_INT, _POSITIVE = _rule(int, "positive", lambda v: v > 0), _rule(float, "positive", lambda v: v > 0)
_OPTIONAL_POSITIVE_INT = _rule(int, "positive", lambda v: v > 0, optional=True)
_NON_NEGATIVE = _rule(float, ">= 0", lambda v: v >= 0)
_FRACTION = _rule(float, "in [0, 1)", lambda v: 0 <= v < 1)
_BOOL, _STR, _OPTIONAL_STR = _rule(bool), _rule(str), _rule(str, optional=True)

# Every scalar key of base_config (kernel options are checked by their kernel, task options by the task).
SCALARS: dict[str, tuple] = {
    "seed": _rule(int, "in [0, 2**32 - 1]", lambda v: v in SEEDS),  # grain's shuffle seeds
    "compile_cache": _STR, "task.data_dir": _OPTIONAL_STR,
    **dict.fromkeys(("model.num_layers", "model.d_model", "model.num_heads"), _POSITIVE_INT),
    "model.mlp_dim": _rule(int, ">= 0 (0: blocks without an MLP)", lambda v: v >= 0),
    **dict.fromkeys(("model.num_decoder_layers", "model.num_kv_heads", "model.head_dim"), _OPTIONAL_POSITIVE_INT),
    **dict.fromkeys(("model.dropout", "model.attention_dropout", "train.label_smoothing"), _FRACTION),
    **dict.fromkeys(("model.tie_embeddings", "model.use_query_bias", "model.use_key_bias", "model.use_value_bias",
                     "model.use_out_bias", "heads.track", "heads.gates.enabled", "parallel.shard_params",
                     "parallel.distributed"), _BOOL),
    **dict.fromkeys(("train.num_steps", "train.batch_size", "train.log_every", "train.eval_every",
                     "train.checkpoint_every"), _POSITIVE_INT),
    "train.max_eval_batches": _OPTIONAL_POSITIVE_INT,
    "train.warmup_steps": _rule(int, ">= 0", lambda v: v >= 0),
    "train.learning_rate": _POSITIVE, "train.weight_decay": _NON_NEGATIVE, "train.weight_decay_on": _STR,
    "train.grad_clip": _rule(float, "positive (the bound on the global gradient norm; 0 would stop learning)",
                             lambda v: v > 0),
    "train.init_from": _OPTIONAL_STR, "model.name": _OPTIONAL_STR,
    **{f"loss.{key}.weight": _NON_NEGATIVE for key in learned.PENALTIES},
    "heads.gates.l0": _NON_NEGATIVE, "heads.gates.dual_lr": _POSITIVE, "heads.gates.lr": _POSITIVE,
    "heads.gates.init": _rule(float),
    "heads.gates.target": _rule(float, "in (0, 1] (the share of heads to keep)", lambda v: 0 < v <= 1, True),
    "heads.gates.anneal": _rule(float, "in [0, 1] (a share of train.num_steps)", lambda v: 0 <= v <= 1),
    "parallel.coordinator_address": _OPTIONAL_STR, "parallel.num_processes": _OPTIONAL_POSITIVE_INT,
    "parallel.process_id": _rule(int, ">= 0", lambda v: v >= 0, optional=True),
    "eval.bleu_tokenize": _STR, "eval.beam_size": _rule(int, ">= 1 (1: greedy decoding)", lambda v: v >= 1),
    "eval.length_penalty": _NON_NEGATIVE,
    "eval.validation_beam_size": _rule(int, ">= 1 (1: greedy decoding), or unset (eval.beam_size)", lambda v: v >= 1,
                                       optional=True),
    "wandb.mode": _STR, "wandb.project": _rule(str, "non-empty", lambda v: v.strip()),
    "wandb.group": _OPTIONAL_STR, "wandb.name": _OPTIONAL_STR,
}


def _has_type(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    kinds = (int, float) if kind is float else kind  # an integer is a number
    return isinstance(value, kinds) and not isinstance(value, bool)


def _check_scalar(key: str, value: Any, rule: tuple) -> None:
    """One line ``<key> must be <what is allowed>, got <value>`` unless ``value`` passes ``rule`` (see SCALARS)."""
    kind, allowed, test, optional = rule
    if value is None and optional:
        return
    if not _has_type(value, kind):
        raise ValueError(f"{key} must be {TYPES[kind]}{' or unset' if optional else ''}, got {value!r}")
    if not test(value):
        raise ValueError(f"{key} must be {allowed}, got {value!r}")


def _check_finite(node: Any, prefix: str = "") -> None:
    """Every number anywhere in the config (kernel and task options included) is finite: inf and nan never are."""
    for key, value in node.items():
        if isinstance(value, ml_collections.ConfigDict):
            _check_finite(value, f"{prefix}{key}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{prefix}{key} must be finite, got {value!r}")


def _kind_rules() -> dict[str, tuple]:
    """``model.kinds.<kind>.*`` of every attention kind a registered model has (known when the config is checked,
    so a model file registered later adds its kinds)."""
    return {**{f"model.kinds.{k}.{o}": _OPTIONAL_STR for k in attention_kinds() for o in ("attention", "head_mask")},
            **{f"model.kinds.{k}.num_kv_heads": _OPTIONAL_POSITIVE_INT for k in attention_kinds()}}


def _check_scalars(config: Any, prefix: str = "") -> None:
    for key, rule in {**SCALARS, **_kind_rules()}.items():
        if key.startswith(prefix):
            _check_scalar(key, config[key], rule)
    for key, choices in CHOICES.items():
        if key.startswith(prefix) and config[key] not in choices:
            raise ValueError(f"{key}='{config[key]}' is not one of: {', '.join(choices)}")


def check_parallel(config: Any) -> None:
    """The ``parallel`` block alone, pure Python: scripts/train.py runs it before ``jax.distributed`` starts."""
    _check_scalars(config, "parallel.")
    p = config.parallel
    for key in ("coordinator_address", "num_processes", "process_id"):
        if p[key] is not None and not p.distributed:
            raise ValueError(f"parallel.{key}={p[key]!r} needs parallel.distributed=True")
    if None not in (p.num_processes, p.process_id) and p.process_id >= p.num_processes:
        raise ValueError(f"parallel.process_id={p.process_id} must be below parallel.num_processes={p.num_processes}")


def _layout(task: Any, cls: type, m: Any) -> dict[str, tuple[int, int]]:
    """Per attention kind, (layers, the longest key sequence a batch can give it), from the configs alone: the model
    says which of the task's lengths (padded up to their last bucket) each kind sees."""
    inputs, targets = sequence_lengths(task)
    return cls.layout(m, bucket_lengths(inputs)[-1], bucket_lengths(targets)[-1] if targets else None)


def _check_kernel_length(kernel: Any, name: str, kind: str, length: int) -> None:
    """A kernel with a ``max_len`` (Linformer's projections) takes no longer keys; found here, not at trace time."""
    limit = getattr(kernel, "max_len", None)
    if limit is not None and length > limit:
        raise ValueError(f"model.attention.{name}.max_len={limit} is shorter than the {kind} keys of this task "
                         f"(up to {length} tokens, the task's length padded to its last bucket); raise it to "
                         f"at least {length}")


def _build_kernel(m: Any, kind: str, kv: int, call: Any) -> tuple[str, Any]:
    """The kernel ``kind`` uses, as one tiny instance from the spec the model builds it from (its options are
    checked by its constructor), checked against how the model calls the kind (``call``: its KindSpec)."""
    spec = attention_spec(m, kind)
    name, _ = validate_spec(spec, where="model.attention" if m.kinds[kind].attention is None
                            else f"model.kinds.{kind}.attention")
    try:  # compile nothing
        kernel = build_kernel(spec, num_heads=m.num_heads, num_kv_heads=kv,  # dtype: an explicit 'cudnn' needs bf16
                              head_dim=m.head_dim or m.d_model // m.num_heads, rngs=nnx.Rngs(0), dtype=m.dtype)
    except (ValueError, TypeError) as e:
        raise ValueError(f"model.attention.{name}: {e}") from None
    try:
        kernel.check(causal=call.causal, cross=call.cross, dropout=m.attention_dropout > 0)
    except ValueError as e:
        raise ValueError(f"{e} (used by {kind})") from None
    return name, kernel


def _check_unused(m: Any, cls: type) -> None:
    """An option the model does not read (a per-kind option of an attention kind it does not have, or one of its
    ``UNUSED`` options away from its neutral value) would silently do nothing: one line instead."""
    kinds, model = tuple(cls.ATTENTION), cls.NAME
    for option, neutral in getattr(cls, "UNUSED", {}).items():
        if m[option] != neutral:
            raise ValueError(f"model.{option}={m[option]!r}: model '{model}' does not use it (leave it at "
                             f"{neutral!r})")
    for kind in m.kinds:
        if kind in kinds:
            continue
        for option, value in m.kinds[kind].items():
            if value is not None:
                raise ValueError(f"model.kinds.{kind}.{option}={value!r}: model '{model}' has no {kind} attention "
                                 f"(its kinds: {', '.join(kinds)})")


def _head_mask(m: Any, kind: str, layers: int) -> tuple | None:
    try:
        return parse_head_mask(m.kinds[kind].head_mask, layers, m.num_heads)
    except ValueError as e:
        raise ValueError(f"model.kinds.{kind}.{e}") from None


def _check_model(m: Any, task: Any) -> dict[str, Any]:
    """Checks the model block against the task; returns the kernel each attention kind builds."""
    if m.head_dim is None and m.d_model % m.num_heads:
        raise ValueError(f"model.num_heads={m.num_heads} does not divide model.d_model={m.d_model}; "
                         "set model.head_dim to decouple them")
    cls = model_class(task_kind(task), m.name)
    kinds = tuple(cls.ATTENTION)
    _check_unused(m, cls)
    layout, kernels, masks = _layout(task, cls, m), {}, {}
    for kind in kinds:
        kv = m.kinds[kind].num_kv_heads or m.num_kv_heads or m.num_heads
        if m.num_heads % kv:
            raise ValueError(f"model.num_heads={m.num_heads} is not divisible by num_kv_heads={kv} ({kind})")
        name, kernels[kind] = _build_kernel(m, kind, kv, cls.ATTENTION[kind])
        _check_kernel_length(kernels[kind], name, kind, layout[kind][1])
        masks[kind] = _head_mask(m, kind, layout[kind][0])
    if all(mask is not None and not any(map(any, mask)) for mask in masks.values()):  # pruning keeps one head too
        raise ValueError(f"model.kinds.{kinds[-1]}.head_mask={m.kinds[kinds[-1]].head_mask!r}: the head masks "
                         "mask every attention head of the model; keep at least one")
    return kernels


def _check_gates(g: Any) -> None:
    if (g.l0 > 0 or g.target is not None) and not g.enabled:
        raise ValueError("heads.gates.l0 / heads.gates.target need heads.gates.enabled=True")


def _check_diversity_layers(config: Any) -> None:
    """Layer indices past the model's depth would regularize nothing, silently."""
    depth = max(config.model.num_layers, config.model.num_decoder_layers or 0)
    layers = diversity.selected_layers(config.loss.diversity)
    bad = [i for i in layers if not 0 <= i < depth]
    if bad:
        raise ValueError(f"loss.diversity.layers={config.loss.diversity.layers!r}: layer {bad[0]} does not exist; "
                         f"the model's layers are 0..{depth - 1}")


def _check_batch_size(config: Any) -> None:
    """Against the training split where its size is known from the config alone (see ``max_train_examples``; other
    tasks are checked when their data is loaded) and against the devices that split it."""
    batch, most = config.train.batch_size, max_train_examples(config.task)
    if most is not None and batch > most:
        raise ValueError(f"train.batch_size={batch} exceeds the training split of task '{config.task.name}' "
                         f"(at most {most} examples with these task settings)")
    if batch % jax.device_count():
        raise ValueError(f"train.batch_size={batch} must be divisible by the {jax.device_count()} devices "
                         "(data parallel)")


def _check_bleu(tokenize: str, generates: bool) -> None:
    """The BLEU tokenizer, checked now rather than at the first evaluation after training; built only for a model
    that generates text (the only one scored by BLEU)."""
    if tokenize not in BLEU.TOKENIZERS:
        raise ValueError(f"eval.bleu_tokenize={tokenize!r} is not one of sacrebleu's tokenizers: "
                         f"{', '.join(BLEU.TOKENIZERS)}")
    if not generates:
        return
    try:  # 'ja-mecab' and 'ko-mecab' need extra packages; the 'flores' ones download a model once (fail offline)
        BLEU(tokenize=tokenize)
    except Exception as e:  # noqa: BLE001 (import, network and runtime errors: report one line)
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise ValueError(f"eval.bleu_tokenize={tokenize!r} cannot be used here: {first}") from None


def _check_wandb(w: Any) -> None:
    check_wandb_mode(w.mode)
    if not isinstance(w.tags, (tuple, list)) or not all(isinstance(t, str) for t in w.tags):
        raise ValueError(f"wandb.tags must be a tuple of strings, got {w.tags!r}")


def check_workdirs(workdirs: list[str]) -> None:
    """The run folders scripts/train.py will write (checked before anything is created)."""
    for workdir in workdirs:
        check_writable(workdir, "--workdir")


def _check_paths(config: Any) -> None:
    """Every path the run reads or writes besides its workdir: init_from, the compile cache and the data."""
    if config.train.init_from is not None and not os.path.isdir(os.path.join(config.train.init_from, "checkpoints")):
        raise ValueError(f"train.init_from='{config.train.init_from}' is not a run folder with checkpoints")
    if config.compile_cache:
        try:
            check_writable(config.compile_cache, "compile_cache")
        except ValueError as e:
            raise ValueError(f"{e} ('' turns the compilation cache off)") from None
    data_dir = resolve_data_dir(config.task.data_dir)
    try:
        check_writable(data_dir, "task.data_dir")
    except ValueError as e:
        if os.path.isdir(data_dir) and is_prepared(config.task, data_dir):  # a prepared dataset is only read
            return
        raise ValueError(f"{e}, and task '{config.task.name}' is not prepared there (preparing writes it)") from None


def validate_config(config: Any) -> None:
    """Raises ValueError with one line naming the first bad key, its value and what is allowed.

    Never prepares data, compiles or writes a file. It builds one tiny instance of each attention kernel, so call it
    after ``jax.distributed`` starts (:func:`check_parallel` is the part that can run before).
    """
    _check_finite(config)
    _check_scalars(config)
    check_parallel(config)
    _check_gates(config.heads.gates)
    validate_task_config(config.task)
    kernels = _check_model(config.model, config.task)
    diversity.check_config(config.loss.diversity, kernels)
    learned.check_config(config.loss, kernels)
    _check_diversity_layers(config)
    _check_batch_size(config)
    _check_bleu(config.eval.bleu_tokenize, model_class(task_kind(config.task), config.model.name).GENERATES)
    _check_wandb(config.wandb)
    _check_paths(config)
