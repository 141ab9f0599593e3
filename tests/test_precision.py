"""Matmul precision: the suite's 'highest' (tests/conftest.py) reaches jitted code, the library sets no precision of
its own, and at the backend's default precision (``default_precision`` tests) attention and the model are right to
within a tolerance derived from the dtype, one a GPU (TF32) or a TPU (bf16 passes) meets.

On a CPU the default is exact; ``ATTN_LAB_EMULATE_MATMUL=bf16`` checks these tolerances as a TPU would see them.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.attention import KERNELS, MultiHeadAttention
from attn_lab.models import build_model
from attn_lab.train.config import base_config
from tests.helpers import jax_randn

# A default-precision float32 matmul rounds its operands to no fewer than bf16's 8 significant bits on any backend
# (TF32 keeps 11 on a GPU), and bf16 computation rounds to the same; errors stay within a few of these.
EPS = float(jnp.finfo(jnp.bfloat16).eps)  # 2**-7
TOL = 4 * EPS  # measured under bf16 emulation: <= 2.8 EPS (performer's exponential features), <= 0.7 EPS otherwise

default_precision = pytest.mark.default_precision


def _rel_err(got, ref) -> float:
    """max |got - ref| / max |ref| over all leaves: errors relative to the scale of the result (a gradient that is
    zero in exact arithmetic, such as the key bias's, is noise at any precision)."""
    got, ref = jax.tree.leaves(got), jax.tree.leaves(ref)
    diff = max(float(np.abs(np.asarray(g, np.float64) - np.asarray(r, np.float64)).max()) for g, r in zip(got, ref))
    return diff / max(float(np.abs(np.asarray(r, np.float64)).max()) for r in ref)


# --- the fixture reaches compiled code; the library sets nothing ----------------------------------------------------

def test_jit_cache_is_keyed_on_matmul_precision():
    """A function jitted at the default precision is retraced under 'highest', not served from the cache."""
    f = jax.jit(lambda a: a @ a)
    a = jnp.ones((4, 4))
    with jax.default_matmul_precision(None):
        f(a)
    f(a)
    assert f._cache_size() == 2


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("expected", ["HIGHEST", pytest.param("DEFAULT", marks=default_precision)])
def test_every_matmul_of_a_jitted_kernel_gets_the_suite_precision(name, expected):
    """Forward and backward of every kernel inside the module: all dots carry the fixture's precision, so the
    exactness tests compare what they claim to, and at the default none is HIGHEST, so the library sets none."""
    m = MultiHeadAttention(4, 32, attention=name, decode=False, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(m)
    causal = m.kernel.supports_causal
    loss = lambda s, x: (nnx.merge(graphdef, s)(x, is_causal=causal) ** 2).mean()
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(state, jax_randn(0, (2, 16, 32))).as_text()
    found = set(re.findall(r"precision = \[(\w+), (\w+)\]", text))
    assert found == {(expected, expected)}


# --- the default-precision path: right to within the dtype's tolerance ----------------------------------------------

B, T, N, H = 2, 16, 2, 64  # head_dim 64: a shape cuDNN flash attention takes on a GPU
D = N * H
VALID = jnp.arange(T)[None, :] < jnp.array([[T], [T - 5]])  # (B, T): batch 1 has 5 padded keys


def _float64_reference(m, x, mask):
    """The module's formula in float64 numpy, from its own parameters: no JAX matmul on the reference side."""
    p = {name: {k: np.asarray(v[...], np.float64) for k, v in nnx.to_flat_state(nnx.state(getattr(m, name)))}
         for name in ("query", "key", "value", "out")}
    x = np.asarray(x, np.float64)
    q, k, v = (np.einsum("btd,dnh->btnh", x, p[n][("kernel",)]) + p[n][("bias",)] for n in ("query", "key", "value"))
    logits = np.where(mask, np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(H), -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    heads = np.einsum("bnts,bsnh->btnh", w / w.sum(-1, keepdims=True), v)
    return np.einsum("btnh,nhd->btd", heads, p["out"][("kernel",)]) + p["out"][("bias",)]


@default_precision
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("masks", ["causal", "key_padding", "causal_key_padding"])
def test_default_precision_attention_matches_float64(dtype, masks):
    """The module as users run it (default precision, the backend's default exact-attention implementation:
    cuDNN flash attention for bf16 on a GPU where it applies) against a float64 reference."""
    m = MultiHeadAttention(N, D, decode=False, dtype=dtype, rngs=nnx.Rngs(0))
    x = jax_randn(1, (B, T, D))
    causal = "causal" in masks
    key_mask = VALID[:, None, None, :] if "key_padding" in masks else None
    got = jax.jit(lambda x: m(x.astype(dtype), mask=key_mask, is_causal=causal))(x)
    assert got.dtype == dtype
    full = np.broadcast_to(np.tril(np.ones((T, T), bool)) if causal else True, (B, N, T, T))
    mask = full & (np.asarray(key_mask) if key_mask is not None else True)
    ref = _float64_reference(m, x, mask)
    rows = np.asarray(VALID) if key_mask is not None else np.ones((B, T), bool)  # padded queries are unspecified
    assert _rel_err(np.asarray(got, np.float64)[rows], ref[rows]) < TOL


@default_precision
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_default_precision_kernels_track_highest(name):
    """Every kernel's output and gradients at the default precision stay within the dtype's tolerance of the same
    computation at 'highest': none relies on exact float32 matmuls (hashing, cancellation, masks built by matmul)."""
    m = MultiHeadAttention(4, 32, attention=name, decode=False, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(m)
    x = jax_randn(1, (2, 16, 32))
    mask = jnp.broadcast_to(jnp.arange(16) < 13, (2, 1, 1, 16))
    causal = m.kernel.supports_causal

    def run(s, x):
        out, vjp = jax.vjp(lambda s, x: nnx.merge(graphdef, s)(x, mask=mask, is_causal=causal), s, x)
        return out, vjp(jnp.ones_like(out))
    got = jax.jit(run)(state, x)
    with jax.default_matmul_precision("highest"):
        ref = jax.jit(run)(state, x)
    assert _rel_err(got[0], ref[0]) < TOL, "output"
    assert _rel_err(got[1][1], ref[1][1]) < TOL, "input gradient"
    assert _rel_err(got[1][0], ref[1][0]) < TOL, "parameter gradients"


@default_precision
def test_default_precision_model_loss_and_gradients_track_highest():
    """A translation model's loss and parameter gradients at the default precision against 'highest'."""
    cfg = base_config().model
    cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.mlp_dim, cfg.dropout = 1, 64, 4, 128, 0.0
    m = build_model(cfg, kind="translation", vocab_size=13, max_len=16)
    graphdef, state = nnx.split(m)
    inputs = jax.random.randint(jax.random.key(0), (2, 9), 3, 13).at[1, 6:].set(0)
    targets = jax.random.randint(jax.random.key(1), (2, 7), 3, 13)

    def loss(s):
        logits = nnx.merge(graphdef, s)(inputs, targets)
        return -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1).mean()
    got = jax.jit(jax.value_and_grad(loss))(state)
    with jax.default_matmul_precision("highest"):
        ref = jax.jit(jax.value_and_grad(loss))(state)
    assert _rel_err(got[0], ref[0]) < TOL and _rel_err(got[1], ref[1]) < TOL
