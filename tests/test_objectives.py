"""Training objectives are registered loss terms: a throwaway one, added here at test time (an entropy penalty on the
attention maps, this file only), gets a config section, a one-line check, the captured maps it asks for, a value in
the loss that matches the formula written out in numpy, and trains end to end -- touching no other file.

Exactness: float32 on CPU and GPU; the loss is compared at rtol 1e-5 (the same forward pass, summed in another order).
"""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from attn_lab import objectives
from attn_lab.models import Ctx, attention_layers
from attn_lab.objectives import LossTerm, ModelFacts, configured, register_term, unregister_term
from attn_lab.train.config import base_config, validate_config
from attn_lab.train.steps import merge
from attn_lab.train.trainer import train_and_evaluate
from tests.helpers import tiny_numbers


class Entropy(LossTerm):
    """Mean row entropy of every attention map (all rows, every layer), times ``weight``."""

    name = "entropy_test"

    def default_config(self):
        return ml_collections.ConfigDict({"weight": 0.0, "floor": 0.0})

    def check(self, cfg, facts: ModelFacts):
        if not cfg.weight >= 0:
            raise ValueError(f"loss.entropy_test.weight must be >= 0, got {cfg.weight}")
        if any(not k.supports_weights for k in facts.kernels.values()):
            raise ValueError("loss.entropy_test needs attention maps")

    def capture(self, cfg):
        return True

    def __call__(self, cfg, inputs):
        per_layer = []
        for layer in inputs.layers:
            p = layer.captured["attention_weights"]  # (B, N, T, S)
            per_layer.append(-(p * jnp.log(jnp.maximum(p, 1e-30))).sum(-1).mean())
        value = jnp.mean(jnp.stack(per_layer))
        return cfg.weight * jnp.maximum(value - cfg.floor, 0.0), {"entropy_test/value": value}


@pytest.fixture
def entropy_term():
    register_term(Entropy)
    try:
        yield
    finally:
        unregister_term("entropy_test")


def test_builtin_terms_own_their_sections():
    paths = {t.name: t.path for t in objectives.terms()}
    assert paths == {"diversity": "loss.diversity", "gates": "heads.gates", "span": "loss.span"}
    c = base_config()
    assert c.loss.span.weight == 0.0 and c.heads.gates.enabled is False and c.loss.diversity.output.weight == 0.0
    assert configured(c) == ()  # everything off by default


def test_a_name_or_section_is_registered_once(entropy_term):
    with pytest.raises(ValueError, match="give it a name no other term has"):
        register_term(Entropy)

    class Again(LossTerm):
        name, path = "other_test", "loss.entropy_test"
    with pytest.raises(ValueError, match="config section loss.entropy_test belongs to another term"):
        register_term(Again)


def test_a_new_term_gets_a_section_and_a_one_line_check(entropy_term):
    c = tiny_numbers(None)
    assert c.loss.entropy_test.to_dict() == {"weight": 0.0, "floor": 0.0}
    c.loss.entropy_test.weight = -1.0
    with pytest.raises(ValueError, match=r"^loss.entropy_test.weight must be >= 0, got -1.0$"):
        validate_config(c)


def _numpy_entropy(graphdef, state, batch) -> float:
    """The term's formula written out in numpy from maps captured by a separate forward pass."""
    model = merge(graphdef, state)
    model.forward_batch(batch, Ctx(capture=True))
    values = []
    for _, _, attn in attention_layers(model):
        p = np.asarray(nnx.to_pure_dict(nnx.pop(attn, nnx.Intermediate))["attention_weights"][0], np.float64)
        values.append(float(np.mean(-(p * np.log(np.maximum(p, 1e-30))).sum(-1))))
    return float(np.mean(values))


def test_the_term_is_in_the_loss_by_value_and_by_gradient(entropy_term, tiny_step):
    c = base_config()
    c.model.update(num_layers=1, d_model=32, mlp_dim=64, num_heads=4, dropout=0.0)
    c.loss.entropy_test.weight = 0.5
    step, state, batch, graphdef = tiny_step(c, objectives=configured(c))
    single = jax.tree.map(lambda x: x[0], state)
    expected = _numpy_entropy(graphdef, single, {k: v[0] for k, v in batch.items()})
    new, m = step(state, batch)
    np.testing.assert_allclose(float(m["entropy_test/value"][0]), expected, rtol=1e-5)
    np.testing.assert_allclose(float(m["total_loss"][0]), float(m["loss"][0]) + 0.5 * expected, rtol=1e-5)
    # by gradient: a large weight lowers the maps' entropy over a few steps; a zero weight leaves the term out
    for _ in range(15):
        new, m = step(new, batch)
    assert float(m["entropy_test/value"][0]) < expected
    c.loss.entropy_test.weight = 0.0
    off, off_state, off_batch, _ = tiny_step(c, objectives=configured(c))  # (the state above was donated)
    assert "entropy_test/value" not in off(off_state, off_batch)[1]


def test_training_with_a_new_term_needs_no_other_file(entropy_term, tmp_path, data_dir):
    c = tiny_numbers(data_dir, num_steps=4, log_every=2, eval_every=4, checkpoint_every=4)
    c.compile_cache = ""
    c.loss.entropy_test.weight = 0.1
    results = train_and_evaluate(c, str(tmp_path / "run"))
    assert results["steps"] == 4
    with open(os.path.join(tmp_path, "run", "metrics.jsonl")) as f:
        logged = [json.loads(line) for line in f]
    train = [r for r in logged if "train/entropy_test/value" in r]
    assert [r["step"] for r in train] == [2, 4]
    assert all(r["train/total_loss"] > r["train/loss"] for r in train)
    with open(os.path.join(tmp_path, "run", "config.json")) as f:
        assert json.load(f)["loss"]["entropy_test"]["weight"] == 0.1
