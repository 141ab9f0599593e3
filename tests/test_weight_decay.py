"""Weight decay applies to weight matrices only by default (nanoGPT, big_vision), so learned shapes -- adaptive
span's spans, entmax's alphas -- and biases and LayerNorm scales move only by their gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.models import build_model
from attn_lab.train.config import base_config, validate_config
from attn_lab.train.steps import decayed, init_state, make_optimizer, model_state


def _model(kernel: dict):
    c = base_config()
    c.model.update(num_layers=1, d_model=16, mlp_dim=32, num_heads=2, dropout=0.0)
    c.model.attention.name = kernel["name"]
    for key, value in kernel.items():
        if key != "name":
            c.model.attention[kernel["name"]][key] = value
    c.model.kinds.cross.attention = "dense"  # adaptive span is self-attention only
    return c, build_model(c.model, kind="translation", vocab_size=12, max_len=8, seed=0)


def _flat(tree):
    return {"/".join(map(str, path)): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _run_zero_gradients(config, model, steps=100):
    tx = make_optimizer(config.train)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    state = init_state(params, model_state(model), tx, 0)
    zeros = jax.tree.map(jnp.zeros_like, params)
    p, opt = state["params"], state["opt_state"]
    update = jax.jit(lambda p, opt: tx.update(zeros, opt, p))
    for _ in range(steps):
        updates, opt = update(p, opt)
        p = jax.tree.map(lambda a, u: a + u, p, updates)
    return _flat(params), _flat(p)


@pytest.mark.parametrize("kernel, learned", [
    ({"name": "adaptive_span", "init_span": 0.5, "max_span": 8}, "span_fraction"),
    ({"name": "entmax", "learn_alpha": True, "alpha": 1.3}, "alpha_logit"),
])
def test_a_learned_shape_with_zero_gradient_stays_exactly_where_it_is(kernel, learned):
    """100 AdamW steps with every gradient 0: spans / alphas, biases and LayerNorm parameters do not move at all;
    weight matrices shrink by decay. With ``weight_decay_on='all'`` (the old behaviour) the spans move too."""
    config, model = _model(kernel)
    config.train.weight_decay = 0.1  # large enough that decay over 100 steps is unmistakable
    before, after = _run_zero_gradients(config, model)
    shapes = [k for k in before if learned in k]
    assert shapes, f"no {learned} parameter found"
    for name in before:
        if before[name].ndim < 2 or name.endswith(("'bias']", "'scale']")):  # spans, alphas, biases, norms
            np.testing.assert_array_equal(after[name], before[name], err_msg=name)
        else:  # every matrix decays (a kernel with zero gradient only shrinks)
            assert float(jnp.abs(after[name]).sum()) < float(jnp.abs(before[name]).sum()), name
    config.train.weight_decay_on = "all"
    _, after_all = _run_zero_gradients(config, model)
    for name in shapes:
        assert float(jnp.abs(after_all[name]).sum()) < float(jnp.abs(before[name]).sum()), name


def test_the_decay_mask_names_matrices_only_and_the_key_is_checked():
    params = {"kernel": jnp.ones((3, 2, 4)), "embedding": jnp.ones((5, 3)), "bias": jnp.ones((4,)),
              "query": {"bias": jnp.ones((2, 4))}, "scale": jnp.ones((3,)), "span_fraction": jnp.ones((2,))}
    assert decayed(params) == {"kernel": True, "embedding": True, "bias": False, "query": {"bias": False},
                               "scale": False, "span_fraction": False}
    assert all(decayed(params, "all").values())
    c = base_config()
    c.train.weight_decay_on = "biases"
    with pytest.raises(ValueError, match="train.weight_decay_on='biases' is not one of: matrices, all"):
        validate_config(c)


@pytest.mark.slow
def test_vmapped_seeds_decay_the_same_parameters():
    """Under ``--seeds`` the update is vmapped: the mask sees one seed's shapes, so a [S, N] span is not taken for
    a matrix."""
    config, model = _model({"name": "adaptive_span", "init_span": 0.5, "max_span": 8})
    tx = make_optimizer(config.train)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    stacked = jax.tree.map(lambda x: jnp.stack([x, x]), params)
    opt = jax.vmap(tx.init)(stacked)
    zeros = jax.tree.map(jnp.zeros_like, stacked)
    updates, _ = jax.vmap(tx.update)(zeros, opt, stacked)
    for name, u in _flat(updates).items():
        matrix = u.ndim - 1 >= 2 and not name.endswith(("'bias']", "'scale']"))
        assert (float(jnp.abs(u).max()) > 0.0) == matrix, name
