"""The attention module against its references: flax's MultiHeadAttention and jax.nn.dot_product_attention.

Float32 comparisons run under 'highest' matmul precision (tests/conftest.py), so their tight tolerances hold on a
GPU too, where float32 matmuls default to TF32.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.attention import KERNELS, MultiHeadAttention, validate_spec
from attn_lab.attention.dense import apply_weights
from tests.helpers import jax_randn

B, T, S, D = 2, 7, 5, 16


def _pair(num_heads=4, num_kv_heads=None, **kw):
    """Flax's module and ours with flax's parameters copied in."""
    theirs = nnx.MultiHeadAttention(num_heads, D, num_kv_heads=num_kv_heads, decode=False, rngs=nnx.Rngs(0), **kw)
    ours = MultiHeadAttention(num_heads, D, num_kv_heads=num_kv_heads, decode=False, rngs=nnx.Rngs(1), **kw)
    nnx.update(ours, nnx.state(theirs, nnx.Param))
    return theirs, ours


def _padding_mask(q_len, k_len):
    q_valid = jnp.arange(q_len)[None, :] < jnp.array([[q_len], [q_len - 2]])  # (B, T)
    k_valid = jnp.arange(k_len)[None, :] < jnp.array([[k_len], [k_len - 3]])  # (B, S)
    return q_valid[:, None, :, None] & k_valid[:, None, None, :]  # (B, 1, T, S)


CASES = {
    "self": dict(args=lambda: (jax_randn(1, (B, T, D)),), call={}),
    "cross": dict(args=lambda: (jax_randn(1, (B, T, D)), jax_randn(2, (B, S, D))), call={}),
    "cross_kv": dict(args=lambda: (jax_randn(1, (B, T, D)), jax_randn(2, (B, S, D)), jax_randn(3, (B, S, D))), call={}),
    "padding": dict(args=lambda: (jax_randn(1, (B, T, D)), jax_randn(2, (B, S, D))),
                    call=dict(mask=_padding_mask(T, S))),
    "causal": dict(args=lambda: (jax_randn(1, (B, T, D)),), call=dict(is_causal=True)),
    "causal_padding": dict(args=lambda: (jax_randn(1, (B, T, D)),),
                           call=dict(is_causal=True, mask=_padding_mask(T, T))),
}


@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("sow", [False, True])
def test_matches_flax(case, num_kv_heads, sow):
    theirs, ours = _pair(num_kv_heads=num_kv_heads)
    assert jax.tree.structure(nnx.state(theirs, nnx.Param)) == jax.tree.structure(nnx.state(ours, nnx.Param))
    args, call = CASES[case]["args"](), CASES[case]["call"]
    np.testing.assert_allclose(ours(*args, sow_weights=sow, **call), theirs(*args, **call), atol=1e-5)


def test_matches_flax_with_qk_norm_and_no_bias():
    theirs, ours = _pair(normalize_qk=True, use_bias=False)
    x = jax_randn(1, (B, T, D))
    np.testing.assert_allclose(ours(x), theirs(x), atol=1e-5)


def test_weights_match_flax_sow_and_jax_reference():
    theirs, ours = _pair()
    x, mask = jax_randn(1, (B, T, D)), _padding_mask(T, T)
    theirs(x, mask=mask, sow_weights=True)
    ours(x, mask=mask, sow_weights=True, sow_head_outputs=True)
    w_theirs = nnx.pop(theirs, nnx.Intermediate)["attention_weights"][0]
    inter = nnx.pop(ours, nnx.Intermediate)
    w_ours, heads = inter["attention_weights"][0], inter["head_outputs"][0]
    np.testing.assert_allclose(w_ours, w_theirs, atol=1e-6)
    assert heads.shape == (B, T, 4, D // 4)
    q, k, v = ours.query(x), ours.key(x), ours.value(x)
    ref = jax.nn.dot_product_attention(q, k, v, mask=mask)  # (B, T, N, H)
    np.testing.assert_allclose(heads, ref, atol=1e-5)


def test_head_dim_and_bias_switches():
    m = MultiHeadAttention(8, D, head_dim=32, use_query_bias=False, use_key_bias=False, use_value_bias=True,
                           use_out_bias=False, rngs=nnx.Rngs(0))
    assert m.query.kernel.shape == (D, 8, 32) and m.out.kernel.shape == (8, 32, D)
    assert m.query.bias is None and m.key.bias is None and m.out.bias is None
    assert m.value.bias.shape == (8, 32)
    assert m(jax_randn(1, (B, T, D)), decode=False).shape == (B, T, D)
    with pytest.raises(ValueError, match="divisible by num_heads"):
        MultiHeadAttention(3, D, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="num_kv_heads"):
        MultiHeadAttention(4, D, num_kv_heads=3, rngs=nnx.Rngs(0))


def test_head_mask_equals_zeroed_output_rows():
    """Masking head h must equal removing head h's rows from the output projection."""
    _, ours = _pair()
    x = jax_randn(1, (B, T, D))
    head_mask = jnp.array([1.0, 0.0, 1.0, 1.0])
    masked = ours(x, head_mask=head_mask)
    ours.out.kernel[...] = ours.out.kernel[...].at[1].set(0.0)
    np.testing.assert_allclose(masked, ours(x), atol=1e-6)
    per_example = ours(x, head_mask=jnp.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]))  # (B, N)
    np.testing.assert_allclose(per_example[1], jnp.broadcast_to(ours.out.bias[...], (T, D)), atol=1e-6)


