"""Exact-attention dispatch (attn_lab/attention/dispatch.py): the cuDNN decision table, 'auto' == 'xla' on a CPU,
explicit 'cudnn' errors, the mask/window mappings cuDNN receives (run through XLA here), and capture, dropout and
head masks through the module on every CPU path against a naive O(T^2) reference.

Exactness comparisons run at float32 under ``jax.default_matmul_precision('highest')`` (stated per test), so they
hold on a GPU too, where float32 matmuls default to reduced precision.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.attention import MultiHeadAttention, dispatch
from attn_lab.attention.dense import xla_attention
from attn_lab.attention.dispatch import (
    choose,
    choose_fused,
    cudnn_attention,
    cudnn_refusal,
    describe_dispatch,
    fused_refusal,
)
from attn_lab.attention.local import local_attention, reach
from attn_lab.models import build_model
from attn_lab.train.config import base_config
from tests.helpers import call_kernel, make_kernel, split_qkv

B, T, N, H, D = 2, 9, 4, 8, 16
BF16 = jnp.bfloat16
GPU = dict(backend="gpu", dtype=BF16, head_dim=64)  # a call cuDNN takes; each row below changes one thing


def _qkv(t, s, num_kv_heads=N, seed=0, dtype=jnp.float32):
    return split_qkv(B, t, s, N, num_kv_heads, H, seed, dtype)


def _kernel_call(kernel, q, k, v, mask=None, is_causal=False):
    return call_kernel(kernel, q, k, v, mask, is_causal)[0]


def _kernel(spec, num_kv_heads=N, **context):
    return make_kernel(spec, N, num_kv_heads, H, **context)


# --- the decision table ----------------------------------------------------------------------------------------

TABLE = [  # (changes to GPU, None when cuDNN applies or a word of the reason)
    ({}, None),
    ({"dtype": jnp.float16}, None),
    ({"is_causal": True, "q_len": 16, "kv_len": 16}, None),
    ({"mask": "key_padding", "q_len": 16, "kv_len": 12}, None),  # any padding pattern: keys are reordered
    ({"is_causal": True, "window": (7, 0), "q_len": 16, "kv_len": 16}, None),  # local, causal w=8
    ({"head_dim": 256, "max_head_dim": 256}, None),  # Hopper
    ({"backend": "cpu"}, "backend cpu"),
    ({"backend": "rocm"}, "backend rocm"),
    ({"dtype": jnp.float32}, "dtype float32"),
    ({"head_dim": 160}, "head_dim 160"),
    ({"head_dim": 60}, "head_dim 60"),
    ({"mask": "general"}, "general"),
    ({"mask": "key_padding", "is_causal": True, "q_len": 16, "kv_len": 16}, "key padding"),
    ({"window": (4, 4)}, "two-sided"),
    ({"q_len": 1, "kv_len": 32}, "single query"),
    ({"is_causal": True, "q_len": 8, "kv_len": 16}, "q_len 8 != kv_len 16"),
]


@pytest.mark.parametrize("change,reason", TABLE)
def test_cudnn_refusal_table(change, reason):
    got = cudnn_refusal(**(GPU | change))
    assert got is None if reason is None else reason in got


@pytest.mark.parametrize("implementation", ["auto", "xla", "cudnn", "chunked"])
def test_weights_or_dropout_take_the_explicit_path(implementation):
    for refusal in (None, "backend cpu (cuDNN needs a CUDA GPU)"):
        assert choose(implementation, fallback="xla", needs_matrix=True, refusal=refusal,
                      allowed=("auto", "xla", "cudnn", "chunked")) == "explicit"


def test_choose_auto_and_explicit():
    opts = dict(fallback="xla", needs_matrix=False, allowed=("auto", "xla", "cudnn", "chunked"))
    assert choose("auto", refusal=None, **opts) == "cudnn"
    assert choose("auto", refusal="dtype float32", **opts) == "xla"
    assert choose("xla", refusal=None, **opts) == "xla"
    assert choose("chunked", refusal=None, **opts) == "chunked"
    with pytest.raises(ValueError, match="implementation='cudnn' cannot run here: dtype float32") as info:
        choose("cudnn", refusal="dtype float32", **opts)
    assert "\n" not in str(info.value) and "'auto'" in str(info.value) and "'xla'" in str(info.value)


@pytest.fixture
def fused_by_default(monkeypatch):
    """'auto' as it will dispatch once the fused kernel passed its GPU check (dispatch.FUSED_BY_DEFAULT)."""
    from attn_lab.attention import dispatch

    monkeypatch.setattr(dispatch, "FUSED_BY_DEFAULT", True)


def test_auto_keeps_the_xla_paths_on_a_gpu_until_the_fused_kernel_passed_a_gpu_check():
    """The fused kernels have not run on a GPU yet: 'auto' never picks them; 'fused' opts in."""
    causal = dict(backend="gpu", dtype=BF16, is_causal=True, q_len=16, kv_len=16)
    local = _kernel({"name": "local", "window": 4})
    assert local.dispatch(mask="key_padding", **causal) == "blockwise"
    assert local.dispatch(mask="none", **causal) == "cudnn"  # cuDNN's causal window: tested on GPUs before
    assert _kernel({"name": "local", "window": 4, "implementation": "fused_interpret"}).dispatch(
        mask="key_padding", **causal) == "fused_interpret"
    for name in ("strided", "longformer", "bigbird"):
        assert _kernel(name).dispatch(mask="key_padding", **causal) == "xla"
    opts = dict(fallback="xla", needs_matrix=False, allowed=("auto", "xla", "fused", "fused_interpret"))
    assert choose_fused("auto", backend="gpu", **opts) == "xla"
    assert choose_fused("fused", backend="gpu", **opts) == "fused"


def test_kernels_dispatch_on_gpu_facts(fused_by_default):
    dense, local = _kernel("dense"), _kernel({"name": "local", "window": 4})
    causal = dict(backend="gpu", dtype=BF16, is_causal=True, q_len=16, kv_len=16)
    assert dense.dispatch(mask="none", **causal) == "cudnn"
    assert dense.dispatch(mask="key_padding", **causal) == "xla"
    assert dense.dispatch(mask="key_padding", **causal | {"is_causal": False}) == "cudnn"
    assert dense.dispatch(mask="none", needs_matrix=True, **causal) == "explicit"
    assert local.dispatch(mask="none", **causal) == "cudnn"  # cuDNN's causal window is exact
    assert local.dispatch(mask="key_padding", **causal) == "fused"  # cuDNN cannot show the padding is a suffix
    assert local.dispatch(mask="none", **causal | {"is_causal": False}) == "fused"  # two-sided: never cuDNN
    assert local.dispatch(mask="none", **causal | {"dtype": jnp.float32}) == "fused"
    assert local.dispatch(mask="none", **causal | {"backend": "cpu"}) == "blockwise"
    assert local.dispatch(mask="none", needs_matrix=True, **causal) == "explicit"
    assert _kernel({"name": "local", "implementation": "blockwise"}).dispatch(mask="none", **causal) == "blockwise"
    assert _kernel({"name": "dense", "implementation": "chunked"}).dispatch(mask="none", **causal) == "chunked"
    for name in ("strided", "longformer", "bigbird"):
        sparse = _kernel(name)
        assert sparse.dispatch(mask="key_padding", **causal) == "fused"
        assert sparse.dispatch(mask="key_padding", **causal | {"backend": "cpu"}) == "xla"
        assert sparse.dispatch(mask="none", needs_matrix=True, **causal) == "explicit"


def test_choose_fused_table(fused_by_default):
    allowed = ("auto", "xla", "fused", "fused_interpret")
    opts = dict(fallback="xla", needs_matrix=False, allowed=allowed)
    assert fused_refusal("gpu") is None and "backend rocm" in fused_refusal("rocm")
    assert choose_fused("auto", backend="gpu", **opts) == "fused"
    assert choose_fused("auto", backend="cpu", **opts) == "xla"
    assert choose_fused("auto", backend="tpu", **opts) == "xla"
    assert choose_fused("fused_interpret", backend="cpu", **opts) == "fused_interpret"
    assert choose_fused("xla", backend="gpu", **opts) == "xla"
    assert choose_fused("fused", backend="gpu", needs_matrix=True, fallback="xla", allowed=allowed) == "explicit"
    with pytest.raises(ValueError, match=r"implementation='fused' cannot run here: backend tpu") as info:
        choose_fused("fused", backend="tpu", **opts)
    assert "\n" not in str(info.value) and "'fused_interpret'" in str(info.value)


def test_cudnn_never_gets_a_window_without_the_causal_mask():
    """jax hands cuDNN ``local_window_size=(L, 0)`` without ``is_causal`` as a left-only window over *all later*
    keys too: cudnn_attention refuses it instead of computing something else than the band."""
    q, k, v = _qkv(T, T)
    with pytest.raises(ValueError, match=r"window \(4, 0\) without is_causal"):
        cudnn_attention(q.astype(BF16), k.astype(BF16), v.astype(BF16), window=(4, 0))


# --- on this CPU: 'auto' is XLA, explicit 'cudnn' is an error --------------------------------------------------

def _masks(t, s):
    valid = jnp.arange(s)[None, :] < jnp.array([[s], [s - 3]])  # (B, S)
    general = jnp.tril(jnp.ones((t, s), bool))[None, None] & valid[:, None, None, :]  # (B, 1, T, S)
    return {"none": None, "key_padding": valid[:, None, None, :], "general": general}


@pytest.mark.parametrize("mask", ["none", "key_padding", "general"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_auto_equals_xla_exactly_on_cpu(mask, is_causal):
    q, k, v = _qkv(T, T, 2)
    m = _masks(T, T)[mask]
    auto = _kernel_call(_kernel("dense", 2), q, k, v, mask=m, is_causal=is_causal)
    xla = _kernel_call(_kernel({"name": "dense", "implementation": "xla"}, 2), q, k, v, mask=m, is_causal=is_causal)
    np.testing.assert_array_equal(auto, xla)


@pytest.mark.parametrize("spec", [{"name": "dense", "implementation": "cudnn"},
                                  {"name": "local", "implementation": "cudnn"}])
def test_explicit_cudnn_on_cpu_is_one_line_at_construction(spec):
    for build in (lambda: _kernel(spec),
                  lambda: MultiHeadAttention(N, D, attention=spec, rngs=nnx.Rngs(0))):
        with pytest.raises(ValueError, match=r"attention.implementation='cudnn' cannot run here: backend cpu") as e:
            build()
        assert "\n" not in str(e.value)


def test_explicit_cudnn_never_falls_back(monkeypatch):
    """With the backend reported as a GPU: a float32 or general-mask call raises instead of running XLA, and an
    'auto' bf16 call really goes to cuDNN (which this CPU then lacks)."""
    monkeypatch.setattr(dispatch, "current_backend", lambda: "gpu")
    with pytest.raises(ValueError, match="dtype float32"):
        _kernel({"name": "dense", "implementation": "cudnn"}, dtype=jnp.float32)  # dtype known when built
    kernel = _kernel({"name": "dense", "implementation": "cudnn"})
    q, k, v = _qkv(T, T)
    with pytest.raises(ValueError, match="cannot run here: dtype float32"):
        _kernel_call(kernel, q, k, v)
    qb, kb, vb = _qkv(T, T, dtype=BF16)
    with pytest.raises(ValueError, match="general"):
        _kernel_call(kernel, qb, kb, vb, mask=_masks(T, T)["general"])
    with pytest.raises(ValueError, match="two-sided"):
        _kernel_call(_kernel({"name": "local", "implementation": "cudnn", "window": 4}), qb, kb, vb)
    for spec, causal in (("dense", False), ({"name": "local", "window": 4}, True)):
        with pytest.raises(Exception, match="cuDNN"):  # routed to cuDNN: "cuDNN is not detected" on a CPU
            _kernel_call(_kernel(spec), qb, kb, vb, is_causal=causal)
    assert _kernel_call(_kernel("dense"), q, k, v).shape == (B, T, N, H)  # float32 'auto': XLA


# --- what cuDNN receives, checked through XLA -------------------------------------------------------------------

def test_key_padding_as_sorted_lengths_is_exact(num_kv_heads=2):
    """Any key-padding pattern (holes, an empty row) as reordered keys + lengths equals the masked softmax, in value
    and gradient (float32, highest matmul precision)."""
    s = 7
    q, k, v = _qkv(T, s, num_kv_heads)
    valid = jnp.array([[True, False, True, True, False, True, False], [False] * s])  # (B, S); row 1: no key
    mask = valid[:, None, None, :]  # (B, 1, 1, S)
    ours = lambda q, k, v: cudnn_attention(q, k, v, key_valid=valid, implementation="xla")
    ref = lambda q, k, v: xla_attention(q, k, v, mask=mask, is_causal=False)
    ct = jax.random.normal(jax.random.key(5), q.shape)
    value_and_grads = jax.jit(lambda f, *a: (lambda out, vjp: (out, vjp(ct)))(*jax.vjp(f, *a)), static_argnums=0)
    with jax.default_matmul_precision("highest"):
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5), value_and_grads(ours, q, k, v),
                     value_and_grads(ref, q, k, v))


@pytest.mark.parametrize("window", [1, 5, 30])
@pytest.mark.parametrize("is_causal", [False, True])
def test_local_window_maps_to_local_window_size(window, is_causal):
    """``reach`` is exactly the band of ``local_window_size`` (with ``is_causal`` for causal windows), so the cuDNN
    path computes the blockwise kernel's band. Float32, highest matmul precision."""
    t = 13
    q, k, v = _qkv(t, t, 2)
    both = jax.jit(lambda q, k, v: (
        cudnn_attention(q, k, v, is_causal=is_causal, window=reach(window, is_causal), implementation="xla"),
        local_attention(q, k, v, window=window, is_causal=is_causal)))
    with jax.default_matmul_precision("highest"):
        ours, ref = both(q, k, v)
    np.testing.assert_allclose(ours, ref, atol=1e-5)


