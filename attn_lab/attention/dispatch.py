"""Which implementation an exact-attention call gets: cuDNN flash attention where it computes the same softmax,
XLA (or the kernel's own path) everywhere else.

cuDNN flash attention (``jax.nn.dot_product_attention(..., implementation='cudnn')``) never forms the ``[T, S]``
matrix and is several times faster than XLA's attention on a GPU, but it takes only part of what the kernels are
asked to compute. Its limits, read from jax 0.12 (``jax/_src/cudnn/fused_attention_stablehlo.py``:
``check_layout``, ``check_is_flash_attention``; ``jax/_src/nn/functions.py``: ``dot_product_attention``):

- a CUDA GPU with cuDNN (elsewhere jax raises "cuDNN is not detected");
- bfloat16 or float16 inputs (float32 raises; fp8 is a separate API);
- head_dim a multiple of 8, at most 128 (256 on Hopper and later, compute capability >= 9.0);
- grouped-query heads (num_kv_heads dividing num_heads) are accepted;
- masks only in three forms: causal (top-left aligned, as XLA's), key/query *sequence lengths* (valid keys are a
  prefix ``j < length[b]``), and a left-only sliding window: ``local_window_size=(left, right)`` is taken only
  under the causal mask or with ``right == 0`` and becomes ``sliding_window_length = left + 1``, i.e. query i
  sees keys ``i - left <= j <= i``. A general boolean mask becomes a ``[B, N, T, S]`` additive bias (the memory
  flash attention exists to avoid), so general masks go to XLA.

The kernels get their masks as boolean arrays (``registry.key_padding``). A traced key-padding vector cannot be
shown to be a suffix at trace time, so :func:`cudnn_attention` never assumes it is: without a causal mask or a
window the keys are reordered (stably) so the valid ones come first, which changes nothing in a softmax over keys
and makes the sequence-length form exact for *any* padding pattern. With a causal mask or a window, key order is
position, so key padding there goes to the fallback. Rows whose keys are all masked get the mean of the values,
as the XLA path's softmax over equal logits does.

The decision is one pure function, :func:`cudnn_refusal`, so its table is tested on a CPU by naming the backend;
:func:`choose` turns it and the requested option into a path; :func:`describe_dispatch` states, in one line, what
every attention kind of a built model gets. The sparse patterns' fused block-sparse kernel (:mod:`.flash`) has the
same two halves, :func:`fused_refusal` and :func:`choose_fused`: it compiles for a CUDA GPU only.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn_lab.attention.module import MultiHeadAttention
from attn_lab.attention.tiles import fused_plan

CUDNN_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))
MASK_KINDS = ("none", "key_padding", "general")

# How a model calls an attention kind when it does not say (a module outside any registered model): key padding.
DEFAULT_CALL = {"mask": "key_padding", "is_causal": False}


def mask_kind(mask: jax.Array | None) -> str:
    """'none', 'key_padding' (shape ``[B|1, 1, 1, S]``: one flag per key) or 'general' (anything else)."""
    if mask is None:
        return "none"
    return "key_padding" if mask.ndim == 4 and mask.shape[1] == 1 and mask.shape[2] == 1 else "general"


def cudnn_refusal(backend: str, dtype: Any, head_dim: int, mask: str = "none", *, is_causal: bool = False,
                  window: tuple[int, int] | None = None, q_len: int | None = None, kv_len: int | None = None,
                  max_head_dim: int = 128) -> str | None:
    """Why cuDNN flash attention cannot compute this call exactly, or None when it can (pure: tested on a CPU).

    Args:
      backend: 'gpu' for a CUDA GPU (see :func:`current_backend`), else 'cpu', 'tpu', 'rocm'...
      dtype: the computation dtype of query/key/value.
      head_dim: per-head size H.
      mask: one of ``MASK_KINDS`` (see :func:`mask_kind`).
      is_causal: the call overlays a causal mask.
      window: ``(left, right)`` band (``jax.nn.dot_product_attention``'s ``local_window_size``) or None.
      q_len, kv_len: sequence lengths when known (None: describing a model before any call).
      max_head_dim: the device's head_dim limit (:func:`cudnn_head_dim_limit`).

    Returns:
      None, or a short reason naming the first constraint the call breaks.
    """
    if mask not in MASK_KINDS:
        raise ValueError(f"mask kind must be one of {MASK_KINDS}, got {mask!r}")
    dtype = np.dtype(dtype)
    rules = (
        (backend != "gpu", f"backend {backend} (cuDNN needs a CUDA GPU)"),
        (dtype not in CUDNN_DTYPES, f"dtype {dtype.name} (cuDNN takes bfloat16 or float16)"),
        (head_dim % 8 != 0 or head_dim > max_head_dim,
         f"head_dim {head_dim} (cuDNN takes multiples of 8 up to {max_head_dim})"),
        (mask == "general", "a general [q_len, kv_len] mask (cuDNN takes causal, key padding and left windows)"),
        (mask == "key_padding" and (is_causal or window is not None),
         "key padding under a causal or windowed mask (exact only for a padding suffix, which a traced mask "
         "cannot show)"),
        (window is not None and not is_causal, "a two-sided window (cuDNN's sliding window is left-only)"),
        (q_len is not None and q_len < 2, "a single query (a KV-cache decode step)"),
        (is_causal and q_len != kv_len, f"causal attention with q_len {q_len} != kv_len {kv_len}"),
    )
    return next((why for broken, why in rules if broken), None)


def choose(implementation: str, *, fallback: str, needs_matrix: bool, refusal: str | None,
           allowed: tuple[str, ...]) -> str:
    """The path one call takes: 'explicit' (the materialized softmax), 'cudnn', ``fallback`` or the one asked for.

    Capture and attention dropout need the ``[B, N, T, S]`` matrix, so they take the explicit path whatever was
    asked. 'auto' takes cuDNN when nothing refuses it, else ``fallback``. An explicit 'cudnn' that cannot run
    raises one line instead of falling back silently: a benchmark or a run that asked for cuDNN must get it.
    """
    if needs_matrix:
        return "explicit"
    if implementation == "cudnn" and refusal is not None:
        others = ", ".join(repr(a) for a in allowed if a != "cudnn")
        raise ValueError(f"attention.implementation='cudnn' cannot run here: {refusal}; choose one of {others} "
                         f"('auto' = cuDNN where it applies, else '{fallback}')")
    if implementation == "auto":
        return fallback if refusal is not None else "cudnn"
    return implementation


FUSED = ("fused", "fused_interpret")  # the block-sparse Pallas kernel: compiled (CUDA GPU) or interpreted (any)
# Whether 'auto' sends a CUDA GPU to the fused kernel. False until the device check (scripts/fused_check.py, run by
# scripts/device_check.sh) has compiled and timed it on a GPU and its figures are in docs/gpu_h200.md: a path
# becomes a default only after it ran where it runs. Until then 'auto' keeps the tested XLA path and
# implementation='fused' opts in.
FUSED_BY_DEFAULT = False


def fused_refusal(backend: str) -> str | None:
    """Why the compiled fused kernel cannot run on ``backend``, or None (pure: tested on a CPU)."""
    if backend == "gpu":
        return None
    return f"backend {backend} (the fused kernel compiles for CUDA GPUs through Pallas' Triton backend)"


def choose_fused(implementation: str, *, fallback: str, needs_matrix: bool, backend: str,
                 allowed: tuple[str, ...]) -> str:
    """The path of a kernel with a fused Pallas path: 'explicit', 'fused', 'fused_interpret' or ``fallback``.

    'auto' takes ``fallback`` (and 'fused' on a CUDA GPU only once :data:`FUSED_BY_DEFAULT` is set); an explicit
    'fused' where it cannot compile raises one line (never a silent fallback); 'fused_interpret' runs the same
    kernel as jax operations anywhere.
    """
    if needs_matrix:
        return "explicit"
    refusal = fused_refusal(backend)
    if implementation == "fused" and refusal is not None:
        others = ", ".join(repr(a) for a in allowed if a != "fused")
        raise ValueError(f"attention.implementation='fused' cannot run here: {refusal}; choose one of {others} "
                         f"('auto' = '{fallback}' until the fused kernel has passed a GPU check; 'fused_interpret' "
                         f"runs the same kernel as jax operations, slowly: for tests)")
    if implementation == "auto":
        return "fused" if FUSED_BY_DEFAULT and refusal is None else fallback
    return implementation


def check_fused_option(implementation: str, *, allowed: tuple[str, ...], fallback: str) -> None:
    """Construction-time half of :func:`choose_fused`: an explicit 'fused' off a CUDA GPU stops when the kernel is
    built, not at the first call."""
    choose_fused(implementation, fallback=fallback, needs_matrix=False, backend=current_backend(), allowed=allowed)


def current_backend() -> str:
    """jax's default backend ('cpu', 'gpu', 'tpu'), except that a ROCm GPU is 'rocm': cuDNN is NVIDIA's.

    Read at trace time: a computation placed on another backend than the default one is not seen here.
    """
    backend = jax.default_backend()
    version = getattr(getattr(jax.devices()[0], "client", None), "platform_version", "") if backend == "gpu" else ""
    return "rocm" if "rocm" in str(version).lower() else backend


def cudnn_head_dim_limit() -> int:
    """The largest head_dim cuDNN flash attention takes here: 256 on Hopper and later, else 128 (as jax checks)."""
    capability = getattr(jax.devices()[0], "compute_capability", None)
    return 256 if capability and tuple(int(x) for x in str(capability).split(".")) >= (9, 0) else 128


def call_facts(query: jax.Array, key: jax.Array, mask: jax.Array | None, is_causal: bool) -> dict[str, Any]:
    """The static facts of one kernel call that :func:`cudnn_refusal` decides on (backend read here)."""
    return dict(backend=current_backend(), dtype=query.dtype, mask=mask_kind(mask), is_causal=is_causal,
                q_len=query.shape[1], kv_len=key.shape[1], max_head_dim=cudnn_head_dim_limit())


def check_cudnn_option(implementation: str, *, head_dim: int, dtype: Any = None,
                       allowed: tuple[str, ...], fallback: str) -> None:
    """Construction-time half of the rule in :func:`choose`: an explicit 'cudnn' that cannot run on this backend,
    at this head_dim or in an explicitly given dtype stops when the kernel is built, not at the first call."""
    if implementation != "cudnn":
        return
    backend = current_backend()
    refusal = cudnn_refusal(backend, jnp.bfloat16 if dtype is None else dtype, head_dim,
                            max_head_dim=cudnn_head_dim_limit() if backend == "gpu" else 128)
    choose(implementation, fallback=fallback, needs_matrix=False, refusal=refusal, allowed=allowed)


def _sorted_keys(key: jax.Array, value: jax.Array, key_valid: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Keys and values reordered so each row's valid keys come first (stably), and the number of valid keys.

    Exact for attention without position-dependent masks: the softmax over keys does not depend on their order.
    """
    order = jnp.argsort(jnp.logical_not(key_valid).astype(jnp.int8), axis=1, stable=True)  # (B, S)
    key = jnp.take_along_axis(key, order[:, :, None, None], axis=1)  # (B, S, K, H)
    value = jnp.take_along_axis(value, order[:, :, None, None], axis=1)  # (B, S, K, H)
    return key, value, key_valid.sum(axis=1).astype(jnp.int32)  # (B,)


def cudnn_attention(query: jax.Array, key: jax.Array, value: jax.Array, *, key_valid: jax.Array | None = None,
                    is_causal: bool = False, window: tuple[int, int] | None = None,
                    implementation: str = "cudnn") -> jax.Array:
    """Softmax attention through ``jax.nn.dot_product_attention`` with masks in the forms cuDNN takes.

    Args:
      query: ``[B, T, N, H]``; key, value: ``[B, S, K, H]`` (K divides N).
      key_valid: ``[B|1, S]`` key-padding vector (False masks a key out), any pattern; only without
        ``is_causal``/``window`` (see :func:`cudnn_refusal`).
      is_causal: query i sees keys j <= i.
      window: ``(left, right)`` band, query i sees ``i - left <= j <= i + right``; with cuDNN only under
        ``is_causal`` (then right is irrelevant).
      implementation: 'cudnn'; 'xla' runs the same mapping through XLA, which is how the mapping is tested on a CPU.

    Returns:
      ``[B, T, N, H]``; a query with no valid key gets the mean of all values (as the XLA path).
    """
    if window is not None and not is_causal and implementation == "cudnn":  # cuDNN would attend to the future
        raise ValueError(f"cudnn_attention: window {window} without is_causal: cuDNN's window is left-only and "
                         f"without the causal mask it attends to every later key")
    if key_valid is None:
        return jax.nn.dot_product_attention(query, key, value, is_causal=is_causal, local_window_size=window,
                                            implementation=implementation)
    if is_causal or window is not None:
        raise ValueError("cudnn_attention: key padding is exact only without a causal mask or window")
    b, t, n, h = query.shape
    key_valid = jnp.broadcast_to(jnp.asarray(key_valid, bool), (b, key.shape[1]))  # (B, S)
    key, value, lengths = _sorted_keys(key, value, key_valid)  # (B, S, K, H) x2, (B,)
    out = jax.nn.dot_product_attention(query, key, value, key_value_seq_lengths=jnp.maximum(lengths, 1),
                                       implementation=implementation)  # (B, T, N, H)
    mean = value.astype(jnp.float32).mean(axis=1).astype(out.dtype)  # (B, K, H)
    mean = jnp.repeat(mean, n // key.shape[2], axis=1)[:, None]  # (B, 1, N, H); head n reads kv head n // G
    return jnp.where((lengths == 0)[:, None, None, None], mean, out)  # (B, T, N, H)


def _module_at(root: Any, path: tuple) -> Any:
    """``root.<path>``: attributes for names, indexing for ints (a site's path, read as ``models.sites.resolve``)."""
    for part in path:
        root = root[part] if isinstance(part, int) else getattr(root, part)
    return root


def _attention_modules(model: nnx.Module) -> list[tuple[str, Any, dict[str, Any]]]:
    """``(kind, MultiHeadAttention, how it is called)`` for a registered model's attention sites (its ``ATTENTION``
    declares each kind's mask and causality); any other module reports each attention under its path."""
    if hasattr(model, "sites"):  # read by duck type: attention sits below models and never imports them
        specs = type(model).ATTENTION
        return [(site.kind, _module_at(model, site.path), {"mask": specs[site.kind].mask,
                                                           "is_causal": specs[site.kind].causal})
                for site in model.sites()]
    return [(".".join(map(str, path)) or "attention", node, DEFAULT_CALL) for path, node in nnx.iter_graph(model)
            if isinstance(node, MultiHeadAttention)]


def _kind_label(attn: Any, call: dict[str, Any], backend: str, max_head_dim: int) -> str:
    """``'dense/cudnn'``, ``'local/blockwise'``, ``'dense/explicit(train)+xla(eval)'`` or a kernel's bare name."""
    kernel = attn.kernel
    dispatch = getattr(kernel, "dispatch", None)
    if dispatch is None:
        return kernel.name
    dtype = attn.dtype if attn.dtype is not None else attn.param_dtype
    facts = dict(backend=backend, dtype=dtype, max_head_dim=max_head_dim, **call)
    try:
        evaluation = dispatch(**facts)
    except ValueError as e:  # an explicit 'cudnn' this call would refuse
        return f"{kernel.name}/error({e})"
    if evaluation in FUSED:
        evaluation += fused_note(kernel, attn.head_dim, dtype)
    if attn.dropout_rate > 0.0:
        return f"{kernel.name}/explicit(train)+{evaluation}(eval)"
    return f"{kernel.name}/{evaluation}"


def fused_note(kernel: Any, head_dim: int, dtype: Any) -> str:
    """``'[block 128, head dim 128 bfloat16: forward 64x2 (128x2: 256 KiB), ...]'``: which tile x stages each
    fused kernel runs and why (:func:`attn_lab.attention.tiles.fused_tile`), or the rule's refusal."""
    tile = getattr(kernel, "fused_block_size", None) or kernel.default_fused_block()
    try:
        return f"[{fused_plan(tile, head_dim, dtype).why}]"
    except ValueError as e:
        return f"[error: {e}]"


def describe_dispatch(model: nnx.Module, *, backend: str | None = None) -> str:
    """One line saying which implementation each attention kind of ``model`` gets, e.g.
    ``'attention: encoder_self=dense/cudnn, decoder_self=dense/cudnn, cross=dense/cudnn (backend gpu)'``.

    Decided from each module's kernel options, dtype, head_dim, attention dropout and how the model calls that kind
    (its ``ATTENTION`` declaration, :mod:`attn_lab.models.sites`), exactly as the kernels decide at trace time.
    Capture (``sow_weights``) always takes the explicit softmax and is not listed. Layers of one kind that differ
    are joined with '|'.

    Args:
      model: a built model (or any module holding ``MultiHeadAttention`` modules).
      backend: override of :func:`current_backend` (e.g. 'gpu' to see what a GPU run would get).
    """
    backend = backend or current_backend()
    max_head_dim = cudnn_head_dim_limit() if backend == "gpu" and current_backend() == "gpu" else 128
    labels: dict[str, list[str]] = {}
    for kind, attn, call in _attention_modules(model):
        label = _kind_label(attn, call, backend, max_head_dim)
        if label not in labels.setdefault(kind, []):
            labels[kind].append(label)
    body = ", ".join(f"{kind}={'|'.join(found)}" for kind, found in labels.items()) or "none"  # in site order
    return f"attention: {body} (backend {backend})"
