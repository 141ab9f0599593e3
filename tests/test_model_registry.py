"""A new model kind is one file: a throwaway model registered at test time (with an attention kind of its own)
gets config validation, capture, head importance, gradient norms, structural pruning and the dispatch line from
its declared sites alone, with no other file touched (as tests/test_task_registry.py does for tasks)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.analysis import importance
from attn_lab.analysis.structural import prune_model
from attn_lab.attention.dispatch import describe_dispatch
from attn_lab.models import sites
from attn_lab.models.transformer import PAD, Ctx, Stack, embedding, rows_seeing
from attn_lab.train.capture import as_layers, capture_step
from attn_lab.train.steps import init_state, make_optimizer, model_state


@pytest.fixture
def toy_model(monkeypatch):
    """Registers 'toy_pool' -- two stacks over the same tokens, a causal one and a bidirectional one with a kind
    named 'toy_self', pooled into class logits -- for this test only."""
    monkeypatch.setattr(sites, "_MODELS", dict(sites._MODELS))

    @sites.register_model("toy_pool")
    class ToyPool(nnx.Module):
        TASK_KINDS = ("classification",)
        ATTENTION = {"toy_self": sites.KindSpec(mask="key_padding"),
                     "decoder_self": sites.KindSpec(causal=True, mask="none")}
        GENERATES = False

        def __init__(self, cfg, *, vocab_size, max_len, rngs, gates=None, num_classes=None):
            embed = embedding(vocab_size, cfg.d_model, rngs)
            self.bidi = Stack(cfg, embed, max_len, self_kind="toy_self", cross=False, num_layers=2, rngs=rngs)
            self.left = Stack(cfg, embed, max_len, self_kind="decoder_self", cross=False, num_layers=1, rngs=rngs)
            self.head = nnx.Linear(cfg.d_model, num_classes, rngs=rngs)

        @staticmethod
        def layout(cfg, inputs, targets):
            return {"toy_self": (2, inputs), "decoder_self": (1, inputs)}

        def sites(self):
            return sites.stack_sites("bidi", self.bidi) + sites.stack_sites("left", self.left)

        def forward_batch(self, batch, ctx=Ctx(), head_masks=None):
            x, valid = batch["inputs"], batch["inputs"] != PAD
            a = self.bidi(self.bidi.embed(x), ctx, self_mask=valid[:, None, None, :], is_causal=False,
                          head_masks=head_masks)
            b = self.left(self.left.embed(x), ctx, self_mask=None, is_causal=True, head_masks=head_masks)
            w = valid[..., None].astype(a.dtype)
            logits = self.head(((a + b) * w).sum(1) / jnp.maximum(w.sum(1), 1.0))  # (B, C)
            return logits, batch["targets"], batch["mask"]

        def attention_rows(self, batch):
            valid = batch["inputs"] != PAD
            return {"toy_self": (valid, rows_seeing(valid, valid.shape[1])),
                    "decoder_self": (valid, rows_seeing(valid, valid.shape[1], causal=True))}

    return ToyPool


@pytest.mark.slow
def test_a_model_kind_registered_at_test_time_runs_the_whole_analysis_from_its_sites(toy_model):
    from attn_lab.train.config import base_config

    c = base_config()  # built now: its per-kind options include the new 'toy_self'
    c.model.update(name="toy_pool", d_model=16, mlp_dim=32, num_heads=4, dropout=0.0)
    c.model.kinds.toy_self.head_mask = "1,1,0,1"
    model = sites.build_model(c.model, kind="classification", vocab_size=11, max_len=10, num_classes=3)
    assert isinstance(model, toy_model) and sites.mask_shapes(model) == {"toy_self": (2, 4), "decoder_self": (1, 4)}
    assert describe_dispatch(model, backend="cpu").startswith("attention: toy_self=dense/")

    inputs = np.array([[3, 4, 5, 6, 7, 8], [5, 6, 7, 0, 0, 0]], np.int32)
    batch = {"inputs": inputs, "targets": np.array([1, 2], np.int32), "mask": np.ones(2, np.float32)}
    graphdef, params, _ = nnx.split(model, nnx.Param, ...)
    state = init_state(nnx.to_pure_dict(params), model_state(model), make_optimizer(c.train), 0)

    layers = as_layers(jax.jit(capture_step(graphdef))(state, batch))  # capture: maps and row masks per site
    assert sorted(layers) == ["decoder_self/0", "toy_self/0", "toy_self/1"]
    assert layers["toy_self/0"]["maps"].shape == (2, 4, 6, 6)
    np.testing.assert_array_equal(layers["decoder_self/0"]["valid_keys"][1, 4], [1, 1, 1, 0, 0, 0])

    scores, sums = importance.compile_analysis(graphdef)
    imp = importance.head_importance(state, [batch], sites.mask_shapes(model), sums)
    assert imp["toy_self"].shape == (2, 4) and imp["toy_self"][0, 2] == 0.0  # statically masked head: no gradient
    grads = importance.head_gradient_norms(state, [batch], model.sites(), importance.compile_gradients(graphdef))
    assert grads["decoder_self"].shape == (1, 4) and np.all(grads["decoder_self"] > 0)

    masks = {"toy_self": np.array([[1, 0, 1, 1], [0, 1, 1, 0]], np.float32), "decoder_self": np.ones((1, 4))}
    pruned = prune_model(model, masks)
    assert [pruned.bidi.blocks[i].self_attn.num_heads for i in (0, 1)] == [3, 2]
    want = model.forward_batch(batch, head_masks={k: jnp.asarray(v) for k, v in masks.items()})[0]
    np.testing.assert_allclose(pruned.forward_batch(batch)[0], want, rtol=1e-5, atol=1e-5)
