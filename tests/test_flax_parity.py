"""Drop-in parity with ``flax.nnx.MultiHeadAttention`` at every batch rank flax accepts (issue 17, point 4).

flax takes ``[batch..., length, features]`` with any number of batch dims, zero included, in forward, masks and
decode (its own tests feed ``(length, features)``, ``(b1, b2, length, features)`` and decode ``(1, features)``
after ``init_cache(x.shape)``), sows ``[batch..., heads, q, k]`` weights and keeps a ``[batch..., S_max, K, H]``
cache. Users rely on all of that, so each is compared here against flax itself, with flax's parameters copied in.

The grid (``GRID``) spans batch dims 0/1/2 x decode x mask (none / random per example and head / random shared by
the batch) x dtype (float32, bfloat16) x normalize_qk x use_bias x grouped key/value heads with pairwise coverage:
every pair of values of any two factors occurs in some row (checked by ``test_grid_covers_every_pair``). The full
cartesian product would be 288 rows at a few seconds of compilation each; the suite budget allows ten. Each row
compares outputs and the gradients with respect to the inputs and every parameter; decode rows feed one token per
call and also compare with the full causal forward.

Precision: every test runs under ``jax.default_matmul_precision('highest')`` (tests/conftest.py) and compares at
8 units in the last place of the computation dtype (``8 * finfo(dtype).eps``: 1e-6 in float32, 0.06 in bfloat16),
relative to max(1, |reference|). On this CPU ours and flax's agree bit for bit (same XLA attention call); the
margin is for backends that pick kernels by shape. Every factor value also occurs in a float32 row, so nothing is
checked only at bfloat16's coarse tolerance.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.attention import KERNELS, MultiHeadAttention
from tests.helpers import np_randn

F, N, T, S, OUT = 8, 2, 4, 5, 6  # in_features, heads, q_len (decode steps), cross kv_len, out_features
BATCHES = [(), (3,), (2, 2)]
MASKS = ["none", "per_example", "shared"]
FIELDS = ("batch", "decode", "mask", "dtype", "normalize_qk", "use_bias", "num_kv_heads")
# Nine rows cover every pair of values of any two factors (the minimum: batch x mask alone has nine pairs); the
# tenth adds decode with two batch dims and a per-example mask, the case with the most reshaping.
GRID = [dict(zip(FIELDS, row)) for row in [
    ((),      False, "none",         jnp.float32,   False, True,  1),
    ((),      True,  "per_example",  jnp.float32,   True,  False, None),
    ((),      True,  "shared",       jnp.bfloat16,  False, False, 1),
    ((3,),    True,  "none",         jnp.float32,   False, False, None),
    ((3,),    False, "per_example",  jnp.bfloat16,  False, True,  None),
    ((3,),    False, "shared",       jnp.float32,   True,  True,  1),
    ((2, 2),  True,  "none",         jnp.bfloat16,  True,  True,  None),
    ((2, 2),  False, "per_example",  jnp.float32,   False, False, 1),
    ((2, 2),  False, "shared",       jnp.float32,   False, False, None),
    ((2, 2),  True,  "per_example",  jnp.bfloat16,  False, True,  1),
]]


def _row_id(row: dict) -> str:
    dtype = jnp.dtype(row["dtype"]).name
    return (f"b{len(row['batch'])}-{'decode' if row['decode'] else 'forward'}-{row['mask']}-{dtype}"
            f"-qk{int(row['normalize_qk'])}-bias{int(row['use_bias'])}-kv{row['num_kv_heads'] or N}")


def test_grid_covers_every_pair():
    """The docstring's claim: any two factors take every combination of their values somewhere in GRID."""
    levels = dict(batch=BATCHES, decode=[False, True], mask=MASKS, dtype=[jnp.float32, jnp.bfloat16],
                  normalize_qk=[False, True], use_bias=[False, True], num_kv_heads=[None, 1])
    for a, b in itertools.combinations(levels, 2):
        seen = {(levels[a].index(r[a]), levels[b].index(r[b])) for r in GRID}
        assert len(seen) == len(levels[a]) * len(levels[b]), (a, b)


# --- helpers ---------------------------------------------------------------------------------------------------

def _pair(**kw) -> tuple[nnx.Module, MultiHeadAttention]:
    """flax's module and ours with flax's parameters copied in (random biases, so they matter)."""
    common = dict(num_heads=N, in_features=F, out_features=OUT, decode=False,
                  bias_init=nnx.initializers.normal(0.5), **kw)
    theirs = nnx.MultiHeadAttention(rngs=nnx.Rngs(0), **common)
    ours = MultiHeadAttention(rngs=nnx.Rngs(1), **common)
    nnx.update(ours, nnx.state(theirs, nnx.Param))
    return theirs, ours


