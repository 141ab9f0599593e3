"""No kernel in causal use lets an output depend on a later position, checked by value (not by gradient).

A gradient test cannot see dependence through non-differentiable or ``stop_gradient`` paths -- a stabilizing
maximum over all keys, a hash that decides which keys a query reaches -- so here keys and values (and, as a
self-attention layer sees them, queries too) after position ``t`` are replaced by very different ones, and every
output up to ``t`` must stay the same to float precision (measured on CPU: bit-identical for every kernel that
passes; the tolerance is 1e-6 of the output's size).
Same in decode through the module's KV cache, where slots not yet written must not matter either.

Every registered kernel whose ``supports_causal`` (``supports_decode``) flag is set is tested, with its default
options plus a small setting where the default block, chunk or window would cover the whole test sequence (so the
paths that cross block boundaries run). Precision: all matmuls at 'highest' (tests/conftest.py).
"""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.attention import KERNELS, MultiHeadAttention
from tests.helpers import call_kernel, make_kernel, np_randn, seeded_qkv

B, T, N, K, H, D = 2, 24, 4, 2, 16, 32  # 24 positions: several chunks/blocks of 4..8; grouped query (2 per kv head)
CUTS = (0, 5, 11, 17)  # positions t: outputs 0..t must not see t+1..T-1

# Settings whose structure is smaller than T (default options come first for every kernel). A kernel missing here
# is tested with its defaults only.
SMALL = {
    "dense": [{"implementation": "chunked", "chunk_size": 8}],
    "linear": [{"chunk_size": 5}, {"chunk_size": 0}],
    "performer": [{"num_features": 32, "chunk_size": 5}, {"num_features": 32, "chunk_size": 0},
                  {"num_features": 32, "chunk_size": 5, "features": "trig"}],
    "local": [{"window": 4}, {"window": 4, "implementation": "blockwise"}],
    "lsh": [{"bucket_size": 4, "n_buckets": 2}, {"bucket_size": 4, "shared_qk": False, "n_hashes": 2}],
    "strided": [{"stride": 4}, {"stride": 4, "pattern": "fixed"}],
    "longformer": [{"window": 4}],
    "bigbird": [{"block_size": 4}],
}
# Kernels whose causal mode leaks by design; each case xfails with the reason (strict: a fix must remove it).
KNOWN_LEAKS = {
    "lsh": "LSH (Reformer) causal: which earlier keys a query reaches depends on how later positions hash and "
           "sort (they shift chunk boundaries), as in the paper and documented in lsh.py; measured: earlier "
           "outputs move by up to ~1 (shared QK: when later queries change) and ~3.9 (separate keys)",
}


def _cases(flag, small=True, dtypes=False):
    """pytest params ``spec`` (and ``dtype``: float32 for every setting, bfloat16 for the defaults) of every
    registered kernel with capability ``flag``; ``small=False`` keeps the defaults only."""
    cases = []
    for name in sorted(KERNELS):
        if not getattr(KERNELS[name], flag):
            continue
        for i, options in enumerate([{}] + (SMALL.get(name, []) if small else [])):
            leaks = name in KNOWN_LEAKS and i > 0  # defaults: one LSH chunk covers the test sequence, no leak
            marks = [pytest.mark.xfail(reason=KNOWN_LEAKS[name], strict=True)] if leaks else []
            label = name + "".join(f"-{k}={v}" for k, v in options.items())
            spec = {"name": name, **options}
            if not dtypes:
                cases.append(pytest.param(spec, id=label, marks=marks))
                continue
            for dtype in [jnp.float32] + ([jnp.bfloat16] if i == 0 else []):
                cases.append(pytest.param(spec, dtype, id=f"{label}-{jnp.dtype(dtype).name}", marks=marks))
    return cases


def test_small_settings_name_registered_kernels():
    assert set(SMALL) <= set(KERNELS) and set(KNOWN_LEAKS) <= set(KERNELS)


def _perturbed(x, t, seed, scale=3.0, shift=5.0):
    """``x`` with every position after ``t`` replaced by a different, larger draw (positions are axis 1)."""
    later = jnp.arange(x.shape[1]) > t
    other = (scale * np_randn(seed, x.shape) + shift).astype(x.dtype)
    return jnp.where(later.reshape((1, -1) + (1,) * (x.ndim - 2)), other, x)


def _assert_prefix_unchanged(a, b, t, what):
    a, b = np.asarray(a, np.float32)[:, :t + 1], np.asarray(b, np.float32)[:, :t + 1]
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b)), what
    diff = float(np.max(np.abs(a - b)))
    scale = max(1.0, float(np.max(np.abs(a))))
    assert diff <= 1e-6 * scale, f"{what}: outputs up to t={t} moved by {diff:.3g} (|out| <= {scale:.3g})"


