"""The config schema shared by every task, and its validation.

Task config files (``configs/<task>.py``) start from :func:`base_config` and set the task block plus their own
defaults; a ``:quick`` preset shrinks everything. Each section declares its keys once, each key's default beside
the rule it must pass (:data:`SECTIONS`); sections whose keys depend on a registry are built from it -- the
kernels' options (``model.attention.<kernel>``), the models' attention kinds (``model.kinds.<kind>``), the task's
options (``task.*``) and the loss terms' sections (``loss.<term>``, ``heads.gates``: :mod:`attn_lab.objectives`).

:func:`validate_config` runs before any data is prepared, any function compiles or any file is written, and names
the bad key, its value and what is allowed in one line: every key's type and range, the paths the run reads or
writes, and the options only used late (the BLEU tokenizer, a kernel's length limit against the task's lengths,
the batch size against the training split). The task is resolved once per validation.
"""

from __future__ import annotations

import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from ml_collections import config_dict
from sacrebleu.metrics import BLEU

from attn_lab import objectives
from attn_lab.attention import KERNELS, build_kernel, dispatch, validate_spec
from attn_lab.attention.registry import default_options, option_type
from attn_lab.attention.tiles import fused_plan
from attn_lab.checks import (
    BOOL,
    FRACTION,
    NON_NEGATIVE,
    OPTIONAL_POSITIVE_INT,
    OPTIONAL_STR,
    POSITIVE,
    POSITIVE_INT,
    SEEDS,
    STR,
    Rule,
    check_value,
    check_writable,
)
from attn_lab.data.builders import resolve_data_dir
from attn_lab.data.pipeline import bucket_lengths
from attn_lab.data.tasks import ResolvedTask, resolve
from attn_lab.models import attention_kinds, model_class, parse_head_mask
from attn_lab.models.transformer import attention_spec
from attn_lab.train import identity
from attn_lab.train.logging import check_wandb_mode
from attn_lab.train.workdir import SEED_FIELD


def choice(*options: str) -> Rule:
    """A string key with a fixed set of values (its message: ``<key>='<value>' is not one of: a, b``)."""
    return Rule(str, choices=options)


