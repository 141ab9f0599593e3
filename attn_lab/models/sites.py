"""Model kinds, found by name, and the attention sites each declares: the one place a model's layout is stated.

A model kind is one file in ``attn_lab/models/`` with a class decorated by :func:`register_model`. The class says,
once, what every other part of the lab needs to know about its attention:

- ``ATTENTION``: per attention kind (``encoder_self``, ``decoder_self``, ``cross``, or a new name), a
  :class:`KindSpec` -- whether the call is causal, whether keys come from another sequence, how it is masked --,
  read before any model is built (config validation, the dispatch log line);
- ``TASK_KINDS``: the task kinds it trains on (their batches are what ``forward_batch`` reads);
- ``layout(model_cfg, inputs, targets)``: per kind, its number of layers and the longest keys it sees for a
  task's padded sequence lengths (config validation, before anything is built);
- ``sites()``: every attention layer as a :class:`Site` -- kind, layer, and the attribute path to its
  ``MultiHeadAttention`` (the same path leads to its parameters in the model's pure-dict state) and to the stack
  holding that kind's static head masks;
- ``attention_rows(batch)``: per kind, the real query rows ``[B, T]`` and the keys each may see ``[B, T, S]``.

Capture, diversity terms, head importance and gradient norms, structural pruning, KV-cache decoding, config
validation and the dispatch line read these; none of them names a model's attributes. ``tests/test_models.py``
registers a throwaway model kind at test time and runs capture, importance and structural pruning on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from flax import nnx

from attn_lab.models.transformer import Stack


@dataclasses.dataclass(frozen=True)
class KindSpec:
    """How a model calls one attention kind.

    Attributes:
      causal: the call overlays a causal mask (query i sees keys j <= i).
      cross: keys and values come from another sequence (the encoder's memory).
      mask: 'key_padding' (a ``[B, 1, 1, S]`` boolean mask) or 'none' (what ``attention.dispatch`` decides on).
      decodes: the kind reads and extends a KV cache during generation.
    """

    causal: bool = False
    cross: bool = False
    mask: str = "key_padding"
    decodes: bool = False


@dataclasses.dataclass(frozen=True)
class Site:
    """One attention layer of a built model: its kind, its layer index within the kind, the attribute path to its
    ``MultiHeadAttention`` (e.g. ``('decoder', 'blocks', 0, 'cross_attn')``) and to the stack that holds the kind's
    static head masks."""

    kind: str
    layer: int
    path: tuple
    stack: tuple


_MODELS: dict[str, type] = {}


_DEFAULTS: dict[str, str] = {}  # task kind -> the model a config without model.name gets


def register_model(name: str, *, default: bool = False):
    """Class decorator: registers a model kind under ``name`` (``config.model.name``); ``default``: the model of
    its task kinds when a config names none (one default per task kind)."""
    def add(cls):
        if name in _MODELS:
            raise ValueError(f"model '{name}' registered twice")
        for attr in ("ATTENTION", "TASK_KINDS", "GENERATES"):
            if not hasattr(cls, attr):
                raise ValueError(f"model '{name}' must declare {attr} (attn_lab/models/sites.py)")
        taken = [k for k in cls.TASK_KINDS if default and k in _DEFAULTS]
        if taken:
            raise ValueError(f"model '{name}': '{_DEFAULTS[taken[0]]}' is already the default for {taken[0]} tasks")
        cls.NAME = name
        _MODELS[name] = cls
        _DEFAULTS.update({k: name for k in cls.TASK_KINDS if default})
        return cls
    return add


def model_names() -> tuple[str, ...]:
    return tuple(_MODELS)


def model_class(task_kind: str, name: str | None = None) -> type:
    """The model class for a task kind: ``name`` when given (it must train on that kind), else the kind's default
    model. One-line ValueErrors for an unknown name or a mismatch."""
    if name is not None:
        if name not in _MODELS:
            raise ValueError(f"model.name={name!r} is not a registered model; choose one of: {', '.join(_MODELS)}")
        cls = _MODELS[name]
        if task_kind not in cls.TASK_KINDS:
            raise ValueError(f"model.name={name!r} trains on {', '.join(cls.TASK_KINDS)} tasks; this task is "
                             f"{task_kind!r}")
        return cls
    if task_kind not in _DEFAULTS:
        raise ValueError(f"task kind {task_kind!r} has no default model; registered: "
                         + ", ".join(f"{n} ({'/'.join(c.TASK_KINDS)})" for n, c in _MODELS.items()))
    return _MODELS[_DEFAULTS[task_kind]]


def attention_kinds() -> tuple[str, ...]:
    """Every attention kind some registered model has, in registration order (what ``config.model.kinds`` holds)."""
    return tuple(dict.fromkeys(k for cls in _MODELS.values() for k in cls.ATTENTION))


def build_model(cfg: Any, *, kind: str, vocab_size: int, max_len: int, num_classes: int | None = None,
                seed: int = 0, gates: Any = None) -> nnx.Module:
    """The model for task kind ``kind`` from ``config.model`` (``model.name`` picks among the models of that kind);
    ``gates``: ``config.heads.gates`` (L0 head gates when enabled)."""
    cls = model_class(kind, cfg.get("name") if hasattr(cfg, "get") else None)
    return cls(cfg, vocab_size=vocab_size, max_len=max_len, num_classes=num_classes, rngs=nnx.Rngs(params=seed),
               gates=gates)


def stack_sites(name: str, stack: Stack) -> list[Site]:
    """The sites of a :class:`~attn_lab.models.transformer.Stack` held at attribute ``name``: each block's
    self-attention, then its cross-attention if it has one."""
    out = []
    for layer, block in enumerate(stack.blocks):
        out.append(Site(block.self_kind, layer, (name, "blocks", layer, "self_attn"), (name,)))
        if block.cross_attn is not None:
            out.append(Site("cross", layer, (name, "blocks", layer, "cross_attn"), (name,)))
    return out


def resolve(root: Any, path: Iterable) -> Any:
    """``root.<path>``: attributes for names, indexing for ints (works on modules and on pure-dict states)."""
    node = root
    for part in path:
        node = node[part] if isinstance(part, int) or isinstance(node, dict) else getattr(node, part)
    return node


def set_module(root: nnx.Module, path: tuple, module: nnx.Module) -> None:
    """Replaces the module at ``path`` (structural pruning swaps an attention for a smaller one)."""
    parent, last = resolve(root, path[:-1]), path[-1]
    if isinstance(last, int):
        parent[last] = module
    else:
        setattr(parent, last, module)


def attention_layers(model: nnx.Module) -> list[tuple[str, int, nnx.Module]]:
    """(kind, layer, attention module) for every site of ``model``, in its declared order."""
    return [(s.kind, s.layer, resolve(model, s.path)) for s in model.sites()]


def mask_shapes(model: nnx.Module) -> dict[str, tuple[int, int]]:
    """Attention kind -> (layers, heads): the shape of a ``[L, N]`` head mask per kind."""
    out: dict[str, tuple[int, int]] = {}
    for kind, _, attn in attention_layers(model):
        layers, _ = out.get(kind, (0, attn.num_heads))
        out[kind] = (layers + 1, attn.num_heads)
    return out


def decoding_attentions(model: nnx.Module) -> list[nnx.Module]:
    """The attention modules that read and extend a KV cache during generation (kinds with ``decodes``)."""
    return [attn for kind, _, attn in attention_layers(model) if type(model).ATTENTION[kind].decodes]


def supports_cached_decoding(model: nnx.Module) -> bool:
    """Whether every cached attention's kernel can decode incrementally (else generation re-runs the prefix)."""
    return all(attn.kernel.supports_decode for attn in decoding_attentions(model))
