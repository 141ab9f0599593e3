"""Structural pruning equals masking; L0 gates at 1 equal the ungated model; a gate target is met in training;
``train.init_from`` starts from a finished run's parameters."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.analysis.structural import heads_left, prune_model
from attn_lab.attention import MultiHeadAttention
from attn_lab.models import Ctx, build_model, mask_shapes
from attn_lab.train.config import base_config, validate_config
from attn_lab.train.restore import load_finished_run
from attn_lab.train.trainer import Run, train_and_evaluate
from tests.helpers import tiny_numbers


def _cfg(**model):
    c = base_config()
    c.model.update(dict(num_layers=2, d_model=16, mlp_dim=32, num_heads=4, dropout=0.0))
    c.model.update(model)
    return c


INPUTS = jax.random.randint(jax.random.key(1), (3, 6), 3, 12).at[2, 4:].set(0)
TARGETS = jax.random.randint(jax.random.key(2), (3, 5), 3, 12).at[1, 3:].set(0)


def test_pruned_translation_model_equals_the_masked_one():
    c = _cfg()
    c.model.kinds.cross.head_mask = "1,1,0.5,1"  # a static (config) mask is folded into the pruned model
    model = build_model(c.model, kind="translation", vocab_size=12, max_len=9, seed=0)
    masks = {"encoder_self": np.array([[1, 0, 0, 0], [1, 1, 1, 1]], np.float32),
             "decoder_self": np.array([[1, 1, 1, 0], [0, 1, 0, 1]], np.float32),
             "cross": np.array([[1, 0, 1, 0], [0, 0, 0, 0]], np.float32)}  # a layer with every head pruned
    pruned = prune_model(model, masks)
    assert heads_left(pruned) == {"encoder_self": [1, 4], "decoder_self": [3, 2], "cross": [2, 1]}
    assert pruned.decoder.blocks[0].cross_attn.query.kernel.shape == (16, 2, 4)
    masked = model(INPUTS, TARGETS, Ctx(), head_masks={k: jnp.asarray(v) for k, v in masks.items()})
    np.testing.assert_allclose(jax.jit(lambda m: m(INPUTS, TARGETS, Ctx()))(pruned), masked, atol=1e-5)
    unmasked = model(INPUTS, TARGETS, Ctx())
    assert not np.allclose(unmasked, masked, atol=1e-3)  # the masks matter, so the equality above is not vacuous


def test_pruned_classifier_equals_the_masked_one_and_bad_prunes_are_one_line():
    model = build_model(_cfg().model, kind="classification", vocab_size=12, max_len=8, num_classes=3, seed=0)
    masks = {"encoder_self": np.array([[0, 1, 1, 0], [1, 1, 1, 0]], np.float32)}
    got = prune_model(model, masks)(INPUTS, Ctx())
    np.testing.assert_allclose(got, model(INPUTS, Ctx(), head_masks={"encoder_self": masks["encoder_self"]}),
                               atol=1e-5)
    with pytest.raises(ValueError, match="must be 0/1"):
        prune_model(model, {"encoder_self": np.full((2, 4), 0.5)})
    gqa = MultiHeadAttention(4, 16, num_kv_heads=2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="num_kv_heads == num_heads"):
        gqa.keep_heads([0, 1])


def test_gates_at_one_equal_the_ungated_model_in_training_and_at_test():
    c = _cfg()
    plain = build_model(c.model, kind="translation", vocab_size=12, max_len=9, seed=0)
    c.heads.gates.update(enabled=True, init=30.0)  # log_alpha = 30: every gate is 1, sampled or binarized
    gated = build_model(c.model, kind="translation", vocab_size=12, max_len=9, seed=0, gates=c.heads.gates)
    assert set(mask_shapes(gated)) == set(gated.gates.kinds)
    nnx.update(gated, nnx.state(plain, nnx.Param))  # same weights (the gates are extra)
    np.testing.assert_allclose(gated(INPUTS, TARGETS, Ctx()), plain(INPUTS, TARGETS, Ctx()), atol=1e-6)
    train = lambda m: m(INPUTS, TARGETS, Ctx(deterministic=False, rngs=nnx.Rngs(dropout=3)))
    np.testing.assert_allclose(train(gated), train(plain), atol=1e-6)
    gated.gates.log_alpha["cross"][...] = gated.gates.log_alpha["cross"][...].at[1, 2].set(-30.0)  # close one
    closed = gated(INPUTS, TARGETS, Ctx())
    mask = {"cross": jnp.ones((2, 4)).at[1, 2].set(0.0)}
    np.testing.assert_allclose(closed, plain(INPUTS, TARGETS, Ctx(), head_masks=mask), atol=1e-6)


@pytest.mark.slow
def test_gate_target_is_met_from_a_finished_run(tmp_path):
    data = str(tmp_path / "data")
    base = tiny_numbers(data)
    base.wandb.mode = "disabled"
    train_and_evaluate(base, str(tmp_path / "base"))
    c = tiny_numbers(data, num_steps=300, log_every=50, eval_every=300, checkpoint_every=300,
                     init_from=str(tmp_path / "base"))
    c.wandb.mode, c.model.dropout = "disabled", 0.0
    c.heads.gates.update(enabled=True, target=0.25)
    run = Run(c, str(tmp_path / "gated"))  # builds and restores, compiles nothing
    source = load_finished_run(str(tmp_path / "base")).state["params"]
    np.testing.assert_array_equal(run.state["params"]["encoder"]["blocks"][0]["mlp"]["up"]["kernel"][0],
                                  source["encoder"]["blocks"][0]["mlp"]["up"]["kernel"])
    run.close()
    results = train_and_evaluate(c, str(tmp_path / "gated"))
    kept = [line["train/gates/expected_kept"] for line in map(json.loads, open(tmp_path / "gated" / "metrics.jsonl"))
            if "train/gates/expected_kept" in line]
    assert abs(kept[-1] - 0.25) < 0.1 < kept[0] - 0.25  # from all open to the target
    assert results["gates"]["total"] == 12 and results["gates"]["kept"] == 3  # 25% of 12 heads
    assert sum(map(sum, results["gates"]["binary"]["encoder_self"])) <= 4


@pytest.mark.parametrize("key,value,message", [
    ("heads.gates.target", 0.25, "need heads.gates.enabled=True"),
    ("train.init_from", "/nonexistent/run", "train.init_from='/nonexistent/run' is not a run folder"),
])
def test_bad_gate_and_init_settings_are_one_line(key, value, message):
    c = base_config()
    section, name = key.rsplit(".", 1)
    node = c
    for part in section.split("."):
        node = node[part]
    node[name] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        validate_config(c)