def _mask(kind: str, batch: tuple, q_len: int, kv_len: int) -> jax.Array | None:
    """A random boolean mask broadcastable to ``[*batch, N, q_len, kv_len]``.

    Every query keeps its own position, so no row is fully masked: decode (which pads the cache with unwritten
    slots) then equals the full forward, whose fully masked rows would average different keys.
    """
    if kind == "none":
        return None
    shape = (*batch, N, q_len, kv_len) if kind == "per_example" else (*(1,) * len(batch), 1, q_len, kv_len)
    return jnp.asarray(np.random.default_rng(7).random(shape) < 0.5) | jnp.eye(q_len, kv_len, dtype=bool)


def _forward(module, x, *, mask, causal=False):
    return module(x, mask=mask, is_causal=causal, decode=False)  # (*batch, T, OUT)


def _decode(module, x, *, mask):
    """Step-by-step decoding: ``init_cache(x.shape)``, then one ``[*batch, 1, F]`` token and mask row per call.

    The steps run in one ``lax.scan`` (a compiled decode loop, as greedy decoding runs), carrying the module's
    state, so the step compiles once whatever the length.
    """
    module.init_cache(x.shape, dtype=x.dtype)
    graphdef, state = nnx.split(module)
    row = lambda a, i: jax.lax.dynamic_slice_in_dim(a, i, 1, axis=-2)  # position i, kept as a length-1 axis

    def step(state, i):
        m = nnx.merge(graphdef, state)
        y = m(row(x, i), mask=None if mask is None else row(mask, i), decode=True)  # (*batch, 1, OUT)
        return nnx.state(m), y

    _, steps = jax.lax.scan(step, state, jnp.arange(x.shape[-2]))  # (T, *batch, 1, OUT)
    return jnp.moveaxis(steps[..., 0, :], 0, -2)  # (*batch, T, OUT)


def _value_and_grads(module, fn, x, cotangent, grads=True):
    """``fn(module, x)`` and the gradients of ``<fn(module, x), cotangent>`` wrt the parameters and ``x``.

    Pure (the module is split and merged inside), so decode's cache writes stay inside the compiled function.
    """
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)

    def loss(params, x):
        out = fn(nnx.merge(graphdef, params, rest), x)
        return jnp.vdot(out.astype(jnp.float32), cotangent), out

    if not grads:
        return jax.jit(loss)(params, x)[1], None
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
    return out, grads


def _close(actual, expected, dtype, what: str) -> None:
    """Equal up to 8 units in the last place of ``dtype``, relative to the larger of 1 and max |expected|."""
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    tol = 8 * float(jnp.finfo(dtype).eps)
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * max(1.0, np.abs(expected).max()), err_msg=what)


def _close_grads(actual, expected, dtype, what: str) -> None:
    """Gradient trees ``(params, x)``: same parameter paths, each leaf close."""
    (p_act, x_act), (p_exp, x_exp) = actual, expected
    _close(x_act, x_exp, dtype, f"{what}: d/d inputs")
    flat_act, flat_exp = dict(nnx.to_flat_state(p_act)), dict(nnx.to_flat_state(p_exp))
    assert flat_act.keys() == flat_exp.keys(), what
    for path in flat_exp:
        _close(flat_act[path][...], flat_exp[path][...], dtype, f"{what}: d/d {'.'.join(map(str, path))}")


# --- the grid --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("row", GRID, ids=_row_id)
def test_matches_flax(row):
    """Same outputs and gradients as flax; decode also equals our own full causal forward."""
    batch, dtype = row["batch"], row["dtype"]
    theirs, ours = _pair(dtype=dtype, normalize_qk=row["normalize_qk"], use_bias=row["use_bias"],
                         num_kv_heads=row["num_kv_heads"])
    x = np_randn(1, (*batch, T, F), dtype=dtype)  # (*batch, T, F)
    cotangent = np_randn(2, (*batch, T, OUT))
    mask = _mask(row["mask"], batch, T, T)
    fn = functools.partial(_decode if row["decode"] else _forward, mask=mask)
    out, grads = _value_and_grads(ours, fn, x, cotangent)
    ref, ref_grads = _value_and_grads(theirs, fn, x, cotangent)
    assert out.shape == ref.shape == (*batch, T, OUT) and out.dtype == ref.dtype
    _close(out, ref, dtype, "output vs flax")
    _close_grads(grads, ref_grads, dtype, "gradients vs flax")
    if row["decode"]:
        full, _ = _value_and_grads(ours, functools.partial(_forward, mask=mask, causal=True), x, cotangent,
                                   grads=False)
        _close(out, full, dtype, "decode vs full causal forward")