def test_head_mask_gradient_is_head_contribution():
    """d(sum out)/d(mask_h) is the contribution of head h, so importance scores come from one backward pass."""
    _, ours = _pair()
    x = jax_randn(1, (B, T, D))
    f = lambda m: ours(x, head_mask=m).sum()
    grad = jax.grad(f)(jnp.ones(4))
    for h in range(4):
        only = jnp.zeros(4).at[h].set(1.0)
        np.testing.assert_allclose(grad[h], f(only) - f(jnp.zeros(4)), rtol=1e-4, atol=1e-4)


def test_decode_equals_forward_under_jit():
    _, ours = _pair(num_kv_heads=2)
    x = jax_randn(1, (B, T, D))
    full = ours(x, is_causal=True)
    ours.init_cache((B, T, D))
    step = nnx.jit(lambda m, xi: m(xi, decode=True))
    out = jnp.concatenate([step(ours, x[:, i:i + 1]) for i in range(T)], axis=1)
    np.testing.assert_allclose(out, full, atol=1e-5)


def test_decode_without_cache_is_a_clear_error():
    _, ours = _pair()
    with pytest.raises(ValueError, match="init_cache"):
        ours(jax_randn(1, (B, 1, D)), decode=True)


@pytest.mark.parametrize("sow", [False, True])
def test_fully_masked_rows_are_finite(sow):
    _, ours = _pair()
    x = jax_randn(1, (B, T, D))
    mask = jnp.ones((B, 1, T, T), bool).at[:, :, 2, :].set(False)  # query 2 sees nothing

    def loss(m, x):
        return (m(x, mask=mask, sow_weights=sow) ** 2).sum()

    value, grads = nnx.value_and_grad(loss, argnums=(0, 1))(ours, x)
    assert np.isfinite(value)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_dropout_changes_training_but_not_eval():
    m = MultiHeadAttention(4, D, dropout_rate=0.5, rngs=nnx.Rngs(0, dropout=1))
    x = jax_randn(1, (B, T, D))
    eval_a, eval_b = m(x, deterministic=True), m(x, deterministic=True)
    np.testing.assert_allclose(eval_a, eval_b)
    assert not np.allclose(m(x, deterministic=False), eval_a)


# --- every registered kernel -----------------------------------------------------------------------------------

