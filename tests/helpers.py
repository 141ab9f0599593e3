"""Helpers shared by the test files: seeded random arrays and kernel builders and calls.

Import as ``from tests.helpers import ...``: pytest.ini's ``pythonpath = .`` puts the repository root on sys.path
for every import mode (prepend, append, importlib) and whether one file or the whole directory is collected, and
``tests`` resolves to this directory as a namespace package (no ``__init__.py``).

Two random sources are kept apart on purpose, since the same seed gives different numbers:

- ``jax_randn``: ``jax.random.normal(jax.random.key(seed), ...)``. Each new shape compiles a sampler (~1 s on a
  loaded CPU).
- ``np_randn``: ``numpy.random.default_rng(seed).standard_normal`` in float64, scaled, then cast once to ``dtype``
  (no compile per shape), as a jax array; ``np_randn_host`` is the same draw as a numpy array (float64 kept).
"""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn_lab.attention import build_kernel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository

# Keywords of a deterministic kernel call without dropout at the default precision.
CALL = dict(dropout_rng=None, dropout_rate=0.0, broadcast_dropout=True, precision=None, deterministic=True)


# --- random arrays -----------------------------------------------------------------------------------------------

def jax_randn(seed, shape, scale=1.0, dtype=jnp.float32):
    """``scale * N(0, 1)`` of ``shape`` from ``jax.random.key(seed)``."""
    x = jax.random.normal(jax.random.key(seed), shape, dtype)
    return x if scale == 1.0 else scale * x


def np_randn(seed, shape, scale=1.0, dtype=np.float32):
    """``scale * N(0, 1)`` of ``shape`` from ``numpy.random.default_rng(seed)``, drawn and scaled in float64 and
    cast to ``dtype`` once (bfloat16 included), as a jax array."""
    return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), dtype)


def np_randn_host(seed, shape, scale=1.0, dtype=np.float32):
    """``np_randn``'s draw as a numpy array (a float64 ``dtype`` stays float64)."""
    return np.asarray(scale * np.random.default_rng(seed).standard_normal(shape), dtype)


def seeded_qkv(seed, b, t, s, n, kv, h, scale=1.0, dtype=np.float32, rng="jax"):
    """``q [b, t, n, h]``, ``k, v [b, s, kv, h]`` from seeds ``seed, seed + 1, seed + 2``; ``scale`` applies to q
    and k only; ``rng``: "jax" (``jax_randn``) or "numpy" (``np_randn``)."""
    draw = {"jax": jax_randn, "numpy": np_randn}[rng]
    return (draw(seed, (b, t, n, h), scale, dtype), draw(seed + 1, (b, s, kv, h), scale, dtype),
            draw(seed + 2, (b, s, kv, h), 1.0, dtype))


def split_qkv(b, t, s, n, kv, h, seed=0, dtype=jnp.float32):
    """``q [b, t, n, h]``, ``k, v [b, s, kv, h]`` from the three keys of ``jax.random.split(key(seed), 3)``
    (other numbers than ``seeded_qkv``)."""
    keys = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(keys[0], (b, t, n, h), dtype), jax.random.normal(keys[1], (b, s, kv, h), dtype),
            jax.random.normal(keys[2], (b, s, kv, h), dtype))


# --- kernels -----------------------------------------------------------------------------------------------------

def make_kernel(spec, num_heads, num_kv_heads, head_dim, rng_seed=None, **context):
    """``build_kernel(spec, ...)`` with ``rngs=nnx.Rngs(rng_seed)`` unless ``rng_seed`` is None, and any further
    build ``context`` (``dtype``...); kernel options, a kernel's own ``seed`` included, belong in ``spec``."""
    if rng_seed is not None:
        context["rngs"] = nnx.Rngs(rng_seed)
    return build_kernel(spec, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, **context)


def call_kernel(kernel, q, k, v, mask=None, is_causal=False, need_weights=False, deterministic=True):
    """``(out, weights or None)`` of a kernel call with ``CALL``'s settings, never any dropout;
    ``deterministic=False`` takes a kernel's training-mode path (a performer's feature redraws)."""
    return kernel(q, k, v, mask=mask, is_causal=is_causal, need_weights=need_weights,
                  **{**CALL, "deterministic": deterministic})


# --- configs -------------------------------------------------------------------------------------------------------

def load_config(name, arg=""):
    """``configs/<name>.py``'s ``get_config(arg)``, loaded by path as ml_collections' config flags load it."""
    spec = importlib.util.spec_from_file_location(f"cfg_{name}", os.path.join(ROOT, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def tiny_numbers(data_dir, **train):
    """A numbers config that trains in seconds: 1 layer, d_model 32, 4 heads, 12 steps, dropout on (resume checks
    that dropout keys replay), evaluations and checkpoints at steps 6 and 12; ``train`` overrides ``config.train``."""
    c = load_config("numbers", "quick")
    c.task.data_dir, c.task.max_value = data_dir, 299
    c.model.num_layers, c.model.d_model, c.model.mlp_dim, c.model.num_heads = 1, 32, 64, 4
    c.model.dropout = 0.1
    c.train.update(dict(num_steps=12, batch_size=16, warmup_steps=4, log_every=2, eval_every=6,
                        checkpoint_every=6, max_eval_batches=2))
    c.train.update(train)
    return c


def tiny_numbers_flags(data_dir, **train) -> list[str]:
    """:func:`tiny_numbers` as the command line of ``python -m attn_lab.train`` (after ``--config``
    ``configs/numbers.py:quick``): the same run identity (tests/test_run_identity.py checks it)."""
    c = tiny_numbers(data_dir, **train)
    keys = {"task.data_dir": data_dir, "task.max_value": c.task.max_value, "model.num_layers": c.model.num_layers,
            "model.d_model": c.model.d_model, "model.mlp_dim": c.model.mlp_dim, "model.num_heads": c.model.num_heads,
            "model.dropout": c.model.dropout, **{f"train.{k}": c.train[k] for k in (
                "num_steps", "batch_size", "warmup_steps", "log_every", "eval_every", "checkpoint_every",
                "max_eval_batches")}}
    return [f"--config.{k}={v}" for k, v in keys.items()]