@nnx.jit
def _forward(kernel, q, k, v):
    return call_kernel(kernel, q, k, v, is_causal=True)[0]


@pytest.mark.parametrize("spec, dtype", _cases("supports_causal", dtypes=True))
def test_forward_outputs_ignore_later_positions(spec, dtype):
    """Kernel level: keys and values after t (then queries too) replaced; outputs 0..t unchanged."""
    kernel = make_kernel(spec, N, K, H, rng_seed=0)
    q, k, v = seeded_qkv(1, B, T, T, N, K, H, 1.5, dtype, rng="numpy")
    base = _forward(kernel, q, k, v)
    for t in CUTS:
        for draw in range(2):
            k2, v2 = _perturbed(k, t, 100 * draw + t), _perturbed(v, t, 100 * draw + 30 + t)
            _assert_prefix_unchanged(base, _forward(kernel, q, k2, v2), t, "later keys and values")
            q2 = _perturbed(q, t, 100 * draw + 60 + t)
            _assert_prefix_unchanged(base, _forward(kernel, q2, k2, v2), t, "later queries, keys and values")


def test_performer_last_key_at_realistic_scale():
    """The reported leak: head_dim 64, T 128, sigma 1, last key x3 and last value +5 moved earlier outputs by up to
    2.7 when the keys' stabilizer was a maximum over all keys. Default features, chunked and unchunked paths."""
    t, hd = 128, 64
    q, k, v = seeded_qkv(1, 1, t, t, 2, 2, hd, rng="numpy")
    k2, v2 = k.at[:, -1].multiply(3.0), v.at[:, -1].add(5.0)
    for chunk in (32, 256):  # 256 > T: one chunk
        kernel = make_kernel({"name": "performer", "chunk_size": chunk}, 2, 2, hd, rng_seed=0)
        _assert_prefix_unchanged(_forward(kernel, q, k, v), _forward(kernel, q, k2, v2), t - 2, f"chunk {chunk}")


def _module(spec):
    return MultiHeadAttention(N, D, num_kv_heads=K, attention=spec, decode=False, rngs=nnx.Rngs(0))


@nnx.jit
def _causal(m, x):
    return m(x, is_causal=True)


@nnx.jit
def _decode_step(m, xi):
    return m(xi, decode=True)


def _decode(m, x, garbage_seed=None):
    """Step-by-step decode of ``x`` through a fresh cache; ``garbage_seed`` fills the slots not yet written with
    large random keys and values first (as a reused cache would hold)."""
    m.init_cache(x.shape)
    if garbage_seed is not None:
        m.cached_key[...] = np_randn(garbage_seed, m.cached_key.shape, 10.0)
        m.cached_value[...] = np_randn(garbage_seed + 1, m.cached_value.shape, 10.0) + 100.0
    return jnp.concatenate([_decode_step(m, x[:, i:i + 1]) for i in range(x.shape[1])], axis=1)


@pytest.mark.parametrize("spec", _cases("supports_causal", small=False))
def test_module_causal_forward_ignores_later_inputs(spec):
    """Module level (projections, grouping): inputs after t replaced; causal outputs 0..t unchanged."""
    m = _module(spec)
    x = np_randn(1, (B, T, D), 2.0)
    base = _causal(m, x)
    for t in CUTS:
        _assert_prefix_unchanged(base, _causal(m, _perturbed(x, t, 40 + t)), t, "later inputs")


DECODE_EXTRA = [pytest.param({"name": "performer", "num_features": 32, "features": "trig"}, id="performer-trig")]


@pytest.mark.parametrize("spec", [c for c in _cases("supports_decode", small=False)
                                  if KERNELS[c.values[0]["name"]].supports_causal] + DECODE_EXTRA)
def test_decode_ignores_later_inputs_and_unwritten_cache(spec):
    """Decode: outputs up to t are the same whatever comes after t, whatever the unwritten cache slots hold, and
    equal the causal forward pass."""
    m = _module(spec)
    x = np_randn(1, (B, T, D), 2.0)
    steps = _decode(m, x)
    # Trig features' normalizer can come close to zero (outputs ~1e3 at some rows here), which amplifies the
    # different summation order of decode vs forward (2e-4 relative seen with jax 0.10.2): a looser rtol for them.
    rtol = 1e-3 if spec.get("features") == "trig" else 1e-4
    np.testing.assert_allclose(steps, _causal(m, x), rtol=rtol, atol=1e-4)
    _assert_prefix_unchanged(steps, _decode(m, x, garbage_seed=7), T - 1, "unwritten cache slots")
    for t in CUTS[1:3]:
        _assert_prefix_unchanged(steps, _decode(m, _perturbed(x, t, 50 + t)), t, "later inputs in decode")