# Each section: key -> (default, rule). An optional rule with default None makes an unset key of the rule's type.
SECTIONS: dict[str, dict[str, tuple[Any, Rule | None]]] = {
    "": {"seed": (0, Rule(int, "in [0, 2**32 - 1]", lambda v: v in SEEDS)),  # grain's shuffle seeds
         # JAX's persistent compilation cache; '' turns it off
         "compile_cache": ("~/.cache/attn_lab/jax_compile", STR)},
    "task": {"name": ("numbers", None), "data_dir": (None, OPTIONAL_STR)},  # the task checks its name and options
    "model": {
        "name": (None, OPTIONAL_STR),  # a registered model (attn_lab/models); unset: the task kind's default
        "num_layers": (2, POSITIVE_INT), "num_decoder_layers": (None, OPTIONAL_POSITIVE_INT),
        "d_model": (128, POSITIVE_INT), "num_heads": (4, POSITIVE_INT), "num_kv_heads": (None, OPTIONAL_POSITIVE_INT),
        "head_dim": (None, OPTIONAL_POSITIVE_INT),
        "mlp_dim": (512, Rule(int, ">= 0 (0: blocks without an MLP)", lambda v: v >= 0)),
        "dropout": (0.1, FRACTION), "attention_dropout": (0.0, FRACTION),
        "norm": ("pre", choice("pre", "post")), "positions": ("sinusoidal", choice("sinusoidal", "learned")),
        "tie_embeddings": (True, BOOL), "pooling": ("mean", choice("mean", "cls")),
        # computation dtype; 'bfloat16' keeps float32 parameters and optimizer state
        "dtype": ("float32", choice("float32", "bfloat16")),
        **{f"use_{p}_bias": (True, BOOL) for p in ("query", "key", "value", "out")},
    },
    "train": {
        "num_steps": (2000, POSITIVE_INT), "batch_size": (64, POSITIVE_INT), "learning_rate": (1e-3, POSITIVE),
        "warmup_steps": (200, Rule(int, ">= 0", lambda v: v >= 0)), "schedule": ("rsqrt", choice("rsqrt", "cosine")),
        "weight_decay": (0.01, NON_NEGATIVE),
        "weight_decay_on": ("matrices", choice("matrices", "all")),  # see attn_lab/train/steps.py: decayed
        "label_smoothing": (0.1, FRACTION),
        "grad_clip": (1.0, Rule(float, "positive (the bound on the global gradient norm; 0 would stop learning)",
                                lambda v: v > 0)),
        "log_every": (50, POSITIVE_INT), "eval_every": (500, POSITIVE_INT), "checkpoint_every": (500, POSITIVE_INT),
        "max_eval_batches": (None, OPTIONAL_POSITIVE_INT),
        "init_from": (None, OPTIONAL_STR),  # a finished run's folder: start from its parameters ({seed}: per seed)
        # 'mean_pool': init_from's key/value heads mean-pooled into this model's groups (attn_lab/train/uptrain.py)
        "init_kv_heads": ("same", choice("same", "mean_pool")),
    },
    "heads": {"track": (False, BOOL)},  # per-head diagnostics logged at every evaluation (gates: objectives/gates.py)
    "parallel": {  # data parallel over all devices; multi-host (attn_lab/train/parallel.py)
        "shard_params": (False, BOOL), "distributed": (False, BOOL), "coordinator_address": (None, OPTIONAL_STR),
        "num_processes": (None, OPTIONAL_POSITIVE_INT),
        "process_id": (None, Rule(int, ">= 0", lambda v: v >= 0, optional=True))},
    "eval": {
        "bleu_tokenize": ("13a", STR),  # sacrebleu tokenizer ('char' for one-word targets)
        # 1: greedy decoding; Vaswani et al. used 4 (attn_lab/train/beam.py)
        "beam_size": (1, Rule(int, ">= 1 (1: greedy decoding)", lambda v: v >= 1)),
        # GNMT's alpha, ranking beams by log P / ((5 + |Y|) / 6)^alpha; unused at beam 1
        "length_penalty": (0.6, NON_NEGATIVE),
        # periodic validation's beam; unset: eval.beam_size
        "validation_beam_size": (None, Rule(int, ">= 1 (1: greedy decoding), or unset (eval.beam_size)",
                                            lambda v: v >= 1, optional=True)),
    },
    "wandb": {"mode": ("offline", STR), "project": ("attn_lab", Rule(str, "non-empty", lambda v: v.strip())),
              "group": (None, OPTIONAL_STR), "tags": ((), None), "name": (None, OPTIONAL_STR)},
}


def _section(keys: dict[str, tuple[Any, Rule | None]]) -> ml_collections.ConfigDict:
    """A section's defaults; an unset optional key is a placeholder of its rule's type (so a flag can set it)."""
    return ml_collections.ConfigDict({k: config_dict.placeholder(rule.kind) if default is None else default
                                      for k, (default, rule) in keys.items()})


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
            {k: config_dict.placeholder(option_type(kernel, k)) if v is None else v
             for k, v in default_options(kernel).items()})
    return c


def base_config() -> ml_collections.ConfigDict:
    """Defaults for every key (:data:`SECTIONS` and the registries); task files override what differs."""
    c = _section(SECTIONS[""])
    for name, keys in SECTIONS.items():
        if name:
            c[name] = _section(keys)
    c.model.attention, c.model.kinds = attention_config(), _kind_overrides()
    c.loss = ml_collections.ConfigDict()
    objectives.add_sections(c)  # loss.<term> and heads.gates
    return c


def _check_finite(node: Any, prefix: str = "") -> None:
    """Every number anywhere in the config (kernel and task options included) is finite: inf and nan never are."""
    for key, value in node.items():
        if isinstance(value, ml_collections.ConfigDict):
            _check_finite(value, f"{prefix}{key}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{prefix}{key} must be finite, got {value!r}")


def _rules() -> dict[str, Rule]:
    """Every declared key's rule by its dotted name, ``model.kinds.<kind>.*`` of every attention kind a registered
    model has (known when the config is checked, so a model file registered later adds its kinds)."""
    rules = {(f"{name}.{k}" if name else k): rule for name, keys in SECTIONS.items()
             for k, (_, rule) in keys.items() if rule is not None}
    for kind in attention_kinds():
        rules |= {f"model.kinds.{kind}.attention": OPTIONAL_STR, f"model.kinds.{kind}.head_mask": OPTIONAL_STR,
                  f"model.kinds.{kind}.num_kv_heads": OPTIONAL_POSITIVE_INT}
    return rules


def _check_scalars(config: Any, prefix: str = "") -> None:
    for key, rule in _rules().items():
        if key.startswith(prefix):
            check_value(key, config[key], rule)


