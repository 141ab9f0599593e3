"""Head-diversity regularizers: known values on hand-built heads, finite gradients, the loss they add, one compile.

Float32 comparisons run under 'highest' matmul precision (tests/conftest.py), so their tight tolerances hold on a
GPU too, where float32 matmuls default to TF32.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_lab.attention.dense import DenseAttention
from attn_lab.train import diversity
from attn_lab.train.config import base_config, validate_config

N, T = 4, 6


def _one_hot_maps(columns):
    """``[1, N, T, T]`` maps where head i attends only to key ``columns[i]``."""
    return jax.nn.one_hot(jnp.array(columns), T)[None, :, None, :].repeat(T, 2)


def test_map_regularizers_zero_for_disjoint_heads_maximal_for_identical():
    disjoint, identical = _one_hot_maps([0, 1, 2, 3]), _one_hot_maps([2, 2, 2, 2])
    pairs = N * (N - 1) // 2
    assert float(diversity.map_cosine(disjoint, tau=0.5)) == 0.0
    np.testing.assert_allclose(diversity.map_cosine(identical, tau=0.5), pairs * 0.5, rtol=1e-6)
    assert float(diversity.position(disjoint)) == 0.0
    np.testing.assert_allclose(diversity.position(identical), 1.0, rtol=1e-6)  # the maximum for distributions
    uniform = jnp.full((1, N, T, T), 1.0 / T)
    np.testing.assert_allclose(diversity.position(uniform), 1.0 / T, rtol=1e-6)  # spread maps overlap less


def test_head_cosine_zero_for_orthogonal_heads_one_for_identical():
    orthogonal = jnp.eye(N)[None, None].repeat(T, 1)  # (1, T, N, H=N): head i = e_i
    same = jnp.ones((1, T, N, 3))
    assert float(diversity.head_cosine(orthogonal)) == 0.0
    np.testing.assert_allclose(diversity.head_cosine(same), 1.0, rtol=1e-6)


def test_qk_orthogonal_zero_for_orthogonal_subspaces_one_for_identical():
    d, h = 8, 2
    disjoint = jnp.eye(d).reshape(d, N, h)  # head i spans input dims 2i, 2i+1
    rng = jax.random.normal(jax.random.key(0), (d, 1, h))
    same = jnp.repeat(rng, N, axis=1) * jnp.arange(1.0, N + 1)[None, :, None]  # identical up to scale
    assert float(diversity.qk_orthogonal(disjoint, disjoint)) == 0.0
    np.testing.assert_allclose(diversity.qk_orthogonal(same, same), 1.0, rtol=1e-5)


@pytest.mark.parametrize("name", diversity.REGULARIZERS)
def test_gradients_are_finite_even_for_zero_heads(name):
    maps = jax.nn.softmax(jax.random.normal(jax.random.key(1), (2, N, T, T)), -1).at[:, 0].set(0.0)
    heads = jax.random.normal(jax.random.key(2), (2, T, N, 3)).at[:, :, 1].set(0.0)
    kernel = jax.random.normal(jax.random.key(3), (8, N, 2)).at[:, 2].set(0.0)
    fn = {"map_cosine": lambda x: diversity.map_cosine(x[0]), "position": lambda x: diversity.position(x[0]),
          "output": lambda x: diversity.head_cosine(x[1]), "subspace": lambda x: diversity.head_cosine(x[1]),
          "qk_orthogonal": lambda x: diversity.qk_orthogonal(x[2], x[2])}[name]
    grads = jax.grad(fn)((maps, heads, kernel))
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))


def _config():
    c = base_config()
    c.model.num_layers, c.model.d_model, c.model.mlp_dim, c.model.num_heads, c.model.dropout = 1, 32, 64, 4, 0.0
    return c


def _tiny(make, name, weight):
    c = _config()
    c.loss.diversity[name].weight = weight
    step, state, batch, _ = make(c, diversity=c.loss.diversity)
    return step, state, batch


@pytest.mark.parametrize("name", diversity.REGULARIZERS)
def test_total_loss_is_task_loss_plus_weighted_term_and_the_term_pushes_heads_apart(name, tiny_step):
    """From the same start, 15 steps with weight 5 end with a lower term than 15 steps with a negligible weight."""
    ends = {}
    for weight in (5.0, 1e-9):
        step, state, batch = _tiny(tiny_step, name, weight)
        state, first = step(state, batch)
        np.testing.assert_allclose(first["total_loss"], first["loss"] + weight * first[f"diversity/{name}"],
                                   rtol=1e-5)
        assert "diversity/similarity" in first or name == "qk_orthogonal"
        for _ in range(15):
            state, last = step(state, batch)
        assert step._cache_size() == 1  # one compiled step, capture and regularizer included
        ends[weight] = float(last[f"diversity/{name}"][0])
    assert ends[5.0] < ends[1e-9]


def test_off_by_default_and_bad_settings_are_one_line():
    c = _config()
    assert not diversity.active(c.loss.diversity)
    for key, value, message in [("kinds", "encoder,cross", "loss.diversity.kinds='encoder,cross'"),
                                ("layers", "first", "loss.diversity.layers='first'")]:
        bad = _config()
        bad.loss.diversity[key] = value
        with pytest.raises(ValueError, match=message):
            validate_config(bad)
    c.loss.diversity.output.weight = -1.0
    with pytest.raises(ValueError, match="loss.diversity.output.weight must be >= 0"):
        validate_config(c)

    class NoMaps(DenseAttention):  # a kernel that cannot materialize its attention matrix (not registered)
        supports_weights = False

    dcfg = diversity.default_config()
    dcfg.position.weight = 1.0
    kernel = NoMaps(num_heads=2, num_kv_heads=2, head_dim=4)
    with pytest.raises(ValueError, match="loss.diversity.position needs attention maps"):
        diversity.check_config(dcfg, {"encoder_self": kernel})
    dcfg.position.weight, dcfg.output.weight = 0.0, 1.0
    diversity.check_config(dcfg, {"encoder_self": kernel})  # per-head outputs need no maps
