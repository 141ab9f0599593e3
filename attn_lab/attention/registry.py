"""Registry of attention kernels, selected by name.

A kernel turns projected queries, keys and values ``[batch, length, heads, head_dim]`` into per-head outputs.
The projections, head masks, KV cache and capture live in :class:`attn_lab.attention.MultiHeadAttention`; a kernel
only decides *how* the heads attend. Adding a variant is one new file with a class decorated by ``@register``:
the module, the models, the trainer and the tests find it here by name (no ``if/elif`` chains on names).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
from flax import nnx

from attn_lab import plugins

KERNELS: dict[str, type["AttentionKernel"]] = {}


class AttentionKernel(nnx.Module):
    """Base class of attention kernels.

    Subclasses take their options as keyword-only constructor arguments (validated by :func:`build_kernel`) and
    implement :meth:`__call__`. The class attributes say which settings the method defines, so unsupported
    combinations stop with one clear line before anything compiles (see :meth:`check`).
    """

    name: ClassVar[str] = ""
    supports_causal: ClassVar[bool] = True
    supports_cross: ClassVar[bool] = True
    supports_decode: ClassVar[bool] = True
    supports_weights: ClassVar[bool] = True  # can materialize the attention matrix it implies
    supports_dropout: ClassVar[bool] = True  # dropout on attention weights (needs the weights)
    # decode calls also get ``query_position`` (the cache slot of the decoded query): kernels whose weights depend on
    # the query-key distance (adaptive span) need it; the others' signature stays as below
    decode_needs_position: ClassVar[bool] = False
    # a kernel with a learned shape regularizes it through ``config.loss.<penalty_key>.weight`` (adaptive span: 'span')
    penalty_key: ClassVar[str | None] = None

    def __init__(self, *, num_heads: int, num_kv_heads: int, head_dim: int, rngs: nnx.Rngs | None = None,
                 dtype: Any = None, param_dtype: Any = None):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim

    def check(self, *, causal: bool = False, cross: bool = False, decode: bool = False,
              dropout: bool = False) -> None:
        """Raises ValueError (one line) when this kernel does not define the requested use; the one place the
        capability flags are enforced (module construction and call, config validation)."""
        for wanted, ok, what in ((causal, self.supports_causal, "causal attention"),
                                 (cross, self.supports_cross, "cross-attention"),
                                 (decode, self.supports_decode, "KV-cache decoding"),
                                 (dropout, self.supports_dropout, "attention dropout")):
            if wanted and not ok:
                raise ValueError(f"attention '{self.name}' does not support {what}")

    def check_call(self, query: jax.Array, key: jax.Array, dropout_rate: float, deterministic: bool) -> None:
        """Call-time guard for kernels used directly (the module checks these when it is built and called):
        self-attention-only kernels need q_len == kv_len; kernels without dropout refuse a training dropout."""
        self.check(cross=key.shape[1] != query.shape[1], dropout=dropout_rate > 0.0 and not deterministic)

    def penalty(self) -> jax.Array:
        """This layer's regularizer before its config weight (kernels with a ``penalty_key`` define it)."""
        raise NotImplementedError(f"attention '{self.name}' has no penalty")

    def project(self) -> None:
        """Puts this kernel's parameters back into the set they are allowed in, after an optimizer step (a projected
        gradient step; :func:`attn_lab.train.steps.project` calls it for kernels whose ``projects`` is True).
        Adaptive span's ``clamp`` option clamps its span fractions to [0, 1] here, as the paper's code does."""

    @property
    def projects(self) -> bool:
        """Whether :meth:`project` changes anything (False: the train step leaves the parameters as updated)."""
        return False

    def learned(self) -> dict[str, jax.Array]:
        """Per-head shape parameters, ``{name: [num_heads]}`` (adaptive span: 'span'; entmax: 'alpha', fixed or
        learned), logged at evaluation and reported by head analysis. Kernels without such a parameter have none."""
        return {}

    def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array, *, mask: jax.Array | None,
                 is_causal: bool, dropout_rng: jax.Array | None, dropout_rate: float, broadcast_dropout: bool,
                 deterministic: bool, precision: Any, need_weights: bool
                 ) -> tuple[jax.Array, jax.Array | None]:
        """Attends.

        Args:
          query: ``[batch, q_len, num_heads, head_dim]``.
          key, value: ``[batch, kv_len, num_kv_heads, head_dim]`` (grouped-query when num_kv_heads < num_heads).
          mask: boolean, broadcastable to ``[batch, num_heads, q_len, kv_len]``; False masks a key out.
          is_causal: overlay a causal mask (query i sees keys j <= i).
          need_weights: also return the attention matrix ``[batch, num_heads, q_len, kv_len]``.
          query_position: (only kernels with ``decode_needs_position``, only when decoding) the cache slot of the
            query, an int32 scalar; keys are the whole cache, the slots not yet written masked out by ``mask``.

        Returns:
          ``(out [batch, q_len, num_heads, head_dim], weights or None)``.
        """
        raise NotImplementedError


plugins.SECTIONS["model.attention"] = (lambda: KERNELS, lambda rest: f"attention kernel '{rest.split('.')[0]}'")


def register(name: str):
    """Class decorator: registers an :class:`AttentionKernel` subclass under ``name``."""
    def wrap(cls: type[AttentionKernel]) -> type[AttentionKernel]:
        if name in KERNELS:
            raise ValueError(f"attention kernel '{name}' registered twice")
        cls.name = name
        KERNELS[name] = cls
        return cls
    return wrap


