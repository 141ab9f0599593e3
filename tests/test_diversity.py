"""Head-diversity regularizers: known values on hand-built heads, finite gradients, the loss they add, one compile.

Float32 comparisons run under 'highest' matmul precision (tests/conftest.py), so their tight tolerances hold on a
GPU too, where float32 matmuls default to TF32.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_lab.attention.dense import DenseAttention
from attn_lab.objectives import configured, diversity
from attn_lab.train.config import base_config, validate_config

N, T = 4, 6
ALL_ROWS = jnp.ones((1, T))


def _one_hot_maps(columns):
    """``[1, N, T, T]`` maps where head i attends only to key ``columns[i]``."""
    return jax.nn.one_hot(jnp.array(columns), T)[None, :, None, :].repeat(T, 2)


def test_map_regularizers_zero_for_disjoint_heads_maximal_for_identical():
    disjoint, identical = _one_hot_maps([0, 1, 2, 3]), _one_hot_maps([2, 2, 2, 2])
    pairs = N * (N - 1) // 2
    assert float(diversity.map_cosine(disjoint, ALL_ROWS, tau=0.5)) == 0.0
    np.testing.assert_allclose(diversity.map_cosine(identical, ALL_ROWS, tau=0.5), pairs * 0.5, rtol=1e-6)
    # -D_position sums over the T rows, i = j included: disjoint one-hot heads overlap only with themselves
    np.testing.assert_allclose(diversity.position(disjoint, ALL_ROWS), T / N, rtol=1e-6)
    np.testing.assert_allclose(diversity.position(identical, ALL_ROWS), T, rtol=1e-6)  # the maximum
    uniform = jnp.full((1, N, T, T), 1.0 / T)
    np.testing.assert_allclose(diversity.position(uniform, ALL_ROWS), 1.0, rtol=1e-6)  # T rows x 1/T


def test_map_terms_ignore_padded_query_rows_and_single_key_rows():
    """Whatever the maps hold on padded rows and on the causal row 0 (one visible key), the terms equal those of
    the counted rows alone."""
    maps = jax.nn.softmax(jax.random.normal(jax.random.key(0), (2, N, T, T)), -1)
    queries = jnp.array([[True] * T, [True] * 4 + [False] * 2])  # example 1: 2 padded query rows
    keys = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (2, T, T))  # causal: row 0 sees one key
    rows = diversity.map_rows(queries, keys)
    np.testing.assert_array_equal(rows, [[0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]])
    noisy = maps.at[1, :, 4:].set(jax.random.uniform(jax.random.key(1), (N, 2, T))).at[:, :, 0].set(
        jax.random.uniform(jax.random.key(2), (2, N, T)))
    for fn in (diversity.position, diversity.map_cosine):
        np.testing.assert_allclose(fn(noisy, rows), fn(maps, rows), rtol=1e-6)
    counted = [int(rows[e].sum()) for e in range(2)]  # rows 1..counted of each example
    by_example = [float(diversity.position(maps[e:e + 1, :, 1:c + 1], jnp.ones((1, c)))) for e, c in enumerate(counted)]
    np.testing.assert_allclose(diversity.position(maps, rows), np.mean(by_example), rtol=1e-6)


def test_matrix_cosine_zero_for_orthogonal_heads_one_for_identical_and_masks_positions():
    orthogonal = jnp.eye(N)[None, None].repeat(T, 1)  # (1, T, N, H=N): head i = e_i at every position
    same = jnp.ones((1, T, N, 3))
    every = jnp.ones((1, T), bool)
    np.testing.assert_allclose(diversity.matrix_cosine(orthogonal, every), 1.0 / N, rtol=1e-6)  # only i = j
    np.testing.assert_allclose(diversity.matrix_cosine(same, every), 1.0, rtol=1e-6)
    assert float(diversity.pair_similarity(orthogonal, every)) == pytest.approx(0.0, abs=1e-6)
    # a padded position holding identical vectors in every head does not count
    padded = orthogonal.at[0, -1].set(1.0)
    valid = jnp.arange(T)[None] < T - 1
    np.testing.assert_allclose(diversity.matrix_cosine(padded, valid), 1.0 / N, rtol=1e-6)


def test_subspace_repeats_shared_value_heads_per_query_head():
    values = jax.random.normal(jax.random.key(3), (2, T, 2, 3))  # K = 2 value heads for N = 4 query heads
    repeated = diversity.repeat_kv(values, 4)
    np.testing.assert_array_equal(repeated[:, :, 0], values[:, :, 0])
    np.testing.assert_array_equal(repeated[:, :, 1], values[:, :, 0])  # heads 0, 1 share value head 0
    np.testing.assert_array_equal(repeated[:, :, 3], values[:, :, 1])


@pytest.mark.parametrize("name", tuple(diversity.REGULARIZERS))
def test_gradients_are_finite_even_for_zero_heads(name):
    maps = jax.nn.softmax(jax.random.normal(jax.random.key(1), (2, N, T, T)), -1).at[:, 0].set(0.0)
    heads = jax.random.normal(jax.random.key(2), (2, T, N, 3)).at[:, :, 1].set(0.0)
    kernel = jax.random.normal(jax.random.key(3), (8, N, 2)).at[:, 2].set(0.0)
    rows, valid = jnp.ones((2, T)), jnp.ones((2, T), bool)
    fn = {"map_cosine": lambda x: diversity.map_cosine(x[0], rows),
          "position": lambda x: diversity.position(x[0], rows),
          "output": lambda x: diversity.matrix_cosine(x[1], valid),
          "subspace": lambda x: diversity.matrix_cosine(x[1], valid),
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
    step, state, batch, _ = make(c, objectives=configured(c))
    return step, state, batch


@pytest.mark.parametrize("name", tuple(diversity.REGULARIZERS))
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

    dcfg = diversity.Diversity().default_config()
    dcfg.position.weight = 1.0
    kernel = NoMaps(num_heads=2, num_kv_heads=2, head_dim=4)
    with pytest.raises(ValueError, match="loss.diversity.position needs attention maps"):
        diversity.check_config(dcfg, {"encoder_self": kernel})
    dcfg.position.weight, dcfg.output.weight = 0.0, 1.0
    diversity.check_config(dcfg, {"encoder_self": kernel})  # per-head outputs need no maps


def test_subspace_refuses_a_single_shared_value_head_in_one_line():
    c = _config()
    c.loss.diversity.subspace.weight, c.model.num_kv_heads = 1.0, 1
    with pytest.raises(ValueError, match=r"subspace.weight=1.0: encoder_self shares one key/value head among its 4"):
        validate_config(c)
    c.model.num_kv_heads = 2  # grouped: the groups' subspaces differ, the term is defined
    validate_config(c)
