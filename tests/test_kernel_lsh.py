"""The lsh kernel (Kitaev et al. 2020): dense limit, rounds, buckets, padding, implied weights, approximation.

Float32 comparisons run under 'highest' matmul precision (tests/conftest.py), so their tight tolerances hold on a
GPU too, where float32 matmuls default to TF32.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.attention import MultiHeadAttention
from attn_lab.attention.dense import apply_weights, attention_weights
from tests.helpers import call_kernel, jax_randn, make_kernel, seeded_qkv

B, T, N, H = 2, 12, 4, 4


def _kernel(num_kv_heads=N, **options):
    return make_kernel({"name": "lsh", **options}, N, num_kv_heads, H, rng_seed=0)


@functools.cache
def _compiled(num_kv_heads, options, is_causal):
    """One jitted function per kernel setting (the CPU is shared: eager op-by-op compiles cost far more).

    Returns ``(chunked output, output from the implied weights, weights)``.
    """
    kernel = _kernel(num_kv_heads, **dict(options))

    def both(q, k, v, mask):
        out, none = call_kernel(kernel, q, k, v, mask, is_causal)
        assert none is None
        return (out, *call_kernel(kernel, q, k, v, mask, is_causal, need_weights=True))

    return jax.jit(both)


def _run(q, k, v, mask=None, is_causal=False, **options):
    return _compiled(k.shape[2], tuple(sorted(options.items())), is_causal)(q, k, v, mask)


def _qkv(seed, num_kv_heads=N, t=T):
    return seeded_qkv(seed, B, t, t, N, num_kv_heads, H)


def _reference_weights(q, k, shared_qk=True, is_causal=False, attend_self=False, valid=None):
    """Dense softmax with the kernel's rules: keys = q / ||q|| when shared, own key only when nothing else."""
    t = q.shape[1]
    keys = q / jnp.linalg.norm(q, axis=-1, keepdims=True) if shared_qk else k
    keep = jnp.ones((t, t), bool) if valid is None else jnp.broadcast_to(valid[:, None, :], (q.shape[0], t, t))
    if is_causal:
        keep &= jnp.tril(jnp.ones((t, t), bool))
    if not attend_self:
        others = keep & ~jnp.eye(t, dtype=bool)
        keep = others | (jnp.eye(t, dtype=bool) & ~others.any(-1, keepdims=True))
    return attention_weights(q, keys, mask=keep[..., None, :, :] if keep.ndim == 3 else keep)


@pytest.mark.parametrize("n_hashes,is_causal,attend_self", [(3, True, False), (1, False, True)])
def test_one_bucket_equals_dense_reference(n_hashes, is_causal, attend_self):
    """n_buckets=1 and bucket_size >= T: one chunk, one bucket, so LSH is exact (rounds are deduplicated)."""
    q, k, v = _qkv(0, num_kv_heads=2)
    ref = _reference_weights(q, k, is_causal=is_causal, attend_self=attend_self)  # (B, N, T, T)
    out, out_w, weights = _run(q, k, v, is_causal=is_causal, n_buckets=1, bucket_size=16, n_hashes=n_hashes,
                               attend_self=attend_self)
    np.testing.assert_allclose(weights, ref, atol=1e-6)
    np.testing.assert_allclose(out, apply_weights(ref, v), atol=1e-5)
    np.testing.assert_allclose(out_w, out, atol=1e-5)


def test_one_bucket_unshared_qk_and_padding_equal_dense_reference():
    q, k, v = _qkv(3)
    valid = jnp.arange(T)[None, :] < jnp.array([[T], [T - 4]])  # (B, T)
    out, _, _ = _run(q, k, v, mask=valid[:, None, None, :], is_causal=True, n_buckets=1, bucket_size=T,
                     shared_qk=False, n_hashes=2)
    ref = apply_weights(_reference_weights(q, k, shared_qk=False, is_causal=True, valid=valid), v)
    np.testing.assert_allclose(out[0], ref[0], atol=1e-5)
    np.testing.assert_allclose(out[1, :T - 4], ref[1, :T - 4], atol=1e-5)  # padded queries may differ


