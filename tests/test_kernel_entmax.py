"""The entmax kernel (Peters et al. 2019; Correia et al. 2019) against independent references.

References: optax's Euclidean projection onto the simplex (= sparsemax, alpha = 2), ``jax.nn.softmax`` (alpha -> 1),
and a float64 numpy bisection on the threshold written out here (:func:`_bisect_ref`, not the module's), for the
exact alpha = 1.5 path and for the bisection path alike. Gradients (in the logits and in alpha) against central
finite differences in float64 (``jax.enable_x64``) and against ``jax.grad`` of optax's projection. The kernel inside
MultiHeadAttention against a naive O(T^2) float64 numpy computation from the module's own parameters.

Precision: every test runs under 'highest' matmul precision (tests/conftest.py), so float32 comparisons at 1e-5
hold on a GPU (TF32 by default) too; the references do no JAX matmul at all.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from optax.projections import projection_simplex

from attn_lab.attention import MultiHeadAttention
from attn_lab.attention.dense import DenseAttention
from attn_lab.attention.entmax import entmax, entmax15, sparsemax
from tests.helpers import CALL, make_kernel, np_randn_host

B, N, K, T, S, H = 2, 4, 2, 64, 128, 32  # batch, query heads, key/value heads, queries, keys, head_dim
D = N * H
PER_HEAD = np.array([1.2, 1.5, 1.8, 2.0]).reshape(1, N, 1, 1)  # one alpha per head, bisection path


def _logits(seed=0, shape=(B, N, T, S)):
    """Logits of the spread attention produces (std 2: sparse rows, some support of several keys)."""
    return np_randn_host(seed, shape, 2.0)


def _keep(seed=1, shape=(B, N, T, S)):
    """Random key mask, each row keeping its first key and about half the others."""
    return (np.random.default_rng(seed).random(shape) < 0.5) | (np.arange(shape[-1]) == 0)


def _bisect_ref(z, alpha, keep=None, iters=100):
    """alpha-entmax over the last axis in float64 numpy: ``p = [(alpha-1) z - tau]_+^(1/(alpha-1))`` with ``tau``
    found by bisection between ``max - 1`` (sum >= 1) and ``max`` (sum 0); masked entries are left out."""
    z = np.asarray(z, np.float64)
    alpha = np.broadcast_to(np.asarray(alpha, np.float64), z.shape[:-1] + (1,))
    keep = np.ones(z.shape, bool) if keep is None else np.broadcast_to(keep, z.shape)
    x = np.where(keep, (alpha - 1) * z, -np.inf)
    hi = x.max(-1, keepdims=True)
    lo = hi - 1
    for _ in range(iters):
        mid = (lo + hi) / 2
        big = (np.maximum(x - mid, 0) ** (1 / (alpha - 1))).sum(-1, keepdims=True) >= 1
        lo, hi = np.where(big, mid, lo), np.where(big, hi, mid)
    p = np.maximum(x - lo, 0) ** (1 / (alpha - 1))
    return p / p.sum(-1, keepdims=True)


def _assert_same_support(p, ref):
    """Exact zeros where the reference has them; positive weights wherever the reference is not tiny (the weight
    of a key at distance d above the threshold is d^(1/(alpha-1)): near-threshold keys are within float error)."""
    p = np.asarray(p)
    assert np.all(p[ref == 0.0] == 0.0) and np.all(p[ref > 1e-9] > 0.0)


# --- the pure functions ----------------------------------------------------------------------------------------

def test_sparsemax_is_the_euclidean_projection_onto_the_simplex():
    z = _logits()
    project = jax.vmap(projection_simplex)
    ref = np.asarray(project(z.reshape(-1, S))).reshape(z.shape)
    for p in (sparsemax(z), entmax(z, 2.0), entmax(z, jnp.asarray(2.0))):  # exact, exact, bisection
        np.testing.assert_allclose(p, ref, atol=1e-6)
    assert np.mean(np.asarray(sparsemax(z)) == 0.0) > 0.5
    w = np_randn_host(5, z.shape)
    ours = jax.grad(lambda z: (sparsemax(z) * w).sum())(z)
    theirs = jax.grad(lambda z: (project(z.reshape(-1, S)).reshape(z.shape) * w).sum())(z)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_alpha_near_one_approaches_softmax():
    z = _logits()
    soft = np.asarray(jax.nn.softmax(z))
    errors = [float(np.abs(entmax(z, a) - soft).max()) for a in (1.1, 1.01, 1.001)]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 5e-3, errors


def test_entmax15_exact_path_matches_bisection():
    z = _logits()
    ref = _bisect_ref(z, 1.5)
    for p in (entmax15(z), entmax(z, 1.5)):
        np.testing.assert_allclose(p, ref, atol=1e-6)
        _assert_same_support(p, ref)
    assert np.mean(np.asarray(entmax15(z)) == 0.0) > 0.3


@pytest.mark.parametrize("alpha", [1.3, 1.7, PER_HEAD], ids=["1.3", "1.7", "per-head"])
def test_bisection_matches_test_bisection(alpha):
    z = _logits()
    ref = _bisect_ref(z, alpha)
    p = entmax(z, alpha if isinstance(alpha, float) else jnp.asarray(alpha, jnp.float32))
    np.testing.assert_allclose(p, ref, atol=2e-6)
    _assert_same_support(p, ref)


@pytest.mark.parametrize("alpha", [1.1, 1.5, PER_HEAD], ids=["1.1", "1.5", "per-head"])
def test_25_bisection_steps_reach_float32_resolution(alpha):
    """25 halvings of tau's interval (at most 1 wide) already meet the float64 reference as 50 do, support and all:
    what lets experiments/dynamic.py train learned alphas with 25. (15 steps miss it by 1e-5 to 5e-5.)"""
    z, keep = _logits(), _keep()
    a = jnp.asarray(np.broadcast_to(alpha, (1, N, 1, 1)), jnp.float32)  # an array alpha: the bisection path
    ref = _bisect_ref(z, np.broadcast_to(alpha, (1, N, 1, 1)), keep)
    p = entmax(z, a, where=keep, n_iter=25)
    np.testing.assert_allclose(p, ref, atol=2e-6)
    _assert_same_support(p, ref)
    np.testing.assert_allclose(p, entmax(z, a, where=keep, n_iter=50), atol=1e-6)


@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.3, PER_HEAD], ids=["2", "1.5", "1.3", "per-head"])
def test_masked_entries_are_exact_zeros_whatever_their_logits(alpha):
    """Masked entries with the largest logits still get exactly 0, never join the support, sum to one."""
    z, keep = _logits(), _keep()
    z_high = np.where(keep, z, 50.0)
    a = alpha if isinstance(alpha, float) else jnp.asarray(alpha, jnp.float32)
    p = np.asarray(entmax(z_high, a, where=keep))
    assert np.all(p[~keep] == 0.0) and np.any(p[keep] == 0.0)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(p, _bisect_ref(z, alpha, keep), atol=2e-6)
    np.testing.assert_allclose(p, entmax(z, a, where=keep), atol=0)  # masked logits do not matter at all


def test_axis_argument():
    z = _logits(shape=(3, 5, 40))
    np.testing.assert_allclose(entmax(z, 1.5, axis=1), np.moveaxis(entmax15(np.moveaxis(z, 1, -1)), -1, 1),
                               atol=0)
    alpha = np.array([1.3, 1.6, 1.9]).reshape(3, 1, 1)
    np.testing.assert_allclose(entmax(z, jnp.asarray(alpha, jnp.float32), axis=1),
                               np.moveaxis(_bisect_ref(np.moveaxis(z, 1, -1), alpha), -1, 1), atol=2e-6)


# --- gradients -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.3, PER_HEAD], ids=["2", "1.5", "1.3", "per-head"])
def test_logit_gradient_matches_finite_differences(alpha):
    """Directional derivatives of ``<w, entmax(z)>`` (masked) in float64: custom JVP vs central differences."""
    with jax.enable_x64(True):
        z, keep, w = _logits().astype(np.float64), _keep(), np_randn_host(5, (B, N, T, S), dtype=np.float64)
        a = alpha if isinstance(alpha, float) else jnp.asarray(alpha)
        f = jax.jit(lambda z: (entmax(z, a, where=keep, n_iter=100) * w).sum())
        grad = np.asarray(jax.grad(f)(z))
        assert np.all(grad[~keep] == 0.0)
        eps = 1e-6
        for seed in range(3):
            v = np_randn_host(10 + seed, z.shape, dtype=np.float64)
            fd = (f(z + eps * v) - f(z - eps * v)) / (2 * eps)
            np.testing.assert_allclose(np.sum(grad * v), fd, rtol=1e-6)


def test_alpha_gradient_matches_finite_differences():
    """d<w, entmax(z, alpha)>/d alpha per head (Correia et al.'s closed form) vs central differences, float64."""
    with jax.enable_x64(True):
        z, keep, w = _logits().astype(np.float64), _keep(), np_randn_host(5, (B, N, T, S), dtype=np.float64)
        f = jax.jit(lambda a: (entmax(z, a, where=keep, n_iter=100) * w).sum())
        alpha = jnp.asarray(np.array([1.2, 1.5, 1.8, 1.99]).reshape(1, N, 1, 1))
        grad = np.asarray(jax.grad(f)(alpha)).ravel()
        eps = 1e-6
        for h in range(N):
            step = np.eye(N)[h].reshape(1, N, 1, 1) * eps
            fd = (f(alpha + step) - f(alpha - step)) / (2 * eps)
            np.testing.assert_allclose(grad[h], fd, rtol=1e-6, atol=1e-8)
        assert np.all(np.abs(grad) > 0)


# --- the kernel and the module -----------------------------------------------------------------------------------

def _module(num_kv_heads=K, **options):
    return MultiHeadAttention(N, D, num_kv_heads=num_kv_heads, attention={"name": "entmax", **options},
                              decode=False, rngs=nnx.Rngs(0))


def _naive(m, xq, xkv, keep):
    """Output and weights in float64 numpy from the module's parameters: projections, grouped heads, scaled logits,
    entmax by the test bisection with the kernel's per-head alphas, weighted values, output projection."""
    p = {name: {k[0]: np.asarray(v[...], np.float64) for k, v in nnx.to_flat_state(nnx.state(getattr(m, name)))}
         for name in ("query", "key", "value", "out")}
    proj = lambda x, n: np.einsum("btd,dnh->btnh", np.asarray(x, np.float64), p[n]["kernel"]) + p[n]["bias"]
    q, k, v = proj(xq, "query"), proj(xkv, "key"), proj(xkv, "value")
    k, v = (np.repeat(a, N // a.shape[2], axis=2) for a in (k, v))  # query head n uses key/value head n // G
    logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(H)
    weights = _bisect_ref(logits, np.asarray(m.kernel.alphas()).reshape(1, N, 1, 1), keep)
    heads = np.einsum("bnts,bsnh->btnh", weights, v)
    return np.einsum("btnh,nhd->btd", heads, p["out"]["kernel"]) + p["out"]["bias"], weights


OPTIONS = {"1.5": {}, "2": {"alpha": 2.0}, "1.3": {"alpha": 1.3}, "learned": {"learn_alpha": True}}


@pytest.mark.parametrize("options", list(OPTIONS), ids=list(OPTIONS))
@pytest.mark.parametrize("case", ["causal_padding", "cross_padding"])
def test_module_matches_naive_reference(options, case):
    m = _module(**OPTIONS[options])
    if options == "learned":  # distinct heads, as after training
        m.kernel.alpha_logit[...] = jnp.asarray([-2.0, -0.5, 0.5, 3.0])
    xq = np_randn_host(1, (B, T, D))
    xkv = xq if case == "causal_padding" else np_randn_host(2, (B, S, D))
    s = xkv.shape[1]
    valid = np.arange(s)[None, :] < np.array([[s], [s - 9]])  # (B, S): batch 1 has 9 padded keys
    mask = valid[:, None, None, :]  # (B, 1, 1, S)
    causal = case == "causal_padding"
    keep = mask & (np.tril(np.ones((T, s), bool)) if causal else True)  # (B, 1, T, S)
    out = m(xq, xkv, mask=jnp.asarray(mask), is_causal=causal, sow_weights=True)
    weights = np.asarray(nnx.pop(m, nnx.Intermediate)["attention_weights"][0])  # (B, N, T, S)
    ref_out, ref_w = _naive(m, xq, xkv, keep)
    np.testing.assert_allclose(out, ref_out, atol=2e-5)
    np.testing.assert_allclose(weights, ref_w, atol=2e-6)
    assert np.all(weights[~np.broadcast_to(keep, weights.shape)] == 0.0)
    assert np.any(weights[np.broadcast_to(keep, weights.shape)] == 0.0)  # true zeros among visible keys too


def _kernel(**options):
    return make_kernel({"name": "entmax", **options}, N, K, H, rng_seed=0)


@nnx.jit
def _forward(kernel, q, k, v):
    return kernel(q, k, v, mask=None, is_causal=True, need_weights=False, **CALL)[0]


@pytest.mark.parametrize("options", list(OPTIONS), ids=list(OPTIONS))
def test_causal_outputs_ignore_later_keys_and_values_exactly(options):
    """Keys and values after t replaced by larger, shifted draws: outputs 0..t are bit-identical."""
    kernel = _kernel(**OPTIONS[options])
    q, k, v = np_randn_host(1, (B, S, N, H), 1.5), np_randn_host(2, (B, S, K, H), 1.5), np_randn_host(3, (B, S, K, H))
    base = np.asarray(_forward(kernel, q, k, v))
    for t in (0, 31, 100):
        later = (np.arange(S) > t)[None, :, None, None]
        k2 = np.where(later, 3 * np_randn_host(t, k.shape) + 5, k)
        v2 = np.where(later, 3 * np_randn_host(t + 1, v.shape) + 5, v)
        np.testing.assert_array_equal(np.asarray(_forward(kernel, q, k2, v2))[:, :t + 1], base[:, :t + 1])


@pytest.mark.parametrize("options", ["2", "learned"])
def test_decode_equals_causal_forward(options):
    m = _module(**OPTIONS[options])
    x = np_randn_host(1, (B, 16, D))
    full = m(x, is_causal=True)
    m.init_cache(x.shape)
    steps = [m(x[:, i:i + 1], decode=True) for i in range(x.shape[1])]
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


def test_learned_alpha_stays_in_range_after_big_steps():
    """alpha = 1.01 + 0.99 sigmoid(a) for any a: huge gradient steps either way keep every head in (1, 2]."""
    m = _module(learn_alpha=True)
    x = np_randn_host(1, (B, 32, D))
    np.testing.assert_allclose(m.kernel.alphas(), np.full(N, 1.5), atol=1e-6)
    grad_a = lambda m: nnx.grad(lambda m: (m(x, is_causal=True) ** 2).sum())(m).kernel.alpha_logit[...]
    g = np.asarray(grad_a(m))
    assert np.all(np.isfinite(g)) and np.all(g != 0.0)
    for sign in (1.0, -1.0):
        for _ in range(3):
            m.kernel.alpha_logit[...] = m.kernel.alpha_logit[...] + sign * 1e4 * jnp.sign(g + 1e-30)
        alphas = np.asarray(m.kernel.alphas())
        assert np.all((alphas > 1.0) & (alphas <= 2.0)), alphas
        assert np.all(np.isfinite(m(x, is_causal=True))) and np.all(np.isfinite(grad_a(m)))


def test_alphas_and_state():
    fixed = _kernel(alpha=1.7)
    np.testing.assert_array_equal(fixed.alphas(), np.full(N, 1.7, np.float32))
    assert not jax.tree.leaves(nnx.state(fixed))  # no variables: keep_heads can prune heads
    assert _module(alpha=2.0, num_kv_heads=N).keep_heads([0, 2]).kernel.alphas().shape == (2,)
    learned = _kernel(alpha=1.3, learn_alpha=True)
    assert learned.alpha_logit.shape == (N,)
    np.testing.assert_allclose(learned.alphas(), np.full(N, 1.3), atol=1e-6)


def test_half_precision_inputs_normalize_in_float32():
    q, k, v = (jnp.asarray(np_randn_host(i, (B, S, n, H)), jnp.bfloat16) for i, n in ((1, N), (2, K), (3, K)))
    out, weights = _kernel()(q, k, v, mask=None, is_causal=True, need_weights=True, **CALL)
    assert out.dtype == weights.dtype == jnp.bfloat16
    kg = jnp.repeat(k, N // K, axis=2)
    logits = jnp.einsum("btnh,bsnh->bnts", q / jnp.sqrt(H).astype(q.dtype), kg)  # bf16, as the kernel's
    causal = np.tril(np.ones((S, S), bool))
    expected = entmax15(logits.astype(jnp.float32), where=causal).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(weights, np.float32), np.asarray(expected, np.float32))


def test_fully_masked_rows_average_uniformly_like_dense():
    q, k, v = np_randn_host(1, (B, T, N, H)), np_randn_host(2, (B, T, K, H)), np_randn_host(3, (B, T, K, H))
    mask = np.ones((B, 1, T, T), bool)
    mask[:, :, 5] = False  # query 5 sees no key
    ours, dense = _kernel(), DenseAttention(num_heads=N, num_kv_heads=K, head_dim=H, implementation="xla")
    out, w = ours(q, k, v, mask=jnp.asarray(mask), is_causal=False, need_weights=True, **CALL)
    np.testing.assert_allclose(w[:, :, 5], 1.0 / T, atol=1e-7)
    ref, _ = dense(q, k, v, mask=jnp.asarray(mask), is_causal=False, need_weights=False, **CALL)
    np.testing.assert_allclose(out[:, 5], ref[:, 5], atol=1e-6)
    loss = lambda q, k, v: (ours(q, k, v, mask=jnp.asarray(mask), is_causal=True, need_weights=False,
                                 **CALL)[0] ** 2).sum()
    assert all(np.all(np.isfinite(g)) for g in jax.grad(loss, argnums=(0, 1, 2))(q, k, v))


def test_attention_dropout_drops_entmax_weights():
    m = MultiHeadAttention(N, D, attention={"name": "entmax", "alpha": 1.3}, dropout_rate=0.5,
                           rngs=nnx.Rngs(0, dropout=1))
    x = np_randn_host(1, (B, 16, D))
    eval_a, eval_b = m(x, deterministic=True), m(x, deterministic=True)
    np.testing.assert_array_equal(eval_a, eval_b)
    assert not np.allclose(m(x, deterministic=False), eval_a)


BAD = [({"alpha": 1.0}, "attention.alpha must be a number in (1, 2]", "1.0"),
       ({"alpha": 0.5}, "attention.alpha must be a number in (1, 2]", "0.5"),
       ({"alpha": 2.5}, "attention.alpha must be a number in (1, 2]", "2.5"),
       ({"alpha": float("nan")}, "attention.alpha must be a number in (1, 2]", "nan"),
       ({"alpha": "1.5"}, "attention.alpha must be a number in (1, 2]", "'1.5'"),
       ({"alpha": True}, "attention.alpha must be a number in (1, 2]", "True"),
       ({"learn_alpha": "yes"}, "attention.learn_alpha must be True or False", "'yes'"),
       ({"learn_alpha": True, "alpha": 2.0}, "attention.alpha must be in (1.01, 2) with attention.learn_alpha",
        "2.0"),
       ({"learn_alpha": True, "alpha": 1.005}, "attention.alpha must be in (1.01, 2)", "1.005"),
       ({"n_iter": 0}, "attention.n_iter must be a positive integer", "0"),
       ({"n_iter": 2.5}, "attention.n_iter must be a positive integer", "2.5")]


@pytest.mark.parametrize("options, message, value", BAD, ids=[str(b[0]) for b in BAD])
def test_bad_options_are_one_line_errors(options, message, value):
    with pytest.raises(ValueError) as info:
        _module(**options)
    text = str(info.value)
    assert message in text and text.endswith(f"got {value}") and "\n" not in text