def check_parallel(config: Any) -> None:
    """The ``parallel`` block alone, pure Python: scripts/train.py runs it before ``jax.distributed`` starts."""
    _check_scalars(config, "parallel.")
    p = config.parallel
    for key in ("coordinator_address", "num_processes", "process_id"):
        if p[key] is not None and not p.distributed:
            raise ValueError(f"parallel.{key}={p[key]!r} needs parallel.distributed=True")
    if None not in (p.num_processes, p.process_id) and p.process_id >= p.num_processes:
        raise ValueError(f"parallel.process_id={p.process_id} must be below parallel.num_processes={p.num_processes}")


def _layout(task: ResolvedTask, cls: type, m: Any) -> dict[str, tuple[int, int]]:
    """Per attention kind, (layers, the longest key sequence a batch can give it), from the configs alone: the model
    says which of the task's lengths (padded up to their last bucket) each kind sees."""
    inputs, targets = task.sequence_lengths()
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
    if _runs_fused(kernel):  # a tile beyond shared memory: before any file exists
        tile = getattr(kernel, "fused_block_size", None) or kernel.default_fused_block()
        try:
            fused_plan(tile, kernel.head_dim, jnp.dtype(m.dtype))
        except ValueError as e:
            others = [a for a in getattr(kernel, "IMPLEMENTATIONS", ()) if a not in dispatch.FUSED]
            raise ValueError(f"model.attention.{name}: {e}{(': ' + ', '.join(map(repr, others))) if others else ''}"
                             f" (used by {kind})") from None
    return name, kernel


def _runs_fused(kernel: Any) -> bool:
    """Whether the kernel runs the fused Pallas kernel here (compiled, interpreted, or 'auto' once fused is the GPU
    default: :func:`~attn_lab.attention.dispatch.choose_fused`, as the kernel decides at its call)."""
    allowed = getattr(kernel, "IMPLEMENTATIONS", ())
    return bool(set(allowed) & set(dispatch.FUSED)) and dispatch.choose_fused(
        kernel.implementation, fallback="xla", needs_matrix=False, backend=jax.default_backend(),
        allowed=allowed) in dispatch.FUSED


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


def _check_model(m: Any, task: ResolvedTask) -> dict[str, Any]:
    """Checks the model block against the task; returns the kernel each attention kind builds."""
    if m.head_dim is None and m.d_model % m.num_heads:
        raise ValueError(f"model.num_heads={m.num_heads} does not divide model.d_model={m.d_model}; "
                         "set model.head_dim to decouple them")
    cls = model_class(task.kind, m.name)
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


def _check_batch_size(config: Any, task: ResolvedTask) -> None:
    """Against the training split where its size is known from the config alone (see ``max_train_examples``; other
    tasks are checked when their data is loaded) and against the devices that split it."""
    batch, most = config.train.batch_size, task.max_train_examples()
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


# What a run folder holds, by kind: a path of the wrong kind (a file named checkpoints) stops the run in one line.
RUN_FOLDER = {"checkpoints": "folder", "wandb": "folder", "analysis": "folder", "config.json": "file",
              "results.json": "file", "training.json": "file", "metrics.jsonl": "file"}


def check_workdirs(workdirs: list[str]) -> None:
    """The run folders scripts/train.py will write (checked before anything is created): writable, and what they
    already hold of the kind a run writes there (:data:`RUN_FOLDER`)."""
    for workdir in workdirs:
        check_writable(workdir, "--workdir")
        for name, kind in RUN_FOLDER.items():
            path = os.path.join(workdir, name)
            if os.path.lexists(path) and (os.path.isdir(path) != (kind == "folder") or not os.path.exists(path)):
                raise ValueError(f"--workdir='{workdir}': {path} is not a {kind} (a run writes its {name} there); "
                                 "move it away or use another --workdir")