@pytest.mark.parametrize("shared_qk,is_causal", [(True, True), (False, False)])
def test_chunked_path_applies_its_implied_weights(shared_qk, is_causal):
    """Real hashing, several chunks and rounds, padding: the chunked output is the implied weights @ values."""
    t = 24
    q, k, v = _qkv(5, num_kv_heads=2, t=t)
    mask = (jnp.arange(t)[None, :] < jnp.array([[t], [t - 5]]))[:, None, None, :]  # (B, 1, 1, T)
    out, out_w, weights = _run(q, k, v, mask=mask, is_causal=is_causal, bucket_size=4, n_buckets=4, n_hashes=3,
                               shared_qk=shared_qk)
    assert np.isfinite(out).all() and out.shape == (B, t, N, H)
    np.testing.assert_allclose(out, out_w, atol=1e-5)
    w = np.asarray(weights)
    rows = w.sum(-1)
    np.testing.assert_allclose(rows[rows > 0], 1.0, atol=1e-5)  # unshared QK: a query may reach no key
    if shared_qk:
        assert np.all(rows > 0)
        assert np.all(w[1, :, :t - 5, t - 5:] == 0.0)  # real queries never attend to padding here
        diag = w[..., np.arange(t), np.arange(t)]  # (B, N, T)
        diag = np.concatenate([diag[0], diag[1, :, :t - 5]], axis=-1)  # (N, real queries)
        assert np.all((diag == 0.0) | np.isclose(diag, 1.0))  # own key only as the last resort
    if is_causal:
        assert np.all(np.triu(np.ones((t, t)), 1)[None, None] * w == 0.0)


def test_attended_pairs_share_a_bucket_in_some_round():
    t = 32
    q, k, v = _qkv(7, t=t)
    _, _, weights = _run(q, k, v, bucket_size=8, n_buckets=8, n_hashes=4)  # (B, N, T, T)
    kernel = _kernel(bucket_size=8, n_buckets=8, n_hashes=4)
    buckets = np.asarray(kernel.hash(*kernel.heads(q, k, v)[:2])[0])  # (B, N, R, T)
    same = (buckets[..., :, None] == buckets[..., None, :]).any(2)  # (B, N, T, T)
    attended = np.asarray(weights) > 0
    assert attended.any(-1).all() and not attended.all()
    assert np.all(same[attended])
    assert len(np.unique(buckets)) == 8
    other = np.asarray(_kernel(bucket_size=8, n_buckets=8, n_hashes=4, seed=1).hash(*kernel.heads(q, k, v)[:2])[0])
    assert not np.array_equal(other, buckets)  # the seed picks the rotations


def test_more_hashes_approach_full_attention():
    """Averaged over inputs, 4 rounds miss fewer neighbours than 1, so the error vs full attention drops."""
    t = 32
    errors = {1: [], 4: []}
    for seed in range(4):
        q, k, v = _qkv(11 + 3 * seed, t=t)
        ref = apply_weights(_reference_weights(q, k), v)
        for r in errors:
            errors[r].append(float(jnp.abs(_run(q, k, v, bucket_size=8, n_buckets=8, n_hashes=r)[0] - ref).mean()))
    assert np.mean(errors[4]) < 0.8 * np.mean(errors[1]), errors


def test_appended_padding_changes_nothing_with_several_chunks():
    """Padding sorts after real positions, so real chunks (and outputs) do not move when padding is appended."""
    t, options = 24, dict(is_causal=True, bucket_size=4, n_buckets=4, n_hashes=3, shared_qk=True)
    q, k, v = _qkv(5, num_kv_heads=2, t=t)
    longer = [jnp.concatenate([a, jax_randn(20 + i, (B, 5) + a.shape[2:])], axis=1) for i, a in enumerate((q, k, v))]
    short = _run(q, k, v, mask=jnp.ones((B, 1, 1, t), bool), **options)
    long = _run(*longer, mask=jnp.broadcast_to(jnp.arange(t + 5) < t, (B, 1, 1, t + 5)), **options)
    for a, b in zip(short[:2], long[:2]):
        np.testing.assert_allclose(b[:, :t], a, atol=1e-5)
    np.testing.assert_allclose(long[2][..., :t, :t], short[2], atol=1e-6)


def test_module_grads_are_finite_with_padding_and_causal():
    m = MultiHeadAttention(N, 16, num_kv_heads=2, decode=False, rngs=nnx.Rngs(0),
                           attention={"name": "lsh", "bucket_size": 4, "n_hashes": 2})
    x = jax_randn(1, (B, 16, 16))
    mask = jnp.broadcast_to(jnp.arange(16) < 13, (B, 1, 1, 16))
    loss = lambda m, x: (m(x, mask=mask, is_causal=True) ** 2).mean()
    value, grads = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1)))(m, x)
    assert np.isfinite(value) and all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_bad_options_and_uses_are_one_line_errors():
    for bad in (dict(n_buckets=3), dict(n_buckets=0), dict(bucket_size=0), dict(n_hashes=True), dict(seed=1.5)):
        with pytest.raises(ValueError, match="attention\\."):
            _kernel(**bad)
    m = MultiHeadAttention(N, 16, attention="lsh", decode=False, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="does not support cross-attention"):
        m(jax_randn(1, (B, T, 16)), jax_randn(2, (B, 5, 16)))
    with pytest.raises(ValueError, match="does not support attention dropout"):
        MultiHeadAttention(N, 16, attention="lsh", dropout_rate=0.1, rngs=nnx.Rngs(0))
