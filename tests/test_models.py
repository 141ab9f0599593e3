"""Transformer models: decode-equals-forward through the KV cache, causality, padding, head masks, options."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.models import Ctx, build_model, count_params
from attn_lab.train.config import base_config

V, L = 13, 16


def _cfg(**model):
    cfg = base_config().model
    cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.mlp_dim, cfg.dropout = 2, 32, 4, 64, 0.0
    cfg.update(model)
    return cfg


def _tokens(seed, shape, pad_from=None):
    t = jax.random.randint(jax.random.key(seed), shape, 3, V)
    if pad_from is not None:
        t = t.at[1, pad_from:].set(0)
    return t


@pytest.mark.parametrize("model", [{}, {"norm": "post", "positions": "learned", "tie_embeddings": False},
                                   {"num_kv_heads": 2}, {"kinds": {"decoder_self": {"num_kv_heads": 1}}}])
def test_cached_decoding_equals_teacher_forcing(model):
    m = build_model(_cfg(**model), kind="translation", vocab_size=V, max_len=L)
    inputs, targets = _tokens(0, (2, 9), pad_from=6), _tokens(1, (2, 7))
    full = m(inputs, targets)  # (B, T, V)
    decoder_inputs = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=1)[:, :-1]
    memory = m.encode(inputs)
    m.init_cache(2, L)
    steps = [m.decode(decoder_inputs[:, i:i + 1], memory, inputs, Ctx(decode=True), start=i) for i in range(7)]
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-4)


def test_decoder_is_causal_and_encoder_ignores_padding():
    m = build_model(_cfg(), kind="translation", vocab_size=V, max_len=L)
    inputs, targets = _tokens(0, (2, 9), pad_from=6), _tokens(1, (2, 7))
    base = m(inputs, targets)
    changed = m(inputs, targets.at[:, 4].set(5))  # changes decoder input 5 only
    np.testing.assert_allclose(changed[:, :5], base[:, :5], atol=1e-6)
    assert not np.allclose(changed[:, 5:], base[:, 5:])
    longer = jnp.pad(inputs, ((0, 0), (0, 3)))  # extra padding on the source
    np.testing.assert_allclose(m(longer, targets), base, atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_classifier_padding_invariance(pooling):
    m = build_model(_cfg(pooling=pooling), kind="classification", vocab_size=V, max_len=L, num_classes=10)
    x = _tokens(0, (2, 8), pad_from=5)
    out = m(x)
    assert out.shape == (2, 10)
    np.testing.assert_allclose(m(jnp.pad(x, ((0, 0), (0, 4)))), out, atol=1e-5)


def test_config_head_mask_equals_call_time_mask():
    masked = build_model(_cfg(kinds={"encoder_self": {"head_mask": "1,0,1,1;0,1,1,1"}}), kind="classification",
                         vocab_size=V, max_len=L, num_classes=3)
    plain = build_model(_cfg(), kind="classification", vocab_size=V, max_len=L, num_classes=3)
    x = _tokens(0, (2, 8))
    call_mask = {"encoder_self": jnp.array([[1.0, 0, 1, 1], [0, 1, 1, 1]])}  # (L, N)
    np.testing.assert_allclose(masked(x), plain(x, head_masks=call_mask), atol=1e-6)
    assert not np.allclose(plain(x), masked(x))
    with pytest.raises(ValueError, match="4 values per row"):
        build_model(_cfg(kinds={"encoder_self": {"head_mask": "1,0"}}), kind="classification", vocab_size=V,
                    max_len=L, num_classes=3)


def test_capture_sows_every_attention_kind():
    m = build_model(_cfg(), kind="translation", vocab_size=V, max_len=L)
    inputs, targets = _tokens(0, (2, 9)), _tokens(1, (2, 7))
    m(inputs, targets, Ctx(capture=True))
    inter = nnx.state(m, nnx.Intermediate)
    enc = inter["encoder"]["blocks"][0]["self_attn"]["attention_weights"][0]
    cross = inter["decoder"]["blocks"][1]["cross_attn"]["attention_weights"][0]
    heads = inter["decoder"]["blocks"][0]["self_attn"]["head_outputs"][0]
    assert enc.shape == (2, 4, 9, 9) and cross.shape == (2, 4, 7, 9) and heads.shape == (2, 7, 4, 8)
    np.testing.assert_allclose(enc.sum(-1), 1.0, atol=1e-5)


def test_param_count_and_head_dim():
    base = build_model(_cfg(), kind="translation", vocab_size=V, max_len=L)
    untied = build_model(_cfg(tie_embeddings=False), kind="translation", vocab_size=V, max_len=L)
    # untying adds a target embedding table (V x d) and an output projection (d x V + V)
    assert count_params(untied) - count_params(base) == V * 32 + 32 * V + V
    wide = build_model(_cfg(head_dim=16), kind="translation", vocab_size=V, max_len=L)
    assert wide.encoder.blocks[0].self_attn.query.kernel.shape == (32, 4, 16)
    assert count_params(base) == sum(x.size for x in jax.tree.leaves(nnx.state(base, nnx.Param)))


def test_greedy_decoding_with_and_without_cache_agree():
    """Kernels without a KV-cache mode decode by re-running the prefix; both give the same tokens."""
    from attn_lab.train.decode import compile_decode
    from attn_lab.train.steps import model_state

    m = build_model(_cfg(), kind="translation", vocab_size=V, max_len=L)
    graphdef, params, _ = nnx.split(m, nnx.Param, ...)
    state = {"params": nnx.to_pure_dict(params), "model_state": model_state(m)}
    inputs = _tokens(0, (3, 9), pad_from=5)
    cached = compile_decode(graphdef, 8, cached=True)(state, inputs)
    uncached = compile_decode(graphdef, 8, cached=False)(state, inputs)
    np.testing.assert_array_equal(cached, uncached)
    assert cached.shape == (3, 8) and (cached[:, 0] != 0).all()


def test_bfloat16_compute_keeps_float32_parameters_and_gradients_and_tracks_float32():
    """``model.dtype='bfloat16'``: activations in bf16, parameters (so optimizer state) and gradients float32; the
    logits stay within bf16 rounding of the float32 model with the same weights."""
    f32 = build_model(_cfg(num_layers=1), kind="translation", vocab_size=V, max_len=L)
    b16 = build_model(_cfg(num_layers=1, dtype="bfloat16"), kind="translation", vocab_size=V, max_len=L)
    assert {p.dtype for p in jax.tree.leaves(nnx.state(b16, nnx.Param))} == {jnp.dtype(jnp.float32)}
    x, y = _tokens(1, (2, 9), pad_from=6), _tokens(2, (2, 7))
    forward = nnx.jit(lambda m: m(x, y, Ctx()))
    ref, got = forward(f32), forward(b16)
    assert got.dtype == jnp.bfloat16 and ref.dtype == jnp.float32
    np.testing.assert_allclose(got.astype(jnp.float32), ref, atol=0.03 * float(jnp.abs(ref).max()))
    grads = nnx.jit(nnx.grad(lambda m: m(x, y, Ctx()).astype(jnp.float32).mean()))(b16)
    assert {g.dtype for g in jax.tree.leaves(nnx.state(grads))} == {jnp.dtype(jnp.float32)}
