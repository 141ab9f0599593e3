"""The fused block-sparse flash kernel (attn_lab/attention/flash.py) and its block masks, on a CPU.

The kernels run in Pallas' interpret mode (the same kernel bodies as jax operations) against naive O(T^2) softmax
attention with the pattern as a ``[T, T]`` mask built here from each pattern's definition (loops in
tests/test_kernels_sparse.py's ``_reference_mask``; the band written out below), by value and by gradient, at
lengths that are multiples of no block size, with key padding, causal masks, grouped-query heads, head dims that
are not powers of two, and bf16 inputs. Interpret mode checks neither Triton's tile rules nor speed, so the GPU
path is also *lowered* to Triton on the CPU for an abstract H200 (``jax.jit(...).lower(lowering_platforms=
('cuda',))``): every block size the kernels may choose lowers, and a size Triton cannot tile does not.

Float32 comparisons run under 'highest' matmul precision (tests/conftest.py), so they hold on a GPU too. Interpret
mode is slow (seconds per case): the cases are small.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_lab.attention import KERNELS
from attn_lab.attention.block_mask import BLOCK_SIZES, check_block_size, create_block_mask
from attn_lab.attention.dense import NEG
from attn_lab.attention.flash import block_sparse_flash
from attn_lab.attention.flex import PatternAttention
from attn_lab.attention.local import band_block_mask
from tests.helpers import call_kernel, split_qkv
from tests.test_kernels_sparse import CONFIGS, _reference_mask


def naive(q, k, v, allowed, key_valid=None):
    """Softmax attention written out: ``allowed [T, T]`` excludes keys, padding sets the logit to NEG (float32,
    matmuls at precision 'highest' whatever the test's default)."""
    group = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    s = jnp.einsum("bqnh,bknh->bnqk", q.astype(jnp.float32), k.astype(jnp.float32),
                   precision="highest") / np.sqrt(q.shape[-1])
    if key_valid is not None:
        s = jnp.where(key_valid[:, None, None, :], s, NEG)
    s = jnp.where(allowed, s, -jnp.inf)
    m = jax.lax.stop_gradient(s.max(axis=-1, keepdims=True))
    p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))  # softmax over the pattern's keys, written out
    p = p / p.sum(axis=-1, keepdims=True)
    return jnp.einsum("bnqk,bknh->bqnh", p, v.astype(jnp.float32), precision="highest")


def band(t, window, causal):
    """Local attention's band from its definition: two-sided |i - j| <= w // 2, causal i - w < j <= i."""
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    return ((j <= i) & (j > i - window)) if causal else (np.abs(i - j) <= window // 2)


def _padding(b, t, seed=1, drop=0.25):
    return jnp.asarray(np.random.default_rng(seed).random((b, t)) > drop)


def _grads(fn, q, k, v, seed=2):
    """Gradients of ``sum(fn(q, k, v) * dout)`` in q, k and v, for a fixed random ``dout``."""
    dout = jax.random.normal(jax.random.key(seed), q.shape, jnp.float32)
    return jax.grad(lambda *x: (fn(*x).astype(jnp.float32) * dout).sum(), argnums=(0, 1, 2))(q, k, v)


def _close(got, want, atol):
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=atol, rtol=atol)


# --- block masks ------------------------------------------------------------------------------------------------

MASK_MODS = {  # (mask_mod, shift_invariant, cover)
    "band": (lambda q, k: np.abs(q - k) <= 9, True, None),
    "strided": (lambda q, k: (np.abs(q - k) < 5) | ((q - k) % 5 == 0), True, None),
    "global": (lambda q, k: (np.abs(q - k) <= 3) | (q == 7) | (k == 40), False, None),
    "band+cover": (lambda q, k: np.abs(q - k) <= 9, False,
                   lambda nb, bs: np.abs(np.arange(nb)[:, None] - np.arange(nb)[None, :]) <= 1),
}