# --- capture, dropout, head masks through the module, against a naive reference ---------------------------------

def _naive(m, x, *, mask, is_causal, head_mask, band=None, drop_key=None, rate=0.0):
    """The whole module written out: projections, masked softmax ``[B, N, T, S]``, flax-style broadcast dropout
    on the weights, head mask, output projection. Returns ``(out, weights)``."""
    proj = lambda lin, h: jnp.einsum("btd,dnh->btnh", h, lin.kernel[...]) + lin.bias[...]
    q, k, v = proj(m.query, x), proj(m.key, x), proj(m.value, x)  # (B, T, N|K, H)
    g = m.num_heads // m.num_kv_heads
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)  # (B, T, N, H)
    logits = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])  # (B, N, T, T)
    t = x.shape[1]
    keep = jnp.ones((1, 1, t, t), bool) if mask is None else mask
    keep = keep & jnp.tril(jnp.ones((t, t), bool)) if is_causal else keep
    logits = jnp.where(keep, logits, jnp.finfo(jnp.float32).min)  # a row with nothing visible: uniform weights
    if band is not None:  # ... over its band only: keys out of the band get weight exactly 0
        logits = jnp.where(band, logits, -jnp.inf)
    weights = jax.nn.softmax(logits, axis=-1)  # (B, N, T, T)
    probs = weights
    if drop_key is not None:
        kept = jax.random.bernoulli(drop_key, 1.0 - rate, (1, 1, t, t))
        probs = jnp.where(kept, weights / (1.0 - rate), 0.0)
    heads = jnp.einsum("bnts,bsnh->btnh", probs, v) * head_mask[None, None, :, None]  # (B, T, N, H)
    return jnp.einsum("btnh,nhd->btd", heads, m.out.kernel[...]) + m.out.bias[...], weights