def split_spec(spec: str | Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """A kernel spec -> ``(name, options)``.

    Accepted: ``'local'``; ``{'name': 'local', 'window': 64}``; or the config form
    ``{'name': 'local', 'local': {'window': 64}, 'performer': {...}, ...}`` where every kernel keeps its options
    under its own name (so each is overridable from the command line) and only the chosen one's are used.
    Options set to None mean "the kernel's default".
    """
    if spec is None:
        return "dense", {}
    if isinstance(spec, str):
        return spec, {}
    options = dict(spec.to_dict() if hasattr(spec, "to_dict") else spec)
    name = options.pop("name", "dense")
    nested = options.pop(name, None) or {}
    options = {k: v for k, v in options.items() if not isinstance(v, Mapping)} | dict(nested)
    return name, {k: v for k, v in options.items() if v is not None}


def default_options(name: str) -> dict[str, Any]:
    """A kernel's options and their defaults, read from its constructor (the config schema is built from this)."""
    params = inspect.signature(KERNELS[name].__init__).parameters
    return {k: params[k].default for k in kernel_options(name)}


SCALARS = (bool, int, float, str)
INT32 = 2 ** 31  # an integer option passes to jit as int32 (x64 off): a value outside [-INT32, INT32) overflows


def option_type(name: str, option: str) -> type:
    """The type of a kernel option's value, from its constructor's annotation (``float | None`` -> float), so an
    option whose default is None takes that type from the command line; int where the annotation names none of
    bool, int, float, str (the shipped kernels' None defaults are all ints)."""
    annotation = inspect.signature(KERNELS[name].__init__).parameters[option].annotation
    words = str(getattr(annotation, "__name__", annotation)).replace("|", " ").replace(",", " ").split()
    found = [t for t in SCALARS if t.__name__ in words or f"typing.Optional[{t.__name__}]" in words]
    return found[0] if len(found) == 1 else int


def kernel_options(name: str) -> tuple[str, ...]:
    """The option names a kernel accepts (its keyword-only constructor arguments beyond the shared ones)."""
    shared = set(inspect.signature(AttentionKernel.__init__).parameters)
    params = inspect.signature(KERNELS[name].__init__).parameters
    return tuple(p for p, v in params.items() if p not in shared and p != "self"
                 and v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL))


# The keyword arguments every call passes a kernel (:meth:`AttentionKernel.__call__`).
CALL_KEYWORDS = ("mask", "is_causal", "dropout_rng", "dropout_rate", "broadcast_dropout", "deterministic",
                 "precision", "need_weights")


def check_call(name: str, where: str = "attention") -> None:
    """A kernel's ``__call__`` takes query, key and value and the keywords every call passes (or ``**kwargs``): a
    plugin's that does not is one line naming it, before a model is built (else a TypeError deep inside jit)."""
    cls = KERNELS[name]
    params = inspect.signature(cls.__call__).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        missing = []
    else:
        missing = [k for k in CALL_KEYWORDS if k not in {p.name for p in params if p.kind in (p.KEYWORD_ONLY,
                                                                                               p.POSITIONAL_OR_KEYWORD)}]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if missing or (len(positional) < 4 and not any(p.kind is p.VAR_POSITIONAL for p in params)):
        lacks = f"it lacks {', '.join(missing)}" if missing else "it lacks query, key, value"
        raise ValueError(f"{where}.name='{name}': {cls.__module__}.{cls.__qualname__}.__call__ must take (self, query, "
                         f"key, value, *, {', '.join(CALL_KEYWORDS)}), what every call passes, or **kwargs; {lacks}")


def validate_spec(spec: str | Mapping[str, Any] | None, where: str = "attention") -> tuple[str, dict[str, Any]]:
    """Checks a kernel name, its ``__call__`` and its option names without building anything; raises a one-line
    ValueError."""
    name, options = split_spec(spec)
    if name not in KERNELS:
        raise ValueError(f"unknown {where}.name '{name}'; registered kernels: {', '.join(sorted(KERNELS))}")
    check_call(name, where)
    allowed = kernel_options(name)
    for key in options:
        if key not in allowed:
            raise ValueError(f"unknown option {where}.{key} for attention '{name}'; "
                             f"it accepts: {', '.join(allowed) or 'no options'}")
        value = options[key]
        if isinstance(value, int) and not isinstance(value, bool) and not -INT32 <= value < INT32:
            raise ValueError(f"{where}.{key}={value}: out of range for attention '{name}'; an integer option must "
                             f"lie in [-2**31, 2**31) (it reaches jit as an int32)")
    return name, options


def build_kernel(spec: str | Mapping[str, Any] | None, **context: Any) -> AttentionKernel:
    """Builds the kernel named by ``spec`` with its options plus the shared context (heads, head_dim, rngs...)."""
    name, options = validate_spec(spec)
    return KERNELS[name](**context, **options)


def key_padding(mask: jax.Array | None, kernel: str) -> jax.Array | None:
    """``[batch, 1, 1, kv_len]`` mask -> ``[batch, kv_len]`` boolean key-padding vector (None stays None).

    Efficient kernels never form a ``[q_len, kv_len]`` matrix, so the only mask they accept is per key (padding);
    the models pass exactly that. Any other mask shape stops with one line naming the kernel.
    """
    if mask is None:
        return None
    if mask.ndim != 4 or mask.shape[1] != 1 or mask.shape[2] != 1:
        raise ValueError(f"attention '{kernel}' takes only key-padding masks [batch, 1, 1, kv_len], "
                         f"got mask shape {tuple(mask.shape)}")
    return mask[:, 0, 0, :].astype(bool)  # (B, S)
