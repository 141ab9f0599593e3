"""Exactness of the efficient kernels against dense references: chunked dense (Rabe & Staats) and local windows.

Float32 comparisons run under 'highest' matmul precision (tests/conftest.py), so their tight tolerances hold on a
GPU too, where float32 matmuls default to TF32.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.attention import MultiHeadAttention, build_kernel
from attn_lab.attention.dense import apply_weights, attention_weights, chunked_attention
from attn_lab.attention.local import local_attention
from tests.helpers import call_kernel, make_kernel, split_qkv

B, T, S, N, H = 2, 11, 6, 4, 8


def _qkv(t, s, num_kv_heads, seed=0):
    return split_qkv(B, t, s, N, num_kv_heads, H, seed)


def _valid(s, padded=2):
    return jnp.arange(s)[None, :] < jnp.array([[s], [s - padded]])  # (B, S); batch 1 has padded keys


def _kernel_call(spec, num_kv_heads, q, k, v, mask=None, is_causal=False, need_weights=False):
    return call_kernel(make_kernel(spec, N, num_kv_heads, H), q, k, v, mask, is_causal, need_weights)


def _value_and_grads(fn, args):
    """``fn(*args)`` and the gradient of a fixed random projection of it wrt every argument, in one compiled call."""
    ct = jax.random.normal(jax.random.key(9), jax.eval_shape(fn, *args).shape)

    @jax.jit
    def run(*a):
        out, vjp = jax.vjp(fn, *a)
        return out, vjp(ct)
    return run(*args)


def _assert_same_value_and_grads(f, g, args, atol=1e-5):
    """f and g agree in value and in their gradients wrt every argument; returns f's ``(out, grads)``."""
    ours = _value_and_grads(f, args)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=atol), ours, _value_and_grads(g, args))
    return ours


# --- dense, implementation='chunked' -------------------------------------------------------------------------------

CHUNKED_CASES = {  # name: (kv_len, num_kv_heads, key padding, is_causal)
    "bidirectional": (T, N, False, False),
    "padding_cross": (S, N, True, False),
    "causal_grouped_query": (T, 2, False, True),
    "causal_padding_multi_query": (T, 1, True, True),
}


@pytest.mark.parametrize("case,chunk", [(case, 3) for case in sorted(CHUNKED_CASES)]
                         + [("causal_padding_multi_query", c) for c in (1, 8, T + 5)])
def test_chunked_equals_xla_values_and_grads(case, chunk):
    """Every case with several blocks of a non-dividing size; the hardest case at every kind of chunk size
    (chunk_size >= T is capped to one block of T, so T + 5 also covers chunk_size == T)."""
    s, num_kv, padded, causal = CHUNKED_CASES[case]
    mask = _valid(s)[:, None, None, :] if padded else None  # (B, 1, 1, S)
    ref = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=causal)
    ours = lambda q, k, v: _kernel_call({"name": "dense", "implementation": "chunked", "chunk_size": chunk},
                                        num_kv, q, k, v, mask=mask, is_causal=causal)[0]
    _assert_same_value_and_grads(ours, ref, _qkv(T, s, num_kv))


def test_chunked_fully_masked_rows_are_finite_and_match_xla():
    q, k, v = _qkv(T, T, 2)
    valid = jnp.ones((B, T), bool).at[1].set(False)  # batch 1: every key masked
    f = lambda q, k, v: chunked_attention(q, k, v, key_valid=valid, is_causal=True, chunk_size=4)
    g = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=valid[:, None, None, :], is_causal=True)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(_assert_same_value_and_grads(f, g, (q, k, v))))


def test_chunked_weights_and_decode_mask_fall_back_or_pass():
    q, k, v = _qkv(T, T, 2)
    spec = {"name": "dense", "implementation": "chunked", "chunk_size": 4}
    out, weights = jax.jit(lambda q, k, v: _kernel_call(spec, 2, q, k, v, is_causal=True, need_weights=True))(q, k, v)
    np.testing.assert_allclose(out, apply_weights(weights, v), atol=1e-6)
    written = jnp.broadcast_to(jnp.arange(T) <= 5, (B, 1, 1, T))  # a KV-cache step: 1 query, 6 written slots
    out, _ = jax.jit(lambda q, k, v: _kernel_call(spec, 2, q, k, v, mask=written))(q[:, 5:6], k, v)
    np.testing.assert_allclose(out, jax.nn.dot_product_attention(q[:, 5:6], k, v, mask=written), atol=1e-5)


def test_chunked_memory_is_a_fraction_of_xla():
    """Forward + backward at T=4096: XLA's temp buffers for the chunked path stay under 1/4 of the dense ones."""
    shape = jax.ShapeDtypeStruct((1, 4096, 2, 32), jnp.float32)

    def temp_bytes(attend):
        grad = jax.grad(lambda q, k, v: attend(q, k, v).sum(), argnums=(0, 1, 2))
        return jax.jit(grad).lower(shape, shape, shape).compile().memory_analysis().temp_size_in_bytes

    dense = temp_bytes(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True))
    chunked = temp_bytes(lambda q, k, v: chunked_attention(q, k, v, is_causal=True, chunk_size=512))
    print(f"temp bytes: chunked {chunked}, xla {dense}, ratio {chunked / dense:.4f}")
    assert chunked < dense / 4


