"""Kernelized attention (linear, performer) against direct O(T^2) references and exact softmax attention.

Float32 comparisons run under 'highest' matmul precision (tests/conftest.py), so their tight tolerances hold on a
GPU too, where float32 matmuls default to TF32.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.attention import MultiHeadAttention
from attn_lab.attention.dense import apply_weights
from tests.helpers import call_kernel, jax_randn, make_kernel, seeded_qkv

B, N, K, H = 2, 4, 2, 4  # grouped-query: 2 query heads per key/value head


def _qkv(t, s, seed=0, num_heads=N, num_kv_heads=K, head_dim=H, scale=1.0):
    return seeded_qkv(seed, B, t, s, num_heads, num_kv_heads, head_dim, scale)


def _padding(s):
    valid = jnp.arange(s)[None, :] < jnp.array([[s], [s - 3]])  # (B, S)
    return valid[:, None, None, :]  # (B, 1, 1, S)


def _kernel(name, num_heads=N, num_kv_heads=K, head_dim=H, seed=0, **options):
    return make_kernel({"name": name, **options}, num_heads, num_kv_heads, head_dim, rng_seed=seed)


# one compile per kernel structure and shapes; state updates (redraws) propagate back to the kernel
_attend = nnx.jit(call_kernel, static_argnames=("is_causal", "need_weights", "deterministic"))


def _reference(q_feat, k_feat, v, mask, is_causal):
    """Direct quadratic form: normalized ``phi(q) phi(k)^T`` (padding and causal applied) times V, per head."""
    g = q_feat.shape[2] // k_feat.shape[2]
    k_feat, v = jnp.repeat(k_feat, g, axis=2), jnp.repeat(v, g, axis=2)  # (B, S, N, .)
    a = jnp.einsum("btnf,bsnf->bnts", q_feat, k_feat)  # (B, N, T, S)
    keep = jnp.ones(a.shape[-2:], bool) if mask is None else mask[:, :, 0, :][:, :, None, :]
    if is_causal:
        keep = keep & jnp.tril(jnp.ones(a.shape[-2:], bool))
    a = jnp.where(keep, a, 0.0)
    return jnp.einsum("bnts,bsnh->btnh", a / a.sum(-1, keepdims=True), v)


def _mae(a, b):
    return float(jnp.mean(jnp.abs(a - b)))


# --- linear ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("is_causal", [False, True])
def test_linear_matches_quadratic_reference_and_its_weights(is_causal):
    t = 9
    q, k, v = _qkv(t, t)
    mask = _padding(t)
    out, w = _attend(_kernel("linear", chunk_size=4), q, k, v, mask, is_causal, need_weights=True)
    phi = lambda x: jax.nn.elu(x) + 1.0
    np.testing.assert_allclose(out, _reference(phi(q), phi(k), v, mask, is_causal), atol=1e-5)
    np.testing.assert_allclose(apply_weights(w, v), out, atol=1e-5)
    assert w.shape == (B, N, t, t) and np.allclose(w[1, :, :, t - 3:], 0.0)
    if is_causal:
        assert np.allclose(jnp.triu(w, k=1), 0.0)


def test_linear_cross_attention_shapes():
    q, k, v = _qkv(5, 8)
    out, _ = _attend(_kernel("linear"), q, k, v, _padding(8))
    phi = lambda x: jax.nn.elu(x) + 1.0
    np.testing.assert_allclose(out, _reference(phi(q), phi(k), v, _padding(8), False), atol=1e-5)


def test_linear_causal_chunked_equals_unchunked():
    t = 10
    q, k, v = _qkv(t, t, seed=3)
    mask = _padding(t)
    plain, _ = _attend(_kernel("linear", chunk_size=0), q, k, v, mask, is_causal=True)
    for chunk in (1, 3, 4, 64):  # 3, 4 do not divide T; 64 > T is one chunk
        out, _ = _attend(_kernel("linear", chunk_size=chunk), q, k, v, mask, is_causal=True)
        np.testing.assert_allclose(out, plain, atol=1e-5, err_msg=f"chunk_size={chunk}")


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_fully_masked_batch_is_finite_with_finite_grads(name):
    q, k, v = _qkv(6, 6)
    mask = jnp.zeros((B, 1, 1, 6), bool).at[0].set(True)  # batch 1 sees no key at all
    kernel = _kernel(name, **({"num_features": 32} if name == "performer" else {}))

    def loss(q, k, v):
        return sum((x ** 2).sum() for x in call_kernel(kernel, q, k, v, mask, is_causal=True, need_weights=True))

    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)
    assert np.isfinite(value) and all(np.isfinite(g).all() for g in grads)
    np.testing.assert_allclose(_attend(kernel, q, k, v, mask)[0][1], 0.0)


# --- performer -------------------------------------------------------------------------------------------------

def _softmax_error(seeds, q, k, v, **options):
    """Mean absolute error of performer outputs vs exact softmax attention, averaged over projection seeds."""
    exact = jax.nn.dot_product_attention(q, k, v)
    errs = [_mae(_attend(_kernel("performer", num_heads=q.shape[2], num_kv_heads=k.shape[2], head_dim=q.shape[3],
                                 seed=s, **options), q, k, v)[0], exact) for s in seeds]
    return float(np.mean(errs))


def test_performer_error_falls_with_features():
    q, k, v = _qkv(16, 16, seed=5, num_heads=2, num_kv_heads=2, head_dim=16, scale=0.5)
    errs = [_softmax_error(range(3), q, k, v, num_features=m) for m in (16, 64, 256)]
    print("performer MAE vs softmax at F=16/64/256:", errs)
    assert errs[0] > errs[1] > errs[2]
    assert errs[2] < 0.5 * errs[0]


def test_performer_orthogonal_beats_iid():
    q, k, v = _qkv(16, 16, seed=7, num_heads=2, num_kv_heads=2, head_dim=16, scale=0.5)
    ortho = _softmax_error(range(6), q, k, v, num_features=16, orthogonal=True)
    iid = _softmax_error(range(6), q, k, v, num_features=16, orthogonal=False)
    print("performer MAE orthogonal vs iid (F=16):", ortho, iid)
    assert ortho <= iid


def test_performer_positive_beats_trig_where_kernel_values_are_small():
    """Queries and keys with large norms pointing apart: softmax kernel values are tiny, where trig features have
    large variance (and signed normalizers) and positive features stay accurate (Choromanski et al., sec. 2.3)."""
    t, hd = 12, 16
    direction = jax_randn(11, (1, 1, 1, hd))
    q = 2.0 * direction + 0.3 * jax_randn(12, (B, t, 2, hd))  # (B, T, 2, H)
    k = -2.0 * direction + 0.3 * jax_randn(13, (B, t, 2, hd))  # (B, S, 2, H)
    v = jax_randn(14, (B, t, 2, hd))
    positive = _softmax_error(range(3), q, k, v, num_features=64, features="positive")
    trig = _softmax_error(range(3), q, k, v, num_features=64, features="trig")
    print("performer MAE positive vs trig (small kernel values):", positive, trig)
    assert positive < 0.5 * trig
    # neither estimate is degenerate (an all-zero output would pass the comparison above): per seed, mean |out|
    # within 10x of the exact softmax output's
    exact = float(jnp.mean(jnp.abs(jax.nn.dot_product_attention(q, k, v))))
    for features in ("positive", "trig"):
        for seed in range(3):
            kernel = _kernel("performer", num_heads=2, num_kv_heads=2, head_dim=hd, seed=seed, num_features=64,
                             features=features)
            scale = float(jnp.mean(jnp.abs(_attend(kernel, q, k, v)[0])))
            print(f"performer {features} seed {seed}: mean|out| / mean|exact| = {scale / exact:.3g}")
            assert exact / 10 < scale < 10 * exact, (features, seed, scale, exact)


@pytest.mark.parametrize("features", ["positive", "trig"])
def test_performer_causal_equals_masked_quadratic_reference(features):
    t = 9
    q, k, v = _qkv(t, t, seed=2)
    mask = _padding(t)
    kernel = _kernel("performer", num_features=32, features=features, chunk_size=4)
    out, w = _attend(kernel, q, k, v, mask, is_causal=True, need_weights=True)
    proj, valid = kernel.feature_state(True), mask[:, 0, 0]
    q_feat = kernel.query_features(proj, q.reshape(B, t, K, N // K, H))
    k_feat = kernel.key_features(proj, k, valid, kernel.key_offset(proj, k, valid))
    ref = _reference(q_feat.reshape(B, t, N, -1), k_feat, v, mask, is_causal=True)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(apply_weights(w, v), out, rtol=1e-4, atol=1e-5)
    assert np.allclose(jnp.triu(w, k=1), 0.0)


def test_performer_redraws_every_n_training_calls_only():
    kernel = _kernel("performer", num_features=32, redraw_every=2)
    q, k, v = _qkv(5, 5)
    p0 = np.asarray(kernel.projection[...])
    for _ in range(3):
        _attend(kernel, q, k, v, deterministic=True)
    np.testing.assert_array_equal(kernel.projection[...], p0)
    _attend(kernel, q, k, v, deterministic=False)
    np.testing.assert_array_equal(kernel.projection[...], p0)  # one training call: not yet
    _attend(kernel, q, k, v, deterministic=False)
    p1 = np.asarray(kernel.projection[...])
    assert not np.allclose(p1, p0)  # after two training calls: redrawn
    _attend(kernel, q, k, v, deterministic=True)
    np.testing.assert_array_equal(kernel.projection[...], p1)


def test_performer_redraw_under_jit_compiles_once():
    kernel = _kernel("performer", num_features=32, redraw_every=2)
    q, k, v = _qkv(5, 5)
    traces = []

    @nnx.jit
    def step(kernel, q):
        traces.append(1)
        return _attend(kernel, q, k, v, is_causal=True, deterministic=False)[0]

    seen = [np.asarray(kernel.projection[...])]
    for _ in range(5):
        step(kernel, q)
        seen.append(np.asarray(kernel.projection[...]))
    assert len(traces) == 1
    changed = [not np.array_equal(a, b) for a, b in zip(seen, seen[1:])]
    assert changed == [False, True, False, True, False]
    assert float(kernel.calls[...]) == 5.0


# --- decoding --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["linear", {"name": "performer", "num_features": 32}])
def test_decode_equals_causal_forward(name):
    t, d = 7, 16
    m = MultiHeadAttention(4, d, num_kv_heads=2, attention=name, decode=False, rngs=nnx.Rngs(0))
    x = jax_randn(1, (B, t, d))
    full = nnx.jit(lambda m, x: m(x, is_causal=True))(m, x)
    m.init_cache((B, t, d))
    step = nnx.jit(lambda m, xi: m(xi, decode=True))
    steps = [step(m, x[:, i:i + 1]) for i in range(t)]
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)