def _kernel_module(name, num_kv_heads=None):
    return MultiHeadAttention(4, D, num_kv_heads=num_kv_heads, attention=name, decode=False, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_kernel_causal_no_leak_by_gradient(name, num_kv_heads):
    """Output at position i must not depend on inputs at positions j > i."""
    m = _kernel_module(name, num_kv_heads)
    if not m.kernel.supports_causal:
        pytest.skip("kernel has no causal mode")
    x = jax_randn(1, (1, T, D))
    jac = jax.jacfwd(lambda x: m(x, is_causal=True, head_mask=jnp.array([1.0, 0.5, 1.0, 1.0])))(x)  # (1,T,D,1,T,D)
    dep = np.abs(np.asarray(jac)).sum(axis=(0, 2, 3, 5))  # (T_out, T_in)
    assert np.all(np.triu(dep, k=1) == 0.0)
    assert np.all(np.diag(dep) > 0.0)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_shapes_grads_and_no_retrace(name):
    m = _kernel_module(name)
    graphdef, params = nnx.split(m)
    traces = []

    @jax.jit
    def loss(params, x):
        traces.append(1)
        return (nnx.merge(graphdef, params)(x) ** 2).mean()

    for seed in range(3):
        value, grads = jax.value_and_grad(loss)(params, jax_randn(seed, (B, T, D)))
        assert np.isfinite(value) and all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
    assert len(traces) == 1


def test_unknown_kernel_and_option_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown attention.name 'nope'"):
        validate_spec("nope")
    with pytest.raises(ValueError, match="unknown option attention.window"):
        validate_spec({"name": "dense", "window": 3})
    with pytest.raises(ValueError, match="unknown attention.name"):
        MultiHeadAttention(4, D, attention={"name": "nope"}, rngs=nnx.Rngs(0))


def _causal_modes(module):
    return (False, True) if module.kernel.supports_causal else (False,)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_padding_invariance(name):
    """Appending masked (padded) keys changes nothing for the real positions."""
    m = _kernel_module(name)
    x, extra = jax_randn(1, (B, T, D)), jax_randn(2, (B, 3, D))
    longer = jnp.concatenate([x, extra], axis=1)  # (B, T + 3, D)
    valid = jnp.arange(T + 3) < T
    for causal in _causal_modes(m):
        short = m(x, mask=jnp.ones((B, 1, 1, T), bool), is_causal=causal)
        long = m(longer, mask=jnp.broadcast_to(valid, (B, 1, 1, T + 3)), is_causal=causal)
        np.testing.assert_allclose(long[:, :T], short, atol=1e-5)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_weights_explain_output(name):
    """The attention matrix a kernel reports is the one it applies: heads == weights @ values, same output."""
    m = _kernel_module(name, num_kv_heads=2)
    if not m.kernel.supports_weights:
        pytest.skip("kernel cannot materialize its attention matrix")
    x = jax_randn(1, (B, T, D))
    mask = jnp.broadcast_to(jnp.arange(T) < T - 2, (B, 1, 1, T))
    for causal in _causal_modes(m):
        plain = m(x, mask=mask, is_causal=causal)
        captured = m(x, mask=mask, is_causal=causal, sow_weights=True, sow_head_outputs=True)
        inter = nnx.pop(m, nnx.Intermediate)
        weights, heads = inter["attention_weights"][0], inter["head_outputs"][0]
        assert weights.shape == (B, 4, T, T)
        np.testing.assert_allclose(apply_weights(weights, m.value(x)), heads, atol=1e-4)
        np.testing.assert_allclose(captured, plain, atol=1e-4)


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_kernel_decode_equals_causal_forward(name, num_kv_heads):
    m = _kernel_module(name, num_kv_heads=num_kv_heads)
    if not (m.kernel.supports_decode and m.kernel.supports_causal):
        with pytest.raises(ValueError, match="does not support"):
            m.init_cache((B, T, D))
            m(jax_randn(1, (B, 1, D)), decode=True)
        return
    x = jax_randn(1, (B, T, D))
    full = m(x, is_causal=True)
    m.init_cache((B, T, D))
    steps = [m(x[:, i:i + 1], decode=True) for i in range(T)]
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-4)


def test_module_passes_training_flag_to_stateful_kernels():
    """Performer redraws its features in training calls only, also through the module (no attention dropout)."""
    m = MultiHeadAttention(4, D, attention={"name": "performer", "num_features": 8, "redraw_every": 1},
                           rngs=nnx.Rngs(0))
    x = jax_randn(1, (B, T, D))
    start = np.asarray(m.kernel.projection[...])
    m(x, deterministic=True)
    np.testing.assert_array_equal(m.kernel.projection[...], start)
    m(x, deterministic=False)
    m(x, deterministic=False)
    assert not np.allclose(m.kernel.projection[...], start)
