"""Sparse-pattern kernels (strided/fixed, longformer, bigbird) against dense attention with the pattern as a mask.

The reference masks are built here from each paper's definition with plain loops, independently of the index
builders in ``blocksparse.py``/``sparse.py`` (bigbird's random draw is the one free parameter taken from the kernel).

Float32 comparisons run under 'highest' matmul precision (tests/conftest.py), so their tight tolerances hold on a
GPU too, where float32 matmuls default to TF32.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.attention import KERNELS, MultiHeadAttention, validate_spec
from attn_lab.attention.dense import apply_weights, attention_weights
from tests.helpers import call_kernel, split_qkv

B, T, N, K, H = 2, 21, 4, 2, 8  # T is a multiple of none of the block sizes below


def _qkv(t=T, n=N, k=K, h=H, b=B):
    return split_qkv(b, t, t, n, k, h)


def _kernel(name, **options):
    return KERNELS[name](num_heads=N, num_kv_heads=K, head_dim=H, **options)


def _reference_mask(name, options, t, causal, kernel):
    """``[t, t]`` boolean pattern from the definition (loops over i, j)."""
    ref = np.zeros((t, t), bool)
    if name == "bigbird":
        bs, w, ng = options["block_size"], options["num_window_blocks"], options["num_global_blocks"]
        rand = kernel.random_blocks(t, causal)
    for i in range(t):
        for j in range(t):
            if name == "strided" and options.get("pattern", "strided") == "strided":
                l = options["stride"]
                ok = abs(i - j) < l or (i - j) % l == 0
            elif name == "strided":
                l, c = options["stride"], options["num_summary"]
                ok = i // l == j // l or j % l >= l - c
            elif name == "longformer":
                g = options["global_tokens"]
                ok = abs(i - j) <= options["window"] // 2 or i in g or j in g
            else:
                bi, bj = i // bs, j // bs
                ok = abs(bi - bj) <= w // 2 or bi < ng or bj < ng or bj in rand[bi]
            ref[i, j] = ok and (j <= i or not causal)
    return ref


CONFIGS = {
    "strided": ("strided", dict(pattern="strided", stride=4)),
    "fixed": ("strided", dict(pattern="fixed", stride=5, num_summary=2)),
    "longformer": ("longformer", dict(window=6, global_tokens=(0, 11))),
    "bigbird": ("bigbird", dict(block_size=3, num_window_blocks=3, num_global_blocks=1, num_random_blocks=2,
                                seed=1)),
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_matches_dense_with_pattern_mask(config, causal):
    """Output, weights and gradients equal dense attention masked by the pattern (with padding, GQA, ragged T)."""
    name, options = CONFIGS[config]
    kernel = _kernel(name, **options)
    q, k, v = _qkv()
    valid = jnp.arange(T)[None, :] < jnp.array([[T], [T - 5]])  # (B, T): second example padded
    mask = valid[:, None, None, :]  # (B, 1, 1, T)
    pattern = _reference_mask(name, options, T, causal, kernel)
    dense_mask = jnp.asarray(pattern)[None, None] & mask  # (B, 1, T, T)
    rows = jnp.asarray(np.asarray(dense_mask).any(-1))[:, 0, :, None, None]  # (B, T, 1, 1): some key visible
    cot = jax.random.normal(jax.random.key(3), (B, T, N, H)) * rows

    def ours(q, k, v):
        return (call_kernel(kernel, q, k, v, mask=mask, is_causal=causal)[0] * cot).sum()

    def reference(q, k, v):
        return (apply_weights(attention_weights(q, k, mask=dense_mask), v) * cot).sum()

    @jax.jit
    def run(q, k, v):
        out, weights = call_kernel(kernel, q, k, v, mask=mask, is_causal=causal, need_weights=True)
        ref_w = attention_weights(q, k, mask=dense_mask)
        return (out, weights, apply_weights(ref_w, v), ref_w, apply_weights(weights, v),
                jax.grad(ours, (0, 1, 2))(q, k, v), jax.grad(reference, (0, 1, 2))(q, k, v))

    out, weights, ref_out, ref_w, implied, grads, ref_grads = run(q, k, v)
    seen = rows[:, None, :, :, 0]  # (B, 1, T, 1)
    np.testing.assert_allclose(out * rows, ref_out * rows, atol=1e-5)
    np.testing.assert_allclose(weights * seen, ref_w * seen, atol=1e-6)
    assert np.all(np.asarray(weights)[~np.broadcast_to(np.asarray(pattern), weights.shape)] == 0)
    np.testing.assert_allclose(implied, out, atol=1e-5)
    for g_ours, g_ref in zip(grads, ref_grads):
        np.testing.assert_allclose(g_ours, g_ref, atol=1e-5)

@pytest.mark.parametrize("causal", [False, True])
def test_fully_padded_rows_are_finite_and_causal(causal):
    """A query whose pattern keys are all padding stays finite (values and gradients) and sees no future key."""
    kernel = _kernel("strided", stride=4)
    q, k, v = _qkv()
    mask = jnp.zeros((B, 1, 1, T), bool).at[:, :, :, 3].set(True)  # only key 3 real: most rows see nothing
    loss = lambda q, k, v: (call_kernel(kernel, q, k, v, mask=mask, is_causal=causal)[0] ** 2).sum()
    run = lambda q, k, v: (call_kernel(kernel, q, k, v, mask=mask, is_causal=causal, need_weights=True),
                           jax.grad(loss, (0, 1, 2))(q, k, v))
    (out, weights), grads = jax.jit(run)(q, k, v)
    assert np.isfinite(out).all() and all(np.isfinite(g).all() for g in grads)
    if causal:
        assert np.all(np.triu(np.asarray(weights), k=1) == 0)


@pytest.mark.parametrize("causal", [False, True])
def test_everything_attended_is_dense(causal):
    """Longformer with window >= 2T and bigbird whose window/random/global blocks cover all equal dense."""
    q, k, v = _qkv()
    ref = jax.nn.dot_product_attention(q, k, v, is_causal=causal)
    longformer = _kernel("longformer", window=2 * T, global_tokens=(3,))
    bigbird = _kernel("bigbird", block_size=4, num_window_blocks=3, num_global_blocks=1, num_random_blocks=6)
    outs = jax.jit(lambda q, k, v: [call_kernel(kern, q, k, v, is_causal=causal)[0] for kern in (longformer, bigbird)])(
        q, k, v)
    for out in outs:
        np.testing.assert_allclose(out, ref, atol=1e-5)


def test_bigbird_random_blocks_are_static_and_valid():
    kernel = _kernel("bigbird", block_size=4, num_window_blocks=3, num_global_blocks=1, num_random_blocks=2, seed=7)
    nb = 16
    for causal in (False, True):
        rand = kernel.random_blocks(nb * 4, causal)
        np.testing.assert_array_equal(rand, kernel.random_blocks(nb * 4, causal))  # deterministic
        for q in range(nb):
            drawn = [m for m in rand[q] if m != q]  # q marks "no candidate left"
            assert all(abs(m - q) > 1 and m >= 1 for m in drawn)
            assert not causal or all(m < q for m in drawn)
            if (not causal and nb - 4 >= 2) or q >= 4:
                assert len(set(drawn)) == 2
    assert not np.array_equal(kernel.random_blocks(64, False),
                              _kernel("bigbird", block_size=4, seed=8).random_blocks(64, False))


def test_options_and_unsupported_uses_are_one_line_errors():
    for spec, match in [({"name": "strided", "pattern": "diagonal"}, "pattern"),
                        ({"name": "strided", "stride": 0}, "stride"),
                        ({"name": "strided", "stride": 4, "num_summary": 5}, "num_summary"),
                        ({"name": "longformer", "window": -2}, "window"),
                        ({"name": "longformer", "global_tokens": (-1,)}, "global_tokens"),
                        ({"name": "bigbird", "num_window_blocks": 2}, "num_window_blocks"),
                        ({"name": "bigbird", "num_random_blocks": -1}, "num_random_blocks")]:
        name, options = validate_spec(spec)
        with pytest.raises(ValueError, match=match):
            _kernel(name, **options)
    for name in ("strided", "longformer", "bigbird"):
        m = MultiHeadAttention(4, 16, attention=name, rngs=nnx.Rngs(0))
        with pytest.raises(ValueError, match="does not support cross-attention"):
            m(jnp.ones((1, 5, 16)), jnp.ones((1, 3, 16)))
        with pytest.raises(ValueError, match="does not support attention dropout"):
            MultiHeadAttention(4, 16, attention=name, dropout_rate=0.1, rngs=nnx.Rngs(0))


def _temp_bytes(fn, *args):
    grad = jax.jit(jax.grad(lambda *a: (fn(*a) ** 2).sum(), argnums=(0, 1, 2)))
    return grad.lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_memory_is_a_fraction_of_dense_at_4k():
    """Compiled forward+backward temporaries at T=4096 (B=1, N=2, H=32): < 1/4 of dense's."""
    shape = jax.ShapeDtypeStruct((1, 4096, 2, 32), jnp.float32)
    dense = _temp_bytes(lambda q, k, v: jax.nn.dot_product_attention(q, k, v), shape, shape, shape)
    for name, options in [("bigbird", dict(block_size=64)), ("longformer", dict(window=128))]:
        kernel = KERNELS[name](num_heads=2, num_kv_heads=2, head_dim=32, **options)
        ours = _temp_bytes(lambda q, k, v, kernel=kernel: call_kernel(kernel, q, k, v)[0], shape, shape, shape)
        print(f"{name}: temp bytes {ours} vs dense {dense}: ratio {ours / dense:.3f}")
        assert ours < dense / 4