@pytest.mark.parametrize("name", sorted(MASK_MODS))
@pytest.mark.parametrize("t,bs", [(77, 16), (64, 32), (5, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_block_mask_encodes_the_pattern_and_only_its_tiles(name, t, bs, causal):
    mask_mod, invariant, cover = MASK_MODS[name]
    bm = create_block_mask(mask_mod, t, bs, is_causal=causal, shift_invariant=invariant, cover=cover)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    want = mask_mod(i, j) & ((j <= i) | (not causal))
    np.testing.assert_array_equal(bm.dense(), want)
    nb = -(-t // bs)
    padded = np.zeros((nb * bs, nb * bs), bool)
    padded[:t, :t] = want
    touched = padded.reshape(nb, bs, nb, bs).any(axis=(1, 3))  # (nb, nb): tiles with any allowed pair
    assert bm.active == touched.sum()  # exactly the touched tiles: cost in proportion to the pattern
    for q in range(nb):  # the query lists (dK/dV loop) are the transpose of the key lists
        assert sorted(bm.kv_indices[q, :bm.kv_counts[q]]) == list(np.flatnonzero(touched[q]))
        assert sorted(bm.q_indices[q, :bm.q_counts[q]]) == list(np.flatnonzero(touched[:, q]))
    assert bm.tiles[0].all()  # tile 0 is the full tile: a fully covered tile needs no mask of its own


def test_block_mask_work_is_linear_in_length():
    """A sliding window's active tiles (the kernel's work and the size of its lists) grow linearly with T: 5 per
    query block (reach 128 = 2 tiles each side, plus its own), less the 6 the sequence's two ends cut off."""
    lengths = (8192, 16384, 32768)
    masks = [create_block_mask(lambda q, k: np.abs(q - k) <= 128, t, 64, shift_invariant=True,
                               cover=lambda nb, bs: np.abs(np.arange(nb)[:, None] - np.arange(nb)[None, :]) <= 2)
             for t in lengths]
    assert [m.active for m in masks] == [5 * (t // 64) - 6 for t in lengths]
    assert [m.kv_indices.shape for m in masks] == [(t // 64, 5) for t in lengths]
    assert all(m.tiles.shape[0] <= 8 for m in masks)  # deduplicated: a few distinct tiles whatever T


def test_bad_block_masks_stop_in_one_line():
    with pytest.raises(ValueError, match=r"attention.fused_block_size must be one of \(16, 32, 64, 128\).*got 48"):
        check_block_size(48)
    with pytest.raises(ValueError, match="must be one of"):
        create_block_mask(lambda q, k: q == k, 64, 8)
    with pytest.raises(ValueError, match=r"pattern: query 3 \(block 0, positions 0..15\) sees no key at T=40; "
                                         r"every query must see at least one key \(1 do not\)"):
        create_block_mask(lambda q, k: (q == k) & (q != 3), 40, 16)
    with pytest.raises(ValueError, match="sees no key at T=40, causal"):  # only later keys: empty once causal
        create_block_mask(lambda q, k: k == q + 1, 40, 16, is_causal=True)
    with pytest.raises(ValueError, match=r"cover must return a \[3, 3\] boolean array"):
        create_block_mask(lambda q, k: q == k, 40, 16, cover=lambda nb, bs: np.ones((2, 2)))


# --- the kernel against naive attention ---------------------------------------------------------------------------

CASES = [  # (T, block, N, K, H, causal, padded)
    (77, 16, 4, 2, 24, False, True),  # H not a power of two; GQA; padding
    (77, 16, 2, 2, 8, True, True),
    (64, 32, 2, 1, 16, True, False),  # T a multiple of the block; MQA
    (40, 64, 2, 2, 64, False, False),  # one block larger than T
]


@pytest.mark.parametrize("t,bs,n,kh,h,causal,padded", CASES)
def test_fused_matches_naive_attention_by_value_and_gradient(t, bs, n, kh, h, causal, padded):
    mask_mod = lambda q, k: (np.abs(q - k) <= 11) | (k == 2) | (q == 30)  # noqa: E731 band + a global row/column
    bm = create_block_mask(mask_mod, t, bs, is_causal=causal)
    allowed = jnp.asarray(bm.dense())
    q, k, v = split_qkv(2, t, t, n, kh, h)
    valid = _padding(2, t) if padded else None
    fused = lambda *x: block_sparse_flash(*x, bm, key_valid=valid, interpret=True)  # noqa: E731
    ref = lambda *x: naive(*x, allowed, valid)  # noqa: E731
    _close(fused(q, k, v), ref(q, k, v), 2e-5)
    for got, want in zip(_grads(fused, q, k, v), _grads(ref, q, k, v)):
        _close(got, want, 5e-5)


def test_fused_bf16_accumulates_in_float32():
    """bf16 inputs: the output matches float32 attention of the same bf16 numbers to bf16 rounding of the result
    (sums in bf16 over ~100 keys would be off by far more), and so do the gradients."""
    t, bs = 100, 32
    bm = create_block_mask(lambda q, k: np.abs(q - k) <= 40, t, bs)
    q, k, v = (x.astype(jnp.bfloat16) for x in split_qkv(1, t, t, 2, 2, 32))
    out = block_sparse_flash(q, k, v, bm, interpret=True)
    assert out.dtype == jnp.bfloat16
    want = naive(q, k, v, jnp.asarray(bm.dense()))
    _close(out, want, 2e-2)
    grads = _grads(lambda *x: block_sparse_flash(*x, bm, interpret=True), q, k, v)
    for got, ref in zip(grads, _grads(lambda *x: naive(*x, jnp.asarray(bm.dense())), q, k, v)):
        assert got.dtype == jnp.bfloat16
        _close(got, ref, 6e-2)


def test_a_query_whose_keys_are_all_padding_averages_its_pattern():
    """Formula: the mean of the values of the keys in its pattern (as the XLA paths), never of other keys."""
    t = 40
    bm = create_block_mask(lambda q, k: np.abs(q - k) <= 2, t, 16)
    q, k, v = split_qkv(1, t, t, 1, 1, 8)
    valid = jnp.ones((1, t), bool).at[0, 18:23].set(False)  # query 20's keys 18..22 are all padding
    out = block_sparse_flash(q, k, v, bm, key_valid=valid, interpret=True)
    _close(out[0, 20, 0], v[0, 18:23, 0].mean(axis=0), 1e-5)


# --- every fused kernel path against its pattern --------------------------------------------------------------------

FUSED = {  # name: (kernel name, options, reference mask (t, causal, kernel) -> [t, t])
    **{key: (name, opts, lambda t, c, kern, name=name, opts=opts: _reference_mask(name, opts, t, c, kern))
       for key, (name, opts) in CONFIGS.items()},
    "local": ("local", dict(window=9), lambda t, c, kern: band(t, 9, c)),
    "local_wide": ("local", dict(window=40), lambda t, c, kern: band(t, 40, c)),
}


@pytest.mark.parametrize("key", sorted(FUSED))
@pytest.mark.parametrize("causal", [False, True])
def test_each_pattern_fused_matches_naive_attention(key, causal):
    name, options, reference = FUSED[key]
    t = 45
    kernel = KERNELS[name](num_heads=4, num_kv_heads=2, head_dim=8, implementation="fused_interpret",
                           fused_block_size=16, **options)
    q, k, v = split_qkv(2, t, t, 4, 2, 8)
    valid = _padding(2, t, drop=0.15)
    allowed = jnp.asarray(reference(t, causal, kernel))
    out, weights = call_kernel(kernel, q, k, v, mask=valid[:, None, None, :], is_causal=causal)
    assert weights is None
    _close(out, naive(q, k, v, allowed, valid), 2e-5)
    if causal:  # gradients once per pattern (interpret-mode backward costs seconds)
        fused = lambda *x: call_kernel(kernel, *x, mask=valid[:, None, None, :], is_causal=True)[0]  # noqa: E731
        for got, want in zip(_grads(fused, q, k, v), _grads(lambda *x: naive(*x, allowed, valid), q, k, v)):
            _close(got, want, 5e-5)


def test_bigbird_default_tiles_are_whole_blocks():
    """BigBird's tile is its own block (64 -> 64, 48 -> 16), so its active tiles carry no token mask except at
    the causal diagonal and the sequence's end."""
    kernel = KERNELS["bigbird"](num_heads=2, num_kv_heads=2, head_dim=8)
    assert kernel.fused_block() == 64
    assert KERNELS["bigbird"](num_heads=2, num_kv_heads=2, head_dim=8, block_size=48).fused_block() == 16
    assert kernel.block_mask(4096, False).tiles.shape[0] == 1  # only the full tile
    causal = kernel.block_mask(4096, True)
    assert causal.tiles.shape[0] == 2  # the full tile and the diagonal's triangle
    dense = 4096 // 64
    assert causal.active < 0.2 * dense * (dense + 1) / 2  # a fifth of the causal tiles at 4K


class _Dilated(PatternAttention):
    """A forker's pattern in one function (not registered)."""
    name = "dilated"
    shift_invariant = True

    def mask_mod(self, q_pos, k_pos):
        return (np.abs(q_pos - k_pos) < 12) & ((q_pos - k_pos) % 2 == 0)


@pytest.mark.parametrize("implementation", ["xla", "fused_interpret"])
def test_a_pattern_in_one_function_gets_both_paths(implementation):
    t = 50
    kernel = _Dilated(num_heads=2, num_kv_heads=2, head_dim=8, implementation=implementation,
                      fused_block_size=16)
    q, k, v = split_qkv(1, t, t, 2, 2, 8)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    allowed = jnp.asarray((np.abs(i - j) < 12) & ((i - j) % 2 == 0) & (j <= i))
    out, _ = call_kernel(kernel, q, k, v, is_causal=True)
    _close(out, naive(q, k, v, allowed), 2e-5)


def test_explicit_fused_off_a_gpu_stops_in_one_line():
    if jax.default_backend() == "gpu":
        pytest.skip("a CUDA GPU compiles the fused kernel")
    for name in ("local", "bigbird", "longformer", "strided"):
        with pytest.raises(ValueError, match=r"attention.implementation='fused' cannot run here: backend cpu "
                                             r"\(the fused kernel compiles for CUDA GPUs.*'fused_interpret'"):
            KERNELS[name](num_heads=2, num_kv_heads=2, head_dim=8, implementation="fused")
    with pytest.raises(ValueError, match=r"attention.fused_block_size must be one of .* got 100"):
        KERNELS["longformer"](num_heads=2, num_kv_heads=2, head_dim=8, fused_block_size=100)


# --- the GPU path, lowered to Triton on the CPU -------------------------------------------------------------------

def _lower_for_h200(fn, *args):
    """Lowers ``fn`` for CUDA on an abstract H200 (no GPU needed): Pallas' Triton lowering runs in full."""
    from jax._src.mesh import AbstractDevice  # private: jax has no public way to name an abstract GPU yet

    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=AbstractDevice("NVIDIA H200", 132, "gpu"))
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _fwd_bwd(mask):
    def run(q, k, v, valid):
        loss = lambda *x: block_sparse_flash(*x, mask, key_valid=valid).astype(jnp.float32).sum()  # noqa: E731
        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    return run


def _shapes(t, n=4, kh=2, h=48, dtype=jnp.bfloat16):
    return (jax.ShapeDtypeStruct((2, t, n, h), dtype), jax.ShapeDtypeStruct((2, t, kh, h), dtype),
            jax.ShapeDtypeStruct((2, t, kh, h), dtype), jax.ShapeDtypeStruct((2, t), jnp.bool_))


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_every_allowed_block_size_lowers_to_triton(bs):
    mask = create_block_mask(lambda q, k: np.abs(q - k) <= 100, 300, bs, is_causal=True)
    text = _lower_for_h200(_fwd_bwd(mask), *_shapes(300))
    assert text.count("__gpu$xla.gpu.triton") == 3  # forward, dQ, dK/dV: all fused


@pytest.mark.parametrize("name", ["local", "strided", "longformer", "bigbird"])
def test_each_pattern_lowers_to_triton_with_its_default_tiles(name):
    kernel = KERNELS[name](num_heads=4, num_kv_heads=2, head_dim=48)
    if name == "local":
        mask = band_block_mask(1000, kernel.window, False, kernel.fused_block_size)
    else:
        mask = kernel.block_mask(1000, False)
    text = _lower_for_h200(_fwd_bwd(mask), *_shapes(1000, dtype=jnp.float16))
    assert text.count("__gpu$xla.gpu.triton") == 3


def test_kernels_walking_a_block_in_smaller_tiles_lower_to_triton():
    """Head dim 128 in bf16 at block 128: the tile rule walks each block in 64-wide tiles (2-D slices of the token
    masks at a dynamic row and column); a forced 16-wide tile at 3 stages lowers too."""
    from attn_lab.attention.tiles import fused_tile

    assert fused_tile(128, 128, jnp.bfloat16).tiles == (64, 64, 64)
    mask = create_block_mask(lambda q, k: np.abs(q - k) <= 100, 300, 128, is_causal=True)
    text = _lower_for_h200(_fwd_bwd(mask), *_shapes(300, h=128))
    assert text.count("__gpu$xla.gpu.triton") == 3

    def forced(q, k, v, valid):
        loss = lambda *x: block_sparse_flash(*x, mask, key_valid=valid, tile=16,  # noqa: E731
                                             stages=3).astype(jnp.float32).sum()
        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    assert _lower_for_h200(forced, *_shapes(300)).count("__gpu$xla.gpu.triton") == 3


def test_vmapped_seeds_run_the_same_kernel():
    """``--vmap-seeds`` maps the whole step over seeds: the kernel under vmap equals it per seed (value and
    gradient), and the vmapped program still lowers to the three Triton kernels."""
    mask = create_block_mask(lambda q, k: np.abs(q - k) <= 5, 40, 16)
    x = jax.random.normal(jax.random.key(0), (3, 2, 40, 2, 8))  # (seeds, B, T, N, H)
    loss = lambda y: block_sparse_flash(y, y, y, mask, interpret=True).sum()  # noqa: E731
    _close(jax.vmap(jax.grad(loss))(x), jnp.stack([jax.grad(loss)(y) for y in x]), 1e-5)
    wide = create_block_mask(lambda q, k: np.abs(q - k) <= 50, 300, 64)
    grad = jax.grad(lambda y: block_sparse_flash(y, y, y, wide).astype(jnp.float32).sum())
    text = _lower_for_h200(jax.vmap(grad), jax.ShapeDtypeStruct((3, 2, 300, 2, 64), jnp.bfloat16))
    assert text.count("__gpu$xla.gpu.triton") == 3


def test_a_tile_triton_cannot_compile_fails_its_lowering(monkeypatch):
    """The rule check_block_size enforces is Triton's: a 48-wide tile does not lower (interpret mode would run);
    left to itself the tile rule walks a 48-wide block in 16-wide tiles, so the tile is forced here."""
    import attn_lab.attention.block_mask as block_mask

    monkeypatch.setattr(block_mask, "check_block_size", lambda value, name=None: value)
    mask = block_mask.create_block_mask(lambda q, k: np.abs(q - k) <= 20, 96, 48)

    def forced(q, k, v, valid):
        loss = lambda *x: block_sparse_flash(*x, mask, key_valid=valid, tile=48,  # noqa: E731
                                             stages=1).astype(jnp.float32).sum()
        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    with pytest.raises(ValueError, match="power of 2"):
        _lower_for_h200(forced, *_shapes(96))


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="compiles the Triton kernels: needs a CUDA GPU")
@pytest.mark.default_precision
@pytest.mark.parametrize("name,options", [("local", dict(window=256)), ("bigbird", {}), ("longformer", {})])
def test_compiled_fused_kernel_on_a_gpu_matches_naive_attention(name, options):
    """The compiled kernels (not interpret mode) at bf16 against float32 attention of the same bf16 numbers, by
    value and gradient, at T = 1000 (no multiple of any tile) with padding and causal masks."""
    t = 1000
    kernel = KERNELS[name](num_heads=4, num_kv_heads=2, head_dim=64, implementation="fused", **options)
    q, k, v = (x.astype(jnp.bfloat16) for x in split_qkv(2, t, t, 4, 2, 64))
    valid = _padding(2, t, drop=0.1)
    for causal in (False, True):
        mask = (kernel.block_mask(t, causal) if name != "local" else
                band_block_mask(t, kernel.window, causal, kernel.fused_block_size))
        allowed = jnp.asarray(mask.dense())
        fused = lambda *x, c=causal: call_kernel(kernel, *x, mask=valid[:, None, None, :], is_causal=c)[0]  # noqa
        ref = lambda *x, a=allowed: naive(*x, a, valid)  # noqa: E731
        _close(fused(q, k, v), ref(q, k, v), 3e-2)
        for got, want in zip(_grads(fused, q, k, v), _grads(ref, q, k, v)):
            _close(got, want, 1e-1)


# --- the backward of fully padded rows, full tiles, CSR lists, the compile check -------------------------------------

def test_a_query_whose_keys_are_all_padding_gets_the_gradient_of_its_average():
    """Query 20 sees keys 18..22, all padding: its output is their mean, so with a cotangent of ones on that row
    alone dV of each of those keys is 1/5 of it (written out below) and nothing else moves. Saved as one logsumexp
    ``NEG + log 5`` the backward read p = 1 (float32 rounds the sum to NEG) and gave dV = 1; the row max and sum
    are saved apart now. With a full cotangent every gradient matches naive attention."""
    t = 40
    bm = create_block_mask(lambda q, k: np.abs(q - k) <= 2, t, 16)
    q, k, v = split_qkv(1, t, t, 1, 1, 8)
    valid = jnp.ones((1, t), bool).at[0, 18:23].set(False)
    fused = lambda *x: block_sparse_flash(*x, bm, key_valid=valid, interpret=True)  # noqa: E731
    row = jnp.zeros(q.shape, jnp.float32).at[0, 20].set(1.0)
    dv = jax.grad(lambda v: (fused(q, k, v) * row).sum())(v)
    _close(dv, jnp.zeros(v.shape).at[0, 18:23].set(0.2), 1e-6)
    ones = lambda fn: jax.grad(lambda *x: fn(*x).sum(), argnums=(0, 1, 2))(q, k, v)  # noqa: E731
    for got, want in zip(ones(fused), ones(lambda *x: naive(*x, jnp.asarray(bm.dense()), valid))):
        _close(got, want, 1e-5)


def test_full_tiles_skip_their_token_mask(monkeypatch):
    """A full tile's token mask is never read: with those masks zeroed (which would exclude every key) the outputs
    and gradients are still naive attention's, so the kernel takes the full/partial flag, not the mask."""
    import attn_lab.attention.flash as flash

    t = 100
    bm = create_block_mask(lambda q, k: np.abs(q - k) <= 40, t, 16)
    full = bm.tiles.all(axis=(1, 2))
    assert full.any() and not full.all()  # both kinds of tile are exercised
    real = flash._mask_arrays

    def zeroed_full_masks(mask):
        kv, qs, (flags, tokens) = real(mask)
        rows = np.repeat(mask.tiles.all(axis=(1, 2)), mask.block_size)  # (U * bs,): the full tiles' rows
        return kv, qs, (flags, jnp.where(rows[:, None], jnp.int8(0), tokens))
    monkeypatch.setattr(flash, "_mask_arrays", zeroed_full_masks)
    q, k, v = split_qkv(1, t, t, 2, 1, 16)
    allowed = jnp.asarray(bm.dense())
    fused = lambda *x: flash.block_sparse_flash(*x, bm, interpret=True)  # noqa: E731
    _close(fused(q, k, v), naive(q, k, v, allowed), 1e-5)
    for got, want in zip(_grads(fused, q, k, v), _grads(lambda *x: naive(*x, allowed), q, k, v)):
        _close(got, want, 1e-5)


@pytest.mark.parametrize("tile", [16, 32])
def test_kernels_walking_a_block_in_smaller_tiles_match_naive_attention(tile):
    """What the tile rule does at large head dims, forced here at a small one: each kernel walks 64-wide blocks in
    16- or 32-wide tiles (partial and full blocks, padding, causal, grouped-query heads); outputs and gradients
    equal naive attention's and the whole-block kernels'."""
    t = 150
    bm = create_block_mask(lambda q, k: np.abs(q - k) <= 70, t, 64, is_causal=True)
    assert (~bm.tiles.all(axis=(1, 2))).any() and bm.tiles.all(axis=(1, 2)).any()
    q, k, v = split_qkv(2, t, t, 4, 2, 16)
    valid = _padding(2, t)
    allowed = jnp.asarray(bm.dense())
    fused = lambda *x: block_sparse_flash(*x, bm, key_valid=valid, interpret=True, tile=tile, stages=1)  # noqa
    whole = lambda *x: block_sparse_flash(*x, bm, key_valid=valid, interpret=True)  # noqa: E731
    ref = lambda *x: naive(*x, allowed, valid)  # noqa: E731
    _close(fused(q, k, v), ref(q, k, v), 1e-5)
    _close(fused(q, k, v), whole(q, k, v), 1e-6)
    for got, want, blockwise in zip(_grads(fused, q, k, v), _grads(ref, q, k, v), _grads(whole, q, k, v)):
        _close(got, want, 1e-5)
        _close(got, blockwise, 1e-5)


def test_csr_lists_hold_the_padded_lists_in_o_of_active_tiles():
    """BigBird at 64K tokens (its global blocks see every block): the padded ``[nb, max]`` lists are O(blocks^2),
    the CSR lists the kernel embeds are O(active tiles); they hold the same blocks in the same order."""
    kernel = KERNELS["bigbird"](num_heads=1, num_kv_heads=1, head_dim=64)
    mask = kernel.block_mask(65536, False)
    padded = sum(a.nbytes for a in (mask.kv_indices, mask.kv_tiles, mask.q_indices, mask.q_tiles))
    ragged = sum(a.nbytes for side in ("kv", "q") for a in mask.ragged(side))
    assert padded > 8 * 2 ** 20 and ragged < 2 ** 20, (padded, ragged)
    for side, (indices, counts, tile_ids) in (("kv", (mask.kv_indices, mask.kv_counts, mask.kv_tiles)),
                                               ("q", (mask.q_indices, mask.q_counts, mask.q_tiles))):
        offsets, blocks, tiles = mask.ragged(side)
        assert offsets[-1] == counts.sum() == mask.active
        for row in (0, 1, mask.num_blocks // 2, mask.num_blocks - 1):
            np.testing.assert_array_equal(blocks[offsets[row]:offsets[row + 1]], indices[row, :counts[row]])
            np.testing.assert_array_equal(tiles[offsets[row]:offsets[row + 1]], tile_ids[row, :counts[row]])


@pytest.mark.default_precision
def test_float32_at_the_default_matmul_precision_and_at_highest():
    """Training runs float32 at the default precision (TF32 tensor cores on a GPU; Pallas maps 'highest' to IEEE
    float32 without them): the fused kernel there matches naive attention computed at 'highest' within a float32
    tolerance of TF32's 10-bit mantissa, and at 'highest' to float32 rounding."""
    t = 90
    bm = create_block_mask(lambda q, k: np.abs(q - k) <= 30, t, 32)
    q, k, v = split_qkv(2, t, t, 4, 2, 32)
    allowed = jnp.asarray(bm.dense())
    with jax.default_matmul_precision("highest"):
        want = naive(q, k, v, allowed)
        want_grads = _grads(lambda *x: naive(*x, allowed), q, k, v)
        exact = block_sparse_flash(q, k, v, bm, interpret=True)
        _close(exact, want, 1e-5)
    fused = lambda *x: block_sparse_flash(*x, bm, interpret=True)  # noqa: E731
    tol = 1e-5 if jax.default_backend() == "cpu" else 1e-2  # TF32: ~1e-3 relative per product
    _close(fused(q, k, v), want, tol)
    for got, ref in zip(_grads(fused, q, k, v), want_grads):
        _close(got, ref, 10 * tol)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the compile of the Triton kernels succeeds on a GPU")
def test_a_fused_compile_failure_is_one_line_naming_tile_head_dim_and_dtype():
    """On a CPU the compiled (not interpreted) kernels cannot compile: a real failure, turned by the first-use
    check into one line naming the launch configuration."""
    import attn_lab.attention.flash as flash

    flash.check_compiles.cache_clear()
    with pytest.raises(ValueError) as info:
        flash.check_compiles(32, 64, 4, 2, "bfloat16", True)
    text = str(info.value)
    assert text.startswith("fused kernel: tile 32, head dim 64, bfloat16 failed to compile (forward 32x2, dq 32x2, "
                           "dkdv 32x2; ") and "\n" not in text
    assert text.endswith("set implementation to the XLA path (e.g. 'blockwise') or another fused_block_size")


def test_the_compile_check_runs_once_per_configuration_and_never_falls_back(monkeypatch):
    """A Triton failure (stubbed: the compile raises a multi-line error) is one line naming tile, head dim and dtype
    and the per-kernel launch; the check is cached per configuration, and the path raises instead of running
    another implementation."""
    import attn_lab.attention.flash as flash

    calls = []

    def fail(fn, *args):
        calls.append(args[0].shape)
        raise RuntimeError("out of resources: shared memory, Required: 262144, Hardware limit: 232448\ntraceback")
    monkeypatch.setattr(flash, "_compile", fail)
    flash.check_compiles.cache_clear()
    for _ in range(2):
        with pytest.raises(ValueError) as info:
            flash.check_compiles(128, 128, 4, 4, "bfloat16", False)
        assert str(info.value) == (
            "fused kernel: tile 128, head dim 128, bfloat16 failed to compile (forward 64x2, dq 64x2, dkdv 64x2; "
            "RuntimeError: out of resources: shared memory, Required: 262144, Hardware limit: 232448); set "
            "implementation to the XLA path (e.g. 'blockwise') or another fused_block_size")
    assert len(calls) == 2  # lru_cache keeps results, not exceptions: a failed check is re-run, still one line
    monkeypatch.setattr(flash, "_compile", lambda fn, *args: calls.append("ok"))
    flash.check_compiles.cache_clear()
    flash.check_compiles(64, 64, 2, 2, "float32", True)
    flash.check_compiles(64, 64, 2, 2, "float32", True)
    assert calls[2:] == ["ok"]  # compiled once for this configuration
    mask = create_block_mask(lambda q, k: np.abs(q - k) <= 4, 32, 16)
    q, k, v = split_qkv(1, 32, 32, 1, 1, 8)
    monkeypatch.setattr(flash, "_compile", fail)
    flash.check_compiles.cache_clear()
    with pytest.raises(ValueError, match="^fused kernel: tile 16, head dim 8, float32 failed to compile"):
        flash.fused_path("fused", q, k, v, mask, None)
    flash.check_compiles.cache_clear()