# --- local ---------------------------------------------------------------------------------------------------------

def _band(t, window, causal):
    offset = jnp.arange(t)[:, None] - jnp.arange(t)[None, :]  # (T, T): query - key
    return (offset >= 0) & (offset < window) if causal else jnp.abs(offset) <= window // 2


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [2 * T, 2 * T + 3])
def test_local_with_wide_window_equals_dense(window, causal):
    mask = _valid(T)[:, None, None, :]  # (B, 1, 1, T); no query loses all its keys
    ours = lambda q, k, v: _kernel_call({"name": "local", "window": window}, 2, q, k, v, mask=mask,
                                        is_causal=causal)[0]
    ref = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=causal)
    _assert_same_value_and_grads(ours, ref, _qkv(T, T, 2))


@pytest.mark.parametrize("window,num_kv,causal", [(5, 4, False), (3, 2, True), (4, 1, True), (7, 2, False)])
def test_local_small_window_equals_banded_dense(window, num_kv, causal):
    """T = 11 is a multiple of no window here, so the last block is padded."""
    valid = _valid(T)  # 2 padded keys < window: every query keeps a visible key
    keep = _band(T, window, causal)[None, None] & valid[:, None, None, :]  # (B, 1, T, T)
    ours = lambda q, k, v: local_attention(q, k, v, window=window, is_causal=causal, key_valid=valid)
    ref = lambda q, k, v: apply_weights(attention_weights(q, k, mask=keep), v)
    q, k, v = _qkv(T, T, num_kv)
    blockwise, _ = _assert_same_value_and_grads(ours, ref, (q, k, v))
    out, weights = jax.jit(lambda q, k, v: _kernel_call({"name": "local", "window": window}, num_kv, q, k, v,
                                                        mask=valid[:, None, None, :], is_causal=causal,
                                                        need_weights=True))(q, k, v)
    np.testing.assert_allclose(weights, attention_weights(q, k, mask=keep), atol=1e-6)
    np.testing.assert_allclose(out, apply_weights(weights, v), atol=1e-6)
    np.testing.assert_allclose(out, blockwise, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_local_dependencies_are_exactly_the_band(causal):
    """Output i depends on key/value j exactly when j is in i's window (so causal attention cannot leak)."""
    window, (q, k, v) = 3, _qkv(T, T, 2)
    jac = jax.jit(jax.jacfwd(lambda k, v: local_attention(q, k, v, window=window, is_causal=causal),
                             argnums=(0, 1)))(k, v)
    dep = sum(np.abs(np.asarray(j)).sum(axis=(0, 2, 3, 4, 6, 7)) for j in jac)  # (T_out, T_in)
    np.testing.assert_array_equal(dep > 0, np.asarray(_band(T, window, causal)))


def test_local_fully_masked_rows_are_finite():
    q, k, v = _qkv(T, T, 2)
    valid = jnp.ones((B, T), bool).at[1, 3:6].set(False)  # batch 1: queries 4 and 5 see nothing (causal, w=2)
    loss = lambda q, k, v: (local_attention(q, k, v, window=2, is_causal=True, key_valid=valid) ** 2).sum()
    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)
    assert np.isfinite(value) and all(np.isfinite(g).all() for g in grads)


def test_local_in_module_under_jit_and_its_limits():
    m = MultiHeadAttention(4, 16, num_kv_heads=2, attention={"name": "local", "window": 4}, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (B, 10, 16))
    mask = _valid(10)[:, None, None, :]
    step = nnx.jit(lambda m, x: m(x, mask=mask, is_causal=True))
    assert step(m, x).shape == (B, 10, 16) and np.isfinite(step(m, x)).all()
    with pytest.raises(ValueError, match="cross-attention"):
        m(x, x[:, :5])
    with pytest.raises(ValueError, match="KV-cache decoding"):
        m(x[:, :1], decode=True)
    with pytest.raises(ValueError, match="dropout"):
        MultiHeadAttention(4, 16, attention={"name": "local"}, dropout_rate=0.1, rngs=nnx.Rngs(0))


def test_option_errors_are_one_line():
    for spec, match in [({"name": "dense", "chunk_size": 0}, "chunk_size"),
                        ({"name": "dense", "implementation": "flash"}, "implementation"),
                        ({"name": "local", "window": 0}, "window")]:
        with pytest.raises(ValueError, match=match):
            build_kernel(spec, num_heads=N, num_kv_heads=N, head_dim=H)
    q, k, v = _qkv(T, T, N)
    with pytest.raises(ValueError, match="key-padding"):
        _kernel_call({"name": "dense", "implementation": "chunked"}, N, q, k, v, mask=jnp.ones((B, 1, T, T), bool))
