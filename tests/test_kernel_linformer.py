"""The linformer kernel (Wang et al. 2020): shapes, sharing modes, padding, errors, implied weights, training.

Float32 comparisons run under 'highest' matmul precision (tests/conftest.py), so their tight tolerances hold on a
GPU too, where float32 matmuls default to TF32.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from attn_lab.attention import MultiHeadAttention
from attn_lab.attention.dense import apply_weights
from tests.helpers import call_kernel, jax_randn, make_kernel

B, T, S, D, N, H = 2, 7, 5, 16, 4, 4
SMALL = dict(k=3, max_len=12)


def _module(num_kv_heads=None, **options):
    spec = {"name": "linformer", **SMALL, **options}
    return MultiHeadAttention(N, D, num_kv_heads=num_kv_heads, attention=spec, decode=False, rngs=nnx.Rngs(0))


def _kernel(num_kv_heads=N, **options):
    return make_kernel({"name": "linformer", **SMALL, **options}, N, num_kv_heads, H, rng_seed=0)


def _reference(kernel, q, k, v):
    """Paper eq. 7 head by head in numpy: softmax(Q_i (E_i^T K)^T / sqrt(d)) (F_i^T V)."""
    e, f = (np.asarray(p) for p in kernel.projections())
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    n, kv, s = q.shape[2], k.shape[2], k.shape[1]
    out = np.zeros(q.shape)
    for b in range(q.shape[0]):
        for i in range(n):
            j = i // (n // kv)
            ei, fi = (m[j, :s] if m.ndim == 3 else m[:s] for m in (e, f))
            logits = q[b, :, i] @ (ei.T @ k[b, :, j]).T / np.sqrt(q.shape[-1])  # (T, k)
            p = np.exp(logits - logits.max(-1, keepdims=True))
            out[b, :, i] = (p / p.sum(-1, keepdims=True)) @ (fi.T @ v[b, :, j])
    return out


@pytest.mark.parametrize("sharing, num_kv_heads", [("none", N), ("none", 2), ("headwise", N), ("headwise", 1),
                                                  ("kv", 2), ("layerwise", N)])
def test_matches_paper_formula_with_cross_lengths(sharing, num_kv_heads):
    kernel = _kernel(num_kv_heads, sharing=sharing)
    q, k, v = jax_randn(1, (B, T, N, H)), jax_randn(2, (B, S, num_kv_heads, H)), jax_randn(3, (B, S, num_kv_heads, H))
    out, weights = call_kernel(kernel, q, k, v)
    assert out.shape == (B, T, N, H) and weights is None
    np.testing.assert_allclose(out, _reference(kernel, q, k, v), atol=1e-5)


def test_module_shapes_self_and_cross():
    m = _module(num_kv_heads=2)
    assert m(jax_randn(1, (B, T, D))).shape == (B, T, D)
    assert m(jax_randn(1, (B, T, D)), jax_randn(2, (B, S, D))).shape == (B, T, D)


def test_grouped_query_equals_repeated_kv_heads():
    """With shared projections, grouped-query attention equals full attention over repeated key/value heads."""
    grouped, full = _kernel(2), _kernel(N)
    q, k, v = jax_randn(1, (B, T, N, H)), jax_randn(2, (B, S, 2, H)), jax_randn(3, (B, S, 2, H))
    rep = lambda a: jnp.repeat(a, N // 2, axis=2)  # (B, S, N, H)
    np.testing.assert_allclose(call_kernel(grouped, q, k, v)[0], call_kernel(full, q, rep(k), rep(v))[0], atol=1e-6)


@pytest.mark.parametrize("sharing", ["none", "headwise", "kv"])
def test_padding_contributes_nothing(sharing):
    """Padded keys change nothing: equal to the unpadded sequence, and invariant to more (garbage) padding."""
    kernel = _kernel(2, sharing=sharing)
    q = jax_randn(1, (B, T, N, H))
    k, v = jax_randn(2, (B, S, 2, H)), jax_randn(3, (B, S, 2, H))
    short = call_kernel(kernel, q, k, v)[0]
    for extra in (1, 4):
        # (B, S, K, H) -> (B, S+e, K, H)
        pad = lambda a, seed, extra=extra: jnp.concatenate([a, 100.0 * jax_randn(seed, (B, extra, 2, H))], axis=1)
        mask = (jnp.arange(S + extra) < S)[None, None, None, :].repeat(B, 0)  # (B, 1, 1, S+e)
        padded = call_kernel(kernel, q, pad(k, 4 + extra), pad(v, 5 + extra), mask=mask)[0]
        np.testing.assert_allclose(padded, short, atol=1e-5)


def test_per_example_padding_in_module():
    m = _module()
    x = jax_randn(1, (B, T, D))
    mask = (jnp.arange(T)[None, :] < jnp.array([[T], [T - 3]]))[:, None, None, :]  # (B, 1, 1, T)
    out = m(x, mask=mask)
    short = m(x[1:, :, :], x[1:, : T - 3, :])  # example 1, keys truncated to its valid length
    np.testing.assert_allclose(out[1], short[0], atol=1e-5)


def test_one_line_errors():
    m = _module()
    with pytest.raises(ValueError, match="'linformer' does not support causal attention"):
        m(jax_randn(1, (B, T, D)), is_causal=True)
    with pytest.raises(ValueError, match="does not support causal attention"):
        call_kernel(_kernel(), jax_randn(1, (B, T, N, H)), jax_randn(2, (B, S, N, H)), jax_randn(3, (B, S, N, H)),
                    is_causal=True)
    with pytest.raises(ValueError, match="key/value length 13 exceeds max_len=12"):
        m(jax_randn(1, (B, 13, D)))
    with pytest.raises(ValueError, match="'linformer' does not support"):
        m(jax_randn(1, (B, 1, D)), decode=True)
    with pytest.raises(ValueError, match="only key-padding masks"):
        m(jax_randn(1, (B, T, D)), mask=jnp.ones((B, 1, T, T), bool))
    with pytest.raises(ValueError, match="attention.sharing must be one of"):
        _module(sharing="rowwise")
    with pytest.raises(ValueError, match="does not support attention dropout"):
        MultiHeadAttention(N, D, attention="linformer", dropout_rate=0.1, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("sharing, shapes", [
    ("none", {"key_proj": (2, 12, 3), "value_proj": (2, 12, 3)}),
    ("headwise", {"key_proj": (12, 3), "value_proj": (12, 3)}),
    ("kv", {"key_proj": (12, 3)}),
    ("layerwise", {"key_proj": (12, 3)}),
])
def test_sharing_parameter_shapes(sharing, shapes):
    m = _module(num_kv_heads=2, sharing=sharing)
    params = nnx.state(m.kernel, nnx.Param)
    got = {path[0]: leaf.shape for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
    got = {str(getattr(k, "key", k)): v for k, v in got.items()}
    assert got == shapes
    e, f = m.kernel.projections()
    assert (e is f) == (sharing in ("kv", "layerwise"))


def test_default_options_follow_the_paper():
    m = MultiHeadAttention(N, D, attention="linformer", rngs=nnx.Rngs(0))
    assert (m.kernel.k, m.kernel.max_len, m.kernel.sharing) == (256, 4096, "headwise")
    assert m.kernel.key_proj.shape == (4096, 256)


@pytest.mark.parametrize("num_kv_heads, sharing", [(None, "headwise"), (2, "none"), (1, "kv")])
def test_implied_weights_reproduce_the_output(num_kv_heads, sharing):
    """The sown [B, N, T, S] matrix times the values is the kernel output: P (F^T V) = (P F^T) V."""
    m = _module(num_kv_heads=num_kv_heads, sharing=sharing)
    x, y = jax_randn(1, (B, T, D)), jax_randn(2, (B, S, D))
    mask = (jnp.arange(S)[None, :] < jnp.array([[S], [S - 2]]))[:, None, None, :]  # (B, 1, 1, S)
    m(x, y, mask=mask, sow_weights=True, sow_head_outputs=True)
    inter = nnx.pop(m, nnx.Intermediate)
    weights, heads = inter["attention_weights"][0], inter["head_outputs"][0]
    assert weights.shape == (B, N, T, S)
    np.testing.assert_allclose(weights[1, :, :, S - 2:], 0.0)
    np.testing.assert_allclose(apply_weights(weights, m.value(y)), heads, atol=1e-5)
    np.testing.assert_allclose(m(x, y, mask=mask), m.out(heads), atol=1e-5)


def test_trains_on_toy_regression():
    """A few Adam steps reduce the loss of mapping each sequence to its (global) mean; E and F get gradients."""
    m = _module(max_len=8, k=4)
    opt = nnx.Optimizer(m, optax.adam(3e-2), wrt=nnx.Param)
    xs = jax_randn(1, (8, 8, D))
    ys = jnp.broadcast_to(xs.mean(axis=1, keepdims=True), xs.shape)  # (B, T, D)
    e0 = m.kernel.key_proj[...]

    @nnx.jit
    def step(m, opt):
        loss, grads = nnx.value_and_grad(lambda m: ((m(xs) - ys) ** 2).mean())(m)
        opt.update(m, grads)
        return loss

    losses = [float(step(m, opt)) for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0], losses
    assert not np.allclose(m.kernel.key_proj[...], e0)