# --- what else flax users rely on, at every batch rank ---------------------------------------------------------

@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: f"b{len(b)}")
def test_cross_attention_and_sown_weights_match_flax(batch):
    """Separate keys and values of another length (flax's ``(3, 5)`` query with ``(9, 5)`` keys case, at every
    rank); sown weights ``[*batch, N, T, S]`` equal flax's, per-head outputs and values keep the batch dims."""
    theirs, ours = _pair(num_kv_heads=1)
    q, k, v = np_randn(1, (*batch, T, F)), np_randn(2, (*batch, S, F)), np_randn(3, (*batch, S, F))
    mask = _mask("per_example", batch, T, S)

    @nnx.jit  # one compilation instead of one per operation
    def run(theirs, ours):
        ref = theirs(q, k, v, mask=mask, sow_weights=True)
        out = ours(q, k, v, mask=mask, sow_weights=True, sow_head_outputs=True)
        return out, ref, nnx.pop(ours, nnx.Intermediate), nnx.pop(theirs, nnx.Intermediate)

    out, ref, sown, ref_sown = run(theirs, ours)
    _close(out, ref, jnp.float32, "cross-attention output")
    _close(sown["attention_weights"][0], ref_sown["attention_weights"][0], jnp.float32, "sown weights")
    assert sown["head_outputs"][0].shape == (*batch, T, N, F // N)
    assert sown["values"][0].shape == (*batch, S, 1, F // N)


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: f"b{len(b)}")
def test_cache_is_flax_shaped_and_interchangeable(batch):
    """``init_cache(x.shape)`` makes flax's ``[*batch, S_max, K, H]`` cache; after two steps both caches hold the
    same values, and flax's cache state loaded into our module continues with flax's outputs."""
    theirs, ours = _pair()
    x = np_randn(1, (*batch, T, F))
    for m in (theirs, ours):
        m.init_cache(x.shape)
        m(x[..., 0:1, :], decode=True)
        m(x[..., 1:2, :], decode=True)
    assert ours.cached_key.shape == theirs.cached_key.shape == (*batch, T, N, F // N)
    ref_cache, our_cache = nnx.state(theirs, nnx.Cache), nnx.state(ours, nnx.Cache)
    for name in ("cached_key", "cached_value", "cache_index"):
        _close(our_cache[name][...], ref_cache[name][...], jnp.float32, name)
    nnx.update(ours, ref_cache)
    _close(ours(x[..., 2:3, :], decode=True), theirs(x[..., 2:3, :], decode=True), jnp.float32, "step 3")


def test_head_mask_per_example_at_two_batch_dims():
    """``head_mask [*batch, N]`` scales each example's heads: equal to running each example alone (zero batch dims)
    with its ``[N]`` mask; size-1 batch dims broadcast; other shapes are one-line errors."""
    _, ours = _pair()
    batch = (2, 3)
    x, head_mask = np_randn(1, (*batch, T, F)), jnp.asarray(np.random.default_rng(2).random((*batch, N)))
    call = nnx.jit(lambda m, x, head_mask: m(x, head_mask=head_mask))  # one compilation per shape, not per op
    out = call(ours, x, head_mask)  # (2, 3, T, OUT)
    for i, j in itertools.product(range(2), range(3)):
        _close(out[i, j], call(ours, x[i, j], head_mask[i, j]), jnp.float32, f"example {i, j}")
    _close(call(ours, x, head_mask[:1]), call(ours, x, jnp.broadcast_to(head_mask[:1], (*batch, N))),
           jnp.float32, "size-1 batch dim")
    _close(call(ours, x, head_mask[0, 0]), call(ours, x, jnp.broadcast_to(head_mask[0, 0], (*batch, N))),
           jnp.float32, "[N] mask")
    for bad in (head_mask[0], jnp.ones((*batch, N + 1)), jnp.ones((1, *batch, N))):
        with pytest.raises(ValueError, match="head_mask must be"):
            ours(x, head_mask=bad)


@pytest.mark.parametrize("broadcast_dropout", [True, False])
def test_attention_dropout_matches_flax_at_two_batch_dims(broadcast_dropout):
    """Same dropout key, same dropped weights: flax's ``[*batch, N, T, S]`` dropout mask and ours on the merged
    batch draw the same bits, and a broadcast mask is shared by every example."""
    kw = dict(num_heads=N, in_features=F, dropout_rate=0.5, broadcast_dropout=broadcast_dropout, decode=False)
    theirs = nnx.MultiHeadAttention(rngs=nnx.Rngs(0, dropout=5), **kw)
    ours = MultiHeadAttention(rngs=nnx.Rngs(1, dropout=5), **kw)
    nnx.update(ours, nnx.state(theirs, nnx.Param))
    x = jnp.broadcast_to(np_randn(1, (T, F)), (2, 2, T, F))  # every example the same
    run = nnx.jit(lambda theirs, ours: (ours(x, deterministic=False), theirs(x, deterministic=False)))
    out, ref = run(theirs, ours)
    _close(out, ref, jnp.float32, "dropout output")
    assert np.allclose(out[0, 0], out[1, 1]) == broadcast_dropout


def test_is_causal_is_ignored_in_decode_as_flax():
    """``is_causal`` is ignored in decode, as flax 0.12.12 does (a causal mask on one query row would keep only the
    first key; flax 0.12.8, Python 3.11's last, still applied it there): ours with it equals flax's plain decode."""
    theirs, ours = _pair()
    x = np_randn(1, (T, F))
    steps = {}
    for name, m, causal in (("flax", theirs, False), ("ours", ours, True), ("plain", ours, False)):
        m.init_cache(x.shape)
        steps[name] = jnp.concatenate([m(x[i:i + 1], decode=True, is_causal=causal) for i in range(T)])
    _close(steps["ours"], steps["flax"], jnp.float32, "decode with is_causal")
    _close(steps["ours"], steps["plain"], jnp.float32, "is_causal changes nothing in decode")


def test_attention_fn_sees_flax_layout():
    """A flax-style ``attention_fn`` is called with ``[*batch, T, N, H]`` as flax calls it, and sows through the
    module as in flax."""
    theirs, ours = _pair(attention_fn=nnx.dot_product_attention)
    x = np_randn(1, (2, 2, T, F))
    mask = _mask("per_example", (2, 2), T, T)
    _close(ours(x, mask=mask, sow_weights=True), theirs(x, mask=mask, sow_weights=True), jnp.float32, "output")
    w, ref = nnx.pop(ours, nnx.Intermediate), nnx.pop(theirs, nnx.Intermediate)
    _close(w["attention_weights"][0], ref["attention_weights"][0], jnp.float32, "sown by attention_fn")


def test_layout_errors_are_one_line():
    _, ours = _pair()
    x = np_randn(1, (2, 3, T, F))
    cases = [
        (lambda: ours(x, np_randn(2, (3, S, F))), "batch dims of inputs_q"),
        (lambda: ours(x, mask=jnp.ones((3, 3, 1, T, T), bool)), "does not broadcast"),
        (lambda: ours(x, mask=jnp.ones((1, 2, 3, 1, T, T), bool)), "mask has 6 dims"),
        (lambda: ours(np_randn(1, (F,))), r"\[batch..., length, features\]"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    ours.init_cache((2, 3, T, F))
    with pytest.raises(ValueError, match="cache's batch dims"):
        ours(np_randn(1, (6, 1, F)), decode=True)


# --- every registered kernel gets every layout -----------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(KERNELS))
def test_every_kernel_takes_any_batch_rank(name):
    """The module merges batch dims before the kernel, so any kernel at batch dims (2, 2) equals it at batch 4, and
    with zero batch dims equals one example; with a key-padding mask, the one mask every kernel takes. (Decode is
    kernel-independent here: the cache merges batch dims before the kernel; the grid checks it.)"""
    m = MultiHeadAttention(4, 16, attention=name, decode=False, rngs=nnx.Rngs(0))
    t = 7
    x = np_randn(1, (4, t, 16))  # (B, T, F)
    valid = jnp.arange(t)[None, :] < jnp.array([[t], [t - 2], [t - 1], [t]])  # (B, T)
    mask = valid[:, None, None, :]  # (B, 1, 1, T)

    @nnx.jit  # one compilation instead of one per operation
    def run(m):
        return m(x, mask=mask), m(x.reshape(2, 2, t, 16), mask=mask.reshape(2, 2, 1, 1, t)), m(x[1], mask=mask[1])

    flat, two, none = run(m)
    _close(two, flat.reshape(2, 2, t, 16), jnp.float32, "batch (2, 2)")
    _close(none, flat[1], jnp.float32, "no batch dims")