def _check_paths(config: Any, task: ResolvedTask) -> None:
    """Every path the run reads or writes besides its workdir: init_from, the compile cache and the data."""
    per_seed = config.train.init_from is not None and SEED_FIELD in config.train.init_from  # checked per seed later
    if (config.train.init_from is not None and not per_seed
            and not os.path.isdir(os.path.join(config.train.init_from, "checkpoints"))):
        raise ValueError(f"train.init_from='{config.train.init_from}' is not a run folder with checkpoints")
    if config.train.init_kv_heads == "mean_pool" and not per_seed:
        _check_kv_pooling(config, task)
    if config.compile_cache:
        try:
            check_writable(config.compile_cache, "compile_cache")
        except ValueError as e:
            raise ValueError(f"{e} ('' turns the compilation cache off)") from None
    data_dir = resolve_data_dir(config.task.data_dir)
    try:
        check_writable(data_dir, "task.data_dir")
    except ValueError as e:
        if os.path.isdir(data_dir) and task.is_prepared(data_dir):  # a prepared dataset is only read
            return
        raise ValueError(f"{e}, and task '{config.task.name}' is not prepared there (preparing writes it)") from None


def _check_kv_pooling(config: Any, task: ResolvedTask) -> None:
    """GQA uptraining pools a finished run's key/value heads into fewer groups: it needs that run, and per attention
    kind of this model its key/value head count a multiple of this one's, larger for at least one kind (checked
    from its config.json, before this run builds anything)."""
    from attn_lab.results import read_config

    if config.train.init_from is None:
        raise ValueError("train.init_kv_heads='mean_pool' needs train.init_from (the finished multi-head run whose "
                         "key/value heads it pools)")
    source, m = read_config(config.train.init_from)["model"], config.model
    pairs = {kind: ((source.get("kinds", {}).get(kind, {}).get("num_kv_heads") or source.get("num_kv_heads")
                     or source["num_heads"]), m.kinds[kind].num_kv_heads or m.num_kv_heads or m.num_heads)
             for kind in model_class(task.kind, m.name).ATTENTION}
    bad = next(((k, h, w) for k, (h, w) in pairs.items() if h < w or h % w), None)
    if bad is not None or all(h == w for h, w in pairs.values()):
        kind, have, want = bad or next((k, h, w) for k, (h, w) in pairs.items())
        raise ValueError(f"train.init_kv_heads='mean_pool': {config.train.init_from} has {have} key/value heads in "
                         f"{kind} and this model {want}; pooling needs fewer groups here, dividing {have}")


def unused_kernel_options(config: Any) -> list[str]:
    """``model.attention.<kernel>.<option>=<value>`` of each option set away from its default for a kernel that no
    attention uses (:func:`attn_lab.train.identity.unused_kernels`): it does nothing. Not an error -- one experiment's
    ``overrides`` may set every variant's options for all of its trials -- but the run says so
    (:func:`validate_config` returns these)."""
    keys = identity.flat(config.to_dict())
    return [f"model.attention.{kernel}.{option}={keys[f'model.attention.{kernel}.{option}']!r}"
            for kernel in sorted(identity.unused_kernels(keys))
            for option, default in default_options(kernel).items()
            if keys[f"model.attention.{kernel}.{option}"] != identity.plain(default)]


def validate_config(config: Any) -> list[str]:
    """Raises ValueError with one line naming the first bad key, its value and what is allowed.

    Never prepares data, compiles or writes a file. It builds one tiny instance of each attention kernel, so call it
    after ``jax.distributed`` starts (:func:`check_parallel` is the part that can run before). Returns the notes a
    run prints before it starts: options set for a kernel no attention kind uses (:func:`unused_kernel_options`).
    A run validates through :func:`attn_lab.train.spec.resolve_run`, once per process.
    """
    return validated(config)[0]


def validated(config: Any) -> tuple[list[str], ResolvedTask, dict[str, Any]]:
    """:func:`validate_config`'s checks; returns its notes, the resolved task and the kernel each attention kind
    builds (what :class:`attn_lab.train.spec.RunSpec` keeps, so nothing is resolved twice)."""
    _check_finite(config)
    _check_scalars(config)
    check_parallel(config)
    task = resolve(config.task)
    task.check()
    kernels = _check_model(config.model, task)
    depth = max(config.model.num_layers, config.model.num_decoder_layers or 0)
    objectives.check_sections(config, objectives.ModelFacts(kernels, depth))
    _check_batch_size(config, task)
    _check_bleu(config.eval.bleu_tokenize, model_class(task.kind, config.model.name).GENERATES)
    _check_wandb(config.wandb)
    _check_paths(config, task)
    unused = unused_kernel_options(config)
    notes = [f"note: {', '.join(unused)} set, but no attention of this model uses that kernel (it has no effect; "
             f"the kernels used: {', '.join(sorted({attention_spec(config.model, k)['name'] for k in kernels}))})"
             ] if unused else []
    return notes, task, kernels