CASES = [  # (kernel, options, capture): capture takes the explicit path whatever the implementation
    ("dense", {}, False), ("dense", {}, True), ("dense", {"implementation": "xla"}, False),
    ("dense", {"implementation": "chunked"}, False), ("local", {"window": 4}, False), ("local", {"window": 4}, True),
    ("local", {"window": 4, "implementation": "blockwise"}, False)]


@pytest.mark.parametrize("name,options,sow", CASES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_capture_and_head_mask_on_every_cpu_path(name, options, sow, is_causal):
    """Float32, highest matmul precision: output, captured weights and head mask equal the naive module."""
    m = MultiHeadAttention(N, D, num_kv_heads=2, attention={"name": name, **options}, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (B, T, D))
    mask = _masks(T, T)["key_padding"]  # (B, 1, 1, T)
    head_mask = jnp.array([1.0, 0.0, 0.5, 1.0])
    band = None
    if name == "local":
        back, forward = reach(4, is_causal)
        offset = jnp.arange(T)[:, None] - jnp.arange(T)[None, :]
        band = (offset <= back) & (offset >= -forward)  # (T, T)
    with jax.default_matmul_precision("highest"):
        out = m(x, mask=mask, is_causal=is_causal, head_mask=head_mask, sow_weights=sow)
        ref, ref_weights = _naive(m, x, mask=mask, is_causal=is_causal, head_mask=head_mask, band=band)
    np.testing.assert_allclose(out, ref, atol=1e-5)
    if sow:
        np.testing.assert_allclose(nnx.pop(m, nnx.Intermediate)["attention_weights"][0], ref_weights, atol=1e-6)


@pytest.mark.parametrize("implementation", ["auto", "xla", "cudnn", "chunked"])
def test_dropout_on_weights_on_every_path(implementation, monkeypatch):
    """Training calls drop attention weights (one mask shared over the batch, as flax) whatever the implementation;
    eval calls equal the naive module. 'cudnn' is built as on a GPU: dropout needs the matrix, so it takes the
    explicit path. Float32, highest matmul precision."""
    monkeypatch.setattr(dispatch, "current_backend", lambda: "gpu")
    m = MultiHeadAttention(N, D, head_dim=H, attention={"name": "dense", "implementation": implementation},
                           dropout_rate=0.5, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (B, T, D))
    mask, ones = _masks(T, T)["key_padding"], jnp.ones(N)
    with jax.default_matmul_precision("highest"):
        train = m(x, mask=mask, head_mask=ones, deterministic=False, rngs=nnx.Rngs(dropout=7))
        ref, _ = _naive(m, x, mask=mask, is_causal=False, head_mask=ones, drop_key=nnx.Rngs(dropout=7).dropout(),
                        rate=0.5)
        np.testing.assert_allclose(train, ref, atol=1e-5)
        if implementation != "cudnn":  # eval float32 on a pretended GPU: explicit 'cudnn' refuses, as it should
            ref, _ = _naive(m, x, mask=mask, is_causal=False, head_mask=ones)
            np.testing.assert_allclose(m(x, mask=mask, deterministic=True), ref, atol=1e-5)


# --- the log line ----------------------------------------------------------------------------------------------

def _model(kind="translation", **model):
    cfg = base_config().model
    cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.mlp_dim = 1, 32, 4, 64
    cfg.update(model)
    return build_model(cfg, kind=kind, vocab_size=13, max_len=8, num_classes=3)


def test_describe_dispatch_is_one_line_per_model():
    assert describe_dispatch(_model()) == ("attention: encoder_self=dense/xla, decoder_self=dense/xla, "
                                           "cross=dense/xla (backend cpu)")
    assert describe_dispatch(_model(dtype="bfloat16"), backend="gpu") == (
        "attention: encoder_self=dense/cudnn, decoder_self=dense/cudnn, cross=dense/cudnn (backend gpu)")
    local = _model(dtype="bfloat16", kinds={"encoder_self": {"attention": "local"},
                                            "decoder_self": {"attention": "local"}})
    assert describe_dispatch(local, backend="gpu") == (
        "attention: encoder_self=local/blockwise, decoder_self=local/cudnn, cross=dense/cudnn (backend gpu)")
    assert describe_dispatch(local) == (
        "attention: encoder_self=local/blockwise, decoder_self=local/blockwise, cross=dense/xla (backend cpu)")
    bigbird = _model(kinds={"encoder_self": {"attention": "bigbird"}})
    assert describe_dispatch(bigbird, backend="gpu").startswith("attention: encoder_self=bigbird/xla, ")
    assert describe_dispatch(bigbird).startswith("attention: encoder_self=bigbird/xla, ")
    fused = _model(dtype="bfloat16", kinds={"encoder_self": {"attention": "local"}})
    fused.encoder.blocks[0].self_attn.kernel.implementation = "fused_interpret"  # the line names tile and why
    assert describe_dispatch(fused).startswith("attention: encoder_self=local/fused_interpret[block 64, head dim 16 "
                                               "bfloat16: forward 64x2, dq 64x2, dkdv 64x2 within 227 KiB], ")
    dropout = describe_dispatch(_model("classification", attention_dropout=0.1))
    assert dropout == "attention: encoder_self=dense/explicit(train)+xla(eval) (backend cpu)"
