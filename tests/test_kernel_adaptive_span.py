"""The adaptive-span kernel (attn_lab/attention/adaptive_span.py) against independent references.

References: ``jax.nn.dot_product_attention`` (spans covering the sequence, a ramp of 1e-3), and a naive O(T^2)
float64 numpy formula written out here (ramp mask, multiplied after exp, renormalized); gradients against
``jax.grad`` of a jnp copy of that formula and against float64 central differences. Realistic scales: batch 2,
length 128-256, 4 heads, head_dim 16-32, grouped-query heads too. Float32 comparisons run at 'highest' matmul
precision (tests/conftest.py), so the 1e-5 tolerances hold on a GPU too.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.attention import KERNELS, MultiHeadAttention, build_kernel
from attn_lab.attention.adaptive_span import adaptive_span_attention, ramp_mask
from tests.helpers import CALL, np_randn, seeded_qkv

B, N, H = 2, 4, 16


def _qkv(t, k=N, h=H, seed=0, dtype=jnp.float32):
    return seeded_qkv(seed, B, t, t, N, k, h, dtype=dtype, rng="numpy")


def _valid(t, cut=9):
    return jnp.arange(t)[None, :] < jnp.array([[t], [t - cut]])  # (B, T): example 1 has `cut` padded keys


def _naive(q, k, v, spans, ramp, causal, valid):
    """The paper's formula, float64 numpy: a_ij = m(x_ij) exp(s_ij) / sum_k m(x_ik) exp(s_ik), padding weight 0.
    Returns (out [B, T, N, H], rows [B, N, T]: rows with some visible key, where the formula is defined)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, t, n, h = q.shape
    k, v = (np.repeat(a, n // a.shape[2], axis=2) for a in (k, v))  # grouped-query: each kv head serves G heads
    s = np.einsum("bind,bjnd->bnij", q, k) / math.sqrt(h)
    x = np.arange(t)[:, None] - np.arange(t)[None, :]  # i - j
    dist = x if causal else np.abs(x)
    m = np.clip((ramp + np.asarray(spans, np.float64)[:, None, None] - dist) / ramp, 0.0, 1.0)  # (N, T, T)
    if causal:
        m = m * (x >= 0)
    m = m[None] * np.asarray(valid, np.float64)[:, None, None, :]  # (B, N, T, T)
    e = m * np.exp(s - s.max(-1, keepdims=True))
    total = e.sum(-1, keepdims=True)
    a = e / np.where(total > 0, total, 1.0)
    return np.einsum("bnij,bjnd->bind", a, v), total[..., 0] > 0


def _naive_jnp(q, k, v, spans, ramp, causal):
    """The same formula in jnp (no padding), for jax.grad."""
    b, t, n, h = q.shape
    k, v = (jnp.repeat(a, n // a.shape[2], axis=2) for a in (k, v))
    s = jnp.einsum("bind,bjnd->bnij", q, k) / math.sqrt(h)
    x = jnp.arange(t)[:, None] - jnp.arange(t)[None, :]
    m = jnp.clip((ramp + spans[:, None, None] - (x if causal else jnp.abs(x))) / ramp, 0.0, 1.0)
    m = m * (x >= 0) if causal else m
    e = m * jnp.exp(s - jax.lax.stop_gradient(s.max(-1, keepdims=True)))
    return jnp.einsum("bnij,bjnd->bind", e / e.sum(-1, keepdims=True), v)


def _ours(spans, max_span, ramp, causal, block_size=32, valid=None):
    return jax.jit(lambda q, k, v, z: adaptive_span_attention(q, k, v, z, max_span=max_span, ramp=ramp,
                                                               is_causal=causal, block_size=block_size,
                                                               key_valid=valid))


# --- against references -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [N, 2])
def test_full_span_equals_dense_attention_by_value_and_gradient(causal, kv_heads):
    """Spans covering the sequence (z >= T - 1) and R = 1e-3: the mask is all ones, dense softmax attention."""
    t = 256
    q, k, v = _qkv(t, kv_heads, h=32)
    spans = jnp.full((N,), float(t))
    valid = _valid(t)
    ours = lambda q, k, v: adaptive_span_attention(q, k, v, spans, max_span=t, ramp=1e-3, is_causal=causal,
                                                   block_size=64, key_valid=valid)
    dense = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                         mask=valid[:, None, None, :])
    rows = np.asarray(valid)[:, :, None, None]  # causal: query rows 0.. of the padded example all see key 0
    np.testing.assert_allclose(jax.jit(ours)(q, k, v), dense(q, k, v), atol=1e-5)
    cot = np_randn(7, q.shape) * rows
    grads = [jax.jit(jax.grad(lambda *a, f=f: (f(*a) * cot).sum(), argnums=(0, 1, 2)))(q, k, v) for f in (ours, dense)]
    for got, ref in zip(*grads):
        np.testing.assert_allclose(got, ref, atol=2e-5)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads, block_size", [(N, 32), (2, 48)])
def test_short_spans_per_head_match_the_naive_formula_with_padding(causal, kv_heads, block_size):
    """Spans shorter than T, different per head (one at 0: only the ramp), key padding, blocks not dividing T."""
    t = 200
    q, k, v = _qkv(t, kv_heads, seed=3)
    spans, ramp, valid = jnp.array([0.0, 7.25, 30.5, 61.0]), 16.0, _valid(t)
    got = _ours(spans, 64, ramp, causal, block_size, valid)(q, k, v, spans)
    ref, rows = _naive(q, k, v, spans, ramp, causal, valid)
    rows = np.moveaxis(rows, 1, 2)  # (B, T, N)
    assert rows.sum() > 0.9 * rows.size
    np.testing.assert_allclose(np.asarray(got)[rows], ref[rows], atol=1e-5)
    assert np.isfinite(np.asarray(got)).all()  # rows seeing only padding: finite (mask-weighted padding average)


def test_ramp_mask_value_and_gradient_match_the_formula():
    """m = clip((R + z - x) / R, 0, 1); dm/dz = 1/R inside the ramp (z < x < z + R), 0 outside it."""
    z, ramp = 12.3, 8.0
    x = jnp.arange(0, 40, dtype=jnp.float32)
    np.testing.assert_allclose(ramp_mask(x, z, ramp), np.clip((ramp + z - np.arange(40)) / ramp, 0, 1), atol=1e-6)
    slope = jax.vmap(jax.grad(lambda z, x: ramp_mask(x, z, ramp)), in_axes=(None, 0))(jnp.float32(z), x)
    inside = (np.arange(40) > z) & (np.arange(40) < z + ramp)
    np.testing.assert_allclose(slope, np.where(inside, 1.0 / ramp, 0.0), atol=1e-7)
    assert inside.sum() == 8


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_match_the_naive_formula(causal):
    """d out / d (q, k, v, z) against jax.grad of the jnp formula (float32)."""
    t = 160
    q, k, v = _qkv(t, 2, seed=5)
    spans, ramp = jnp.array([3.3, 17.6, 40.2, 9.9]), 6.0
    cot = np_randn(9, q.shape)
    ours = lambda q, k, v, z: adaptive_span_attention(q, k, v, z, max_span=48, ramp=ramp, is_causal=causal,
                                                      block_size=32)
    loss = lambda f: jax.jit(jax.grad(lambda *a: (f(*a) * cot).sum(), argnums=(0, 1, 2, 3)))(q, k, v, spans)
    got, ref = loss(ours), loss(lambda q, k, v, z: _naive_jnp(q, k, v, z, ramp, causal))
    for g, r, what in zip(got, ref, "qkvz"):
        np.testing.assert_allclose(g, r, atol=2e-5 * max(1.0, float(jnp.abs(r).max())), err_msg=what)
    assert np.all(np.abs(np.asarray(got[3])) > 1e-3)  # every head's span gets a gradient


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_match_float64_finite_differences(causal):
    """Float64 kernel: directional derivatives in z (every head) and in q, k, v against central differences."""
    with jax.enable_x64(True):
        t = 128
        q, k, v = _qkv(t, seed=11, dtype=jnp.float64)
        spans, ramp = jnp.array([2.4, 11.7, 25.1, 33.3], jnp.float64), 5.0  # no integer distance on a kink
        cot = np_randn(12, q.shape, dtype=jnp.float64)
        f = jax.jit(lambda q, k, v, z: (adaptive_span_attention(q, k, v, z, max_span=40, ramp=ramp,
                                                                 is_causal=causal, block_size=32) * cot).sum())
        grads = jax.grad(f, argnums=(0, 1, 2, 3))(q, k, v, spans)
        eps = 1e-5
        for i, (x, g) in enumerate(zip((q, k, v, spans), grads)):
            direction = np_randn(20 + i, x.shape, dtype=jnp.float64)
            args = [q, k, v, spans]
            plus, minus = list(args), list(args)
            plus[i], minus[i] = x + eps * direction, x - eps * direction
            fd = (f(*plus) - f(*minus)) / (2 * eps)
            np.testing.assert_allclose(float((g * direction).sum()), float(fd), rtol=1e-6, err_msg="qkvz"[i])


# --- no leak, and blocks beyond the span cost nothing --------------------------------------------------------------

def test_causal_outputs_ignore_later_positions():
    t, cut = 192, 100
    q, k, v = _qkv(t, 2, seed=13)
    spans = jnp.array([5.0, 50.0, 100.0, 150.0])
    run = _ours(spans, 160, 8.0, True)
    later = (jnp.arange(t) > cut)[None, :, None, None]
    moved = run(q, jnp.where(later, 5 * k + 3, k), jnp.where(later, 4 * v - 2, v), spans)
    np.testing.assert_array_equal(np.asarray(moved)[:, :cut + 1], np.asarray(run(q, k, v, spans))[:, :cut + 1])


@pytest.mark.parametrize("causal", [True, False])
def test_keys_beyond_span_plus_ramp_have_no_influence(causal):
    """For each head h, changing its key/value at every distance >= z_h + R from query i leaves output i as is."""
    t, i = 256, 170
    q, k, v = _qkv(t, seed=17)
    spans, ramp = jnp.array([4.0, 20.5, 47.0, 90.0]), 10.0
    run = _ours(spans, 100, ramp, causal)
    dist = np.abs(i - np.arange(t))
    far = jnp.asarray(dist[None, :, None, None] >= np.asarray(spans + ramp)[None, None, :, None])  # (1, T, N, 1)
    moved = run(q, jnp.where(far, -3 * k + 1, k), jnp.where(far, 7 * v + 5, v), spans)
    np.testing.assert_array_equal(np.asarray(moved)[:, i], np.asarray(run(q, k, v, spans))[:, i])
    near = jnp.asarray(dist == int(spans[3] + ramp) - 1)[None, :, None, None]  # inside head 3's ramp: it matters
    assert not np.allclose(run(q, k, jnp.where(near, v + 1, v), spans)[:, i, 3], run(q, k, v, spans)[:, i, 3])


@pytest.mark.parametrize("causal", [True, False])
def test_blocks_beyond_the_span_are_not_computed(causal):
    """NaN values in the first key block: a computed block would spread them (0 * NaN), a skipped one cannot. With
    spans <= 6, R = 2 and 32-key blocks, query blocks two or more blocks away stay finite and equal the formula with
    those values replaced; under ``lax.cond`` (in the jaxpr) even though max_span covers the whole sequence."""
    t, w = 256, 32
    q, k, v = _qkv(t, seed=19)
    spans, ramp = jnp.array([0.0, 2.5, 6.0, 1.0]), 2.0
    first = (jnp.arange(t) < w)[None, :, None, None]
    got = np.asarray(_ours(spans, t, ramp, causal, w)(q, k, jnp.where(first, jnp.nan, v), spans))
    ref, _ = _naive(q, k, jnp.where(first, 0.0, v), spans, ramp, causal, jnp.ones((B, t), bool))
    assert np.isnan(got[:, :w]).any()  # the block itself is computed
    np.testing.assert_allclose(got[:, 2 * w:], ref[:, 2 * w:], atol=1e-5)
    jaxpr = str(jax.make_jaxpr(lambda *a: adaptive_span_attention(*a, max_span=t, ramp=ramp, is_causal=causal,
                                                                  block_size=w))(q, k, v, spans))
    assert "cond[" in jaxpr


# --- the kernel class: options, spans, penalty, capabilities -----------------------------------------------------

def test_kernel_spans_penalty_and_parameter_gradient():
    kernel = build_kernel({"name": "adaptive_span", "max_span": 64, "ramp": 4, "init_span": 0.25},
                          num_heads=N, num_kv_heads=2, head_dim=H, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(kernel.spans(), np.full(N, 16.0))
    kernel.span_fraction[...] = jnp.array([0.1, 0.5, 1.3, -0.2])  # outside [0, 1]: clipped in value
    np.testing.assert_allclose(kernel.spans(), [6.4, 32.0, 64.0, 0.0], rtol=1e-6)
    assert kernel.spans().shape == (N,) and float(kernel.penalty()) == pytest.approx(25.6, rel=1e-6)
    grad = nnx.grad(lambda m: m.penalty())(kernel)
    np.testing.assert_allclose(grad["span_fraction"][...], np.full(N, 64 / N))  # straight through the clip
    q, k, v = _qkv(128, 2, seed=23)
    out = lambda m: m(q, k, v, mask=None, is_causal=True, need_weights=False, **CALL)[0]
    g = nnx.grad(lambda m: (out(m) * np_randn(24, q.shape)).sum())(kernel)["span_fraction"][...]
    assert np.all(np.abs(np.asarray(g)[:2]) > 0)  # heads whose span lies in (0, S): the loss reaches v


def test_weights_path_equals_blockwise_path_in_the_module():
    m = MultiHeadAttention(N, 64, attention={"name": "adaptive_span", "max_span": 64, "ramp": 8, "init_span": 0.3},
                           num_kv_heads=2, rngs=nnx.Rngs(0))
    x, mask = np_randn(1, (B, 128, 64)), _valid(128)[:, None, None, :]
    for causal in (True, False):
        plain = m(x, mask=mask, is_causal=causal)
        captured = m(x, mask=mask, is_causal=causal, sow_weights=True)
        weights = nnx.pop(m, nnx.Intermediate)["attention_weights"][0]
        assert weights.shape == (B, N, 128, 128)
        np.testing.assert_allclose(captured, plain, atol=1e-5)
        dist = np.abs(np.arange(128)[:, None] - np.arange(128)[None, :])
        assert np.all(np.asarray(weights)[..., dist >= 0.3 * 64 + 8] == 0.0)


@pytest.mark.parametrize("option, value, message", [
    ("max_span", 0, "attention.max_span must be a positive integer, got 0"),
    ("max_span", 1.5, "attention.max_span must be a positive integer, got 1.5"),
    ("ramp", 0, r"attention.ramp must be a positive number \(tokens\), got 0"),
    ("ramp", -2.0, r"attention.ramp must be a positive number \(tokens\), got -2.0"),
    ("init_span", 1.5, r"attention.init_span must be a fraction in \[0, 1\], got 1.5"),
    ("block_size", 0, "attention.block_size must be a positive integer, got 0"),
    ("block_size", True, "attention.block_size must be a positive integer, got True"),
    ("clamp", 1, "attention.clamp must be true or false, got 1"),
    ("clamp", "yes", "attention.clamp must be true or false, got 'yes'"),
])
def test_bad_options_are_one_line_errors(option, value, message):
    with pytest.raises(ValueError, match=message) as err:
        build_kernel({"name": "adaptive_span", option: value}, num_heads=N, num_kv_heads=N, head_dim=H)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kv_heads", [N, 2])
def test_decode_equals_the_causal_forward_and_the_naive_formula(kv_heads):
    """KV-cache decoding, one token per call (the module passes the cache slot as the query's position): per-head
    spans shorter than T, one at 0 (ramp only), so the distance cut acts in decode too. Steps equal the blockwise
    causal forward pass and the float64 formula on the same projections; the sown weights are exactly 0 beyond
    z + R and at unwritten slots, and positive inside."""
    t, d, ramp = 48, 64, 4.0
    m = MultiHeadAttention(N, d, num_kv_heads=kv_heads, rngs=nnx.Rngs(0),
                           attention={"name": "adaptive_span", "max_span": 32, "ramp": ramp, "block_size": 16})
    m.kernel.span_fraction[...] = jnp.array([0.0, 0.11, 0.4, 1.0])  # spans 0, 3.52, 12.8, 32 tokens
    spans = np.asarray(m.kernel.spans())
    x = np_randn(5, (B, t, d))
    full = m(x, is_causal=True)  # (B, T, d)
    m.init_cache((B, t, d))
    steps = jnp.concatenate([m(x[:, i:i + 1], decode=True, sow_weights=True) for i in range(t)], axis=1)
    heads, _ = _naive(m.query(x), m.key(x), m.value(x), spans, ramp, True, np.ones((B, t)))  # (B, T, N, H)
    np.testing.assert_allclose(steps, full, atol=1e-5)
    np.testing.assert_allclose(steps, m.out(jnp.asarray(heads, jnp.float32)), atol=1e-5)
    weights = np.concatenate(nnx.pop(m, nnx.Intermediate)["attention_weights"], axis=2)  # (B, N, T, T)
    x_ij = np.arange(t)[:, None] - np.arange(t)[None, :]
    seen = (x_ij >= 0) & (x_ij < spans[:, None, None] + ramp)  # (N, T, T)
    assert weights.shape == (B, N, t, t) and np.all(weights[:, ~seen] == 0.0) and np.all(weights[:, seen] > 0.0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)


def test_unsupported_uses_are_one_line_errors():
    assert not (KERNELS["adaptive_span"].supports_cross or KERNELS["adaptive_span"].supports_dropout)
    m = MultiHeadAttention(N, 32, attention="adaptive_span", rngs=nnx.Rngs(0))
    x = np_randn(1, (B, 16, 32))
    cases = [
        (lambda: m(x, np_randn(2, (B, 16, 32))), "attention 'adaptive_span' does not support cross-attention"),
        (lambda: m(x, mask=jnp.ones((B, 1, 16, 16), bool)), "takes only key-padding masks"),
        (lambda: MultiHeadAttention(N, 32, attention="adaptive_span", dropout_rate=0.1, rngs=nnx.Rngs(0)),
         "does not support attention dropout"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            call()
        assert "\n" not in str(err.value)
