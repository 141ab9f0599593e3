"""Block-sparse flash attention: one fused Pallas kernel (forward and backward) for every static sparse pattern.

The pattern arrives as a :class:`~attn_lab.attention.block_mask.BlockMask`: per query block the key blocks it
touches, per key block the query blocks that see it (CSR lists, kernel operands), a token mask per distinct active
tile and a full/partial flag per tile. Each program of the grid ``(batch, head, tile)`` loops over its block's
list only, so a pattern costs in proportion to its active tiles
(Dao et al. 2022, "FlashAttention", arXiv:2205.14135: online softmax, no ``[T, T]`` matrix in memory; the
per-block list of active key blocks follows apple/axlearn's GPU block-sparse flash attention and PyTorch's
FlexAttention ``BlockMask``).

- Forward: online softmax over the active key blocks, float32 scores, sums and accumulators whatever the input
  dtype (bf16/fp16 inputs feed the matrix unit as they are); saves the row max and the row sum apart.
- Backward (two kernels, no atomics): dQ loops over a query block's key blocks, dK/dV over a key block's query
  blocks, both recomputing ``p = exp(s - m) / l`` (FlashAttention-2's split).
- Masks: a partial tile's token mask excludes a key (weight exactly 0), a full tile's is never loaded; key padding
  sets the logit to ``NEG``, so a query whose pattern keys are all padding averages them uniformly, as the XLA
  paths of the patterns do.
- Tiles: each kernel walks the blocks in its own tile, the largest that fits an H200's shared memory
  (:mod:`attn_lab.attention.tiles`), so nothing beyond the limit is compiled.
- Grouped-query heads: query head n reads key/value head ``n // (N / K)``; dK/dV are summed over each group.

On a CUDA GPU the kernels compile through Pallas' Triton backend; ``interpret=True`` runs the same kernels as jax
operations on any backend (how the CPU tests check them; slow, and it checks neither Triton's tile rules nor
speed). Block sizes come from :data:`~attn_lab.attention.block_mask.BLOCK_SIZES`; the head dim is padded with
zeros to a power of two >= 16 (which changes no dot product).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from attn_lab.attention.block_mask import BlockMask
from attn_lab.attention.dense import NEG
from attn_lab.attention.tiles import Plan, forced_plan, fused_tile, padded_head_dim


def num_warps(tile: int) -> int:
    """Warps per program: 4 for tiles up to 64, 8 for 128 (as jax's own Pallas flash attention chooses)."""
    return 8 if tile >= 128 else 4


def _dot(a: jax.Array, b: jax.Array, trans_a: bool = False, trans_b: bool = False) -> jax.Array:
    """2-D matmul with a float32 result (``pallas.triton.dot``'s contract, written with ``lax.dot_general`` so it
    reads the same across jax versions); lowers to Triton's ``tl.dot``."""
    dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _scores(q, k, tiles, where, visible, scale):
    """``[tq, tk]`` float32 logits of one tile: excluded keys ``-inf``, padded keys ``NEG``. ``tiles`` is
    ``(full_ref, tiles_ref)`` and ``where`` ``(tile id, query row, key column)`` of this tile inside its block's
    token mask: a full block (every query sees every key) skips loading and applying its token mask."""
    s = _dot(q, k, trans_b=True) * scale  # (tq, tk) float32
    if visible is not None:
        s = jnp.where(visible[None, :], s, NEG)
    full_ref, tiles_ref = tiles
    tile_id, row, col = where
    bs = tiles_ref.shape[1]

    def masked(s):
        return jnp.where(tiles_ref[pl.ds(tile_id * bs + row, s.shape[0]), pl.ds(col, s.shape[1])] != 0, s, -jnp.inf)
    return jax.lax.cond(full_ref[tile_id] != 0, lambda s: s, masked, s)


def _visible(valid_ref, start, size):
    return None if valid_ref is None else valid_ref[pl.ds(start, size)] != 0  # (size,) bool


def _step(j, idx_ref, bs, t):
    """Loop step ``j`` over a block's CSR list walked in ``t``-wide tiles: ``(list entry, other block, offset of
    the tile inside it)``; a block is ``bs // t`` tiles wide."""
    r = bs // t
    entry = j // r
    return entry, idx_ref[entry], (j % r) * t


def _forward_kernel(off_ref, idx_ref, tid_ref, full_ref, tiles_ref, q_ref, k_ref, v_ref, valid_ref, o_ref, m_ref,
                    l_ref, *, bs: int, t: int, scale: float):
    """One query tile: online softmax over the key tiles of its block's active key blocks (the CSR list
    ``off[qb]:off[qb + 1]``, each block walked in ``t``-wide tiles)."""
    i, r = pl.program_id(2), bs // t
    qb, row = i // r, (i % r) * t  # the query block, this tile's first row inside it
    q = q_ref[...]  # (t, Hp)
    hp = q.shape[-1]

    def body(j, carry):
        acc, m, l = carry  # (t, Hp), (t,), (t,)
        entry, kb, col = _step(j, idx_ref, bs, t)
        keys = pl.ds(kb * bs + col, t)
        k, v = k_ref[keys, :], v_ref[keys, :]  # (t, Hp) each
        s = _scores(q, k, (full_ref, tiles_ref), (tid_ref[entry], row, col), _visible(valid_ref, kb * bs + col, t),
                    scale)
        m_new = jnp.maximum(m, s.max(axis=-1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # a row with nothing allowed yet
        alpha = jnp.exp(m - m_safe)
        p = jnp.exp(s - m_safe[:, None])  # (t, t); excluded keys: exactly 0
        l = alpha * l + p.sum(axis=-1)
        acc = alpha[:, None] * acc + _dot(p.astype(v.dtype), v)
        return acc, m_new, l

    init = (jnp.zeros((t, hp), jnp.float32), jnp.full((t,), -jnp.inf, jnp.float32), jnp.zeros((t,), jnp.float32))
    acc, m, l = jax.lax.fori_loop(off_ref[qb] * r, off_ref[qb + 1] * r, body, init)
    l_safe = jnp.where(l > 0.0, l, 1.0)  # a row with no key at all (block filler): output 0
    o_ref[...] = (acc / l_safe[:, None]).astype(o_ref.dtype)
    # The row max and the row sum, saved apart (as tokamax does): their logsumexp ``m + log l`` rounds to ``m``
    # in float32 when m is NEG (a query whose pattern keys are all padding), which made p = 1 instead of 1 / l.
    m_ref[...] = jnp.where(m == -jnp.inf, 0.0, m)
    l_ref[...] = l_safe


def _probs_and_ds(q, k, v, do, m, l, delta, tiles, where, visible, scale):
    """Recomputed probabilities ``p = exp(s - m) / l`` and logit gradients ``ds`` of one tile (``[tq, tk]``
    float32 each)."""
    s = _scores(q, k, tiles, where, visible, scale)
    p = jnp.exp(s - m[:, None]) / l[:, None]  # excluded keys: 0
    dp = _dot(do, v, trans_b=True)  # (tq, tk)
    ds = p * (dp - delta[:, None])
    if visible is not None:  # a padded key's logit is the constant NEG: no gradient reaches q or k
        ds = jnp.where(visible[None, :], ds, 0.0)
    return p, ds * scale


def _dq_kernel(off_ref, idx_ref, tid_ref, full_ref, tiles_ref, q_ref, k_ref, v_ref, valid_ref, do_ref, m_ref, l_ref,
               delta_ref, dq_ref, *, bs: int, t: int, scale: float):
    """dQ of one query tile, over the key tiles of its block's active key blocks."""
    i, r = pl.program_id(2), bs // t
    qb, row = i // r, (i % r) * t
    q, do = q_ref[...], do_ref[...]  # (t, Hp) each
    m, l, delta = m_ref[...], l_ref[...], delta_ref[...]  # (t,) each

    def body(j, dq):
        entry, kb, col = _step(j, idx_ref, bs, t)
        keys = pl.ds(kb * bs + col, t)
        k, v = k_ref[keys, :], v_ref[keys, :]
        _, ds = _probs_and_ds(q, k, v, do, m, l, delta, (full_ref, tiles_ref), (tid_ref[entry], row, col),
                              _visible(valid_ref, kb * bs + col, t), scale)
        return dq + _dot(ds.astype(k.dtype), k)

    dq = jax.lax.fori_loop(off_ref[qb] * r, off_ref[qb + 1] * r, body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = dq.astype(dq_ref.dtype)


def _dkdv_kernel(off_ref, idx_ref, tid_ref, full_ref, tiles_ref, q_ref, k_ref, v_ref, valid_ref, do_ref, m_ref,
                 l_ref, delta_ref, dk_ref, dv_ref, *, bs: int, t: int, scale: float):
    """dK and dV of one key tile (for one query head), over the query tiles of the query blocks that see its
    block."""
    i, r = pl.program_id(2), bs // t
    kb, col = i // r, (i % r) * t  # the key block, this tile's first column inside it
    k, v = k_ref[...], v_ref[...]  # (t, Hp) each
    visible = _visible(valid_ref, kb * bs + col, t)

    def body(j, carry):
        dk, dv = carry
        entry, qb, row = _step(j, idx_ref, bs, t)
        rows = pl.ds(qb * bs + row, t)
        q, do = q_ref[rows, :], do_ref[rows, :]  # (t, Hp) each
        p, ds = _probs_and_ds(q, k, v, do, m_ref[rows], l_ref[rows], delta_ref[rows], (full_ref, tiles_ref),
                              (tid_ref[entry], row, col), visible, scale)
        dv = dv + _dot(p.astype(do.dtype), do, trans_a=True)
        dk = dk + _dot(ds.astype(q.dtype), q, trans_a=True)
        return dk, dv

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(off_ref[kb] * r, off_ref[kb + 1] * r, body, (zeros, zeros))
    dk_ref[...], dv_ref[...] = dk.astype(dk_ref.dtype), dv.astype(dv_ref.dtype)


def _whole(x: np.ndarray | jax.Array) -> pl.BlockSpec:
    """A BlockSpec handing every program the whole (small, static) array."""
    return pl.BlockSpec(x.shape, lambda *_: (0,) * len(x.shape))


def _block_specs(t: int, t_pad: int, hp: int, group: int) -> dict[str, pl.BlockSpec]:
    """The BlockSpecs over the grid ``(batch b, query head n, tile i)``: the ``t`` rows of a program's own tile
    (``*_block``) or the whole sequence, which its loop slices (``*_whole``); k/v read kv head ``n // group``."""
    return {
        "q_block": pl.BlockSpec((None, t, None, hp), lambda b, n, i: (b, i, n, 0)),
        "q_whole": pl.BlockSpec((None, t_pad, None, hp), lambda b, n, i: (b, 0, n, 0)),
        "kv_block": pl.BlockSpec((None, t, None, hp), lambda b, n, i: (b, i, n // group, 0)),
        "kv_whole": pl.BlockSpec((None, t_pad, None, hp), lambda b, n, i: (b, 0, n // group, 0)),
        "rows_block": pl.BlockSpec((None, None, t), lambda b, n, i: (b, n, i)),
        "rows_whole": pl.BlockSpec((None, None, t_pad), lambda b, n, i: (b, n, 0)),
        "valid": pl.BlockSpec((None, t_pad), lambda b, n, i: (b, 0)),
    }


def _inputs(lists, tiles, valid, q_spec, kv_spec, specs) -> list[pl.BlockSpec | None]:
    """Specs of the operands every kernel takes first: (3 CSR lists, full flags, tiles, q, k, v, valid or None)."""
    return [_whole(a) for a in (*lists, *tiles)] + [q_spec, kv_spec, kv_spec,
                                                    None if valid is None else specs["valid"]]


def _call(kernel, bs, tile_stages, grid, in_specs, out_specs, out_shape, interpret, name):
    """``pallas_call`` of ``kernel`` at its ``(tile, stages)``: the grid's last axis walks the blocks in tiles."""
    t, stages = tile_stages
    b, n, nb = grid
    return pl.pallas_call(functools.partial(kernel, bs=bs, t=t), grid=(b, n, nb * (bs // t)), in_specs=in_specs,
                          out_specs=out_specs, out_shape=out_shape,
                          compiler_params=plgpu.CompilerParams(num_warps=num_warps(t), num_stages=stages),
                          interpret=interpret, name=name)


def _mask_arrays(mask: BlockMask):
    """The block mask as kernel operands: the CSR lists per query block and per key block (offsets, blocks, tile
    ids: O(active tiles), not O(blocks^2)), and the tiles as (full flag per tile, token masks ``[U * bs, bs]``)."""
    kv = tuple(jnp.asarray(a) for a in mask.ragged("kv"))
    qs = tuple(jnp.asarray(a) for a in mask.ragged("q"))
    tiles = (jnp.asarray(mask.tiles.all(axis=(1, 2)).astype(np.int32)),
             jnp.asarray(mask.tiles.reshape(-1, mask.block_size).astype(np.int8)))
    return kv, qs, tiles


def _forward(q, k, v, valid, mask: BlockMask, scale: float, plan: Plan, interpret: bool):
    """``q [B, Tp, N, Hp]``, ``k, v [B, Tp, K, Hp]`` -> ``(out [B, Tp, N, Hp], m [B, N, Tp], l [B, N, Tp])``."""
    b, t_pad, n, hp = q.shape
    bs, (t, _) = mask.block_size, plan.of("forward")
    specs = _block_specs(t, t_pad, hp, n // k.shape[2])
    kv, _, tiles = _mask_arrays(mask)
    rows = jax.ShapeDtypeStruct((b, n, t_pad), jnp.float32)
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype), rows, rows]
    return _call(functools.partial(_forward_kernel, scale=scale), bs, plan.of("forward"), (b, n, mask.num_blocks),
                 _inputs(kv, tiles, valid, specs["q_block"], specs["kv_whole"], specs),
                 [specs["q_block"], specs["rows_block"], specs["rows_block"]], out_shape, interpret,
                 "block_sparse_flash_fwd")(*kv, *tiles, q, k, v, valid)


def _backward(q, k, v, valid, out, m, l, do, mask: BlockMask, scale: float, plan: Plan, interpret: bool):
    """``(dq, dk, dv)`` of the padded inputs; dk/dv summed over each group of query heads."""
    b, t_pad, n, hp = q.shape
    bs, kh = mask.block_size, k.shape[2]
    kv, qs, tiles = _mask_arrays(mask)
    delta = jnp.einsum("btnh,btnh->bnt", out.astype(jnp.float32), do.astype(jnp.float32))  # (B, N, Tp)
    grid = (b, n, mask.num_blocks)
    specs = _block_specs(plan.of("dq")[0], t_pad, hp, n // kh)
    dq_in = _inputs(kv, tiles, valid, specs["q_block"], specs["kv_whole"], specs)
    dq_in += [specs["q_block"]] + [specs["rows_block"]] * 3  # dO, m, l, delta of this query tile
    dq = _call(functools.partial(_dq_kernel, scale=scale), bs, plan.of("dq"), grid, dq_in, specs["q_block"],
               jax.ShapeDtypeStruct(q.shape, q.dtype), interpret, "block_sparse_flash_dq")(
        *kv, *tiles, q, k, v, valid, do, m, l, delta)
    specs = _block_specs(plan.of("dkdv")[0], t_pad, hp, n // kh)
    dkv_in = _inputs(qs, tiles, valid, specs["q_whole"], specs["kv_block"], specs)
    dkv_in += [specs["q_whole"]] + [specs["rows_whole"]] * 3  # the loop slices the query tiles
    per_head = jax.ShapeDtypeStruct((b, t_pad, n, hp), jnp.float32)  # summed over each group below
    dk, dv = _call(functools.partial(_dkdv_kernel, scale=scale), bs, plan.of("dkdv"), grid, dkv_in,
                   [specs["q_block"], specs["q_block"]], [per_head, per_head], interpret,
                   "block_sparse_flash_dkdv")(*qs, *tiles, q, k, v, valid, do, m, l, delta)
    group = n // kh
    dk = dk.reshape(b, t_pad, kh, group, hp).sum(3).astype(k.dtype)  # (B, Tp, K, Hp)
    dv = dv.reshape(b, t_pad, kh, group, hp).sum(3).astype(v.dtype)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _flash(q, k, v, valid, mask, scale, plan, interpret):
    return _forward(q, k, v, valid, mask, scale, plan, interpret)[0]


def _flash_fwd(q, k, v, valid, mask, scale, plan, interpret):
    out, m, l = _forward(q, k, v, valid, mask, scale, plan, interpret)
    return out, (q, k, v, valid, out, m, l)


def _flash_bwd(mask, scale, plan, interpret, residuals, do):
    q, k, v, valid, out, m, l = residuals
    dq, dk, dv = _backward(q, k, v, valid, out, m, l, do, mask, scale, plan, interpret)
    return dq, dk, dv, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _pad(x: jax.Array, t_pad: int, hp: int) -> jax.Array:
    """``[B, T, heads, H] -> [B, Tp, heads, Hp]`` with zeros."""
    return jnp.pad(x, ((0, 0), (0, t_pad - x.shape[1]), (0, 0), (0, hp - x.shape[3])))


@functools.partial(jax.jit, static_argnames=("mask", "interpret", "tile", "stages"))
def block_sparse_flash(query: jax.Array, key: jax.Array, value: jax.Array, mask: BlockMask, *,
                       key_valid: jax.Array | None = None, interpret: bool = False, tile: int | None = None,
                       stages: int | None = None) -> jax.Array:
    """Exact softmax attention restricted to ``mask``'s pattern, fused: ``[B, T, N, H]`` x ``[B, T, K, H]``.

    Args:
      query: ``[B, T, N, H]``; key, value: ``[B, T, K, H]`` with K dividing N; float32, bfloat16 or float16.
      mask: from :func:`~attn_lab.attention.block_mask.create_block_mask` at this T (causality is part of it).
        Static and hashed by identity: cache it, so one length compiles once.
      key_valid: ``[B, T]`` key-padding vector (False masks a key out) or None.
      interpret: run the kernels as jax operations (any backend; for tests), instead of compiling them for a
        CUDA GPU through Triton.
      tile, stages: every kernel's tile (dividing the mask's block) and pipeline stages, both set (the device
        check's compile matrix; still refused beyond shared memory, :func:`~attn_lab.attention.tiles.forced_plan`);
        None: the tile rule's per kernel (:func:`~attn_lab.attention.tiles.fused_tile`).

    Returns:
      ``[B, T, N, H]`` in the query dtype. Differentiable in query, key and value (fused backward).
    """
    b, t, n, h = query.shape
    if key.shape[1] != t or mask.length != t:
        raise ValueError(f"block-sparse flash attention is self-attention: query length {t}, key length "
                         f"{key.shape[1]}, block mask length {mask.length}")
    t_pad, hp = mask.num_blocks * mask.block_size, padded_head_dim(h)
    if (tile is None) != (stages is None):
        raise ValueError("block_sparse_flash: set both tile and stages, or neither (the tile rule's)")
    plan = (fused_tile(mask.block_size, h, query.dtype) if tile is None
            else forced_plan(mask.block_size, tile, stages, h, query.dtype))
    valid = None
    if key_valid is not None:
        valid = jnp.pad(jnp.broadcast_to(key_valid, (b, t)).astype(jnp.int8), ((0, 0), (0, t_pad - t)))
    q, k, v = (_pad(x, t_pad, hp) for x in (query, key, value))
    out = _flash(q, k, v.astype(q.dtype), valid, mask, float(h) ** -0.5, plan, interpret)  # (B, Tp, N, Hp)
    return out[:, :t, :, :h]


def fused_path(path: str, query: jax.Array, key: jax.Array, value: jax.Array, mask: BlockMask,
               key_valid: jax.Array | None) -> jax.Array:
    """A kernel's 'fused' / 'fused_interpret' dispatch path (``dispatch.FUSED``): the kernel compiled or
    interpreted. The compiled path is first compiled alone, forward and backward, per launch configuration
    (:func:`check_compiles`), so a compile failure is one line naming the tile, head dim and dtype."""
    if path == "fused":
        check_compiles(mask.block_size, query.shape[-1], query.shape[-2], key.shape[-2], str(query.dtype),
                       key_valid is not None)
    return block_sparse_flash(query, key, value, mask, key_valid=key_valid, interpret=path == "fused_interpret")


@functools.lru_cache(maxsize=None)
def check_compiles(tile: int, head_dim: int, heads: int, kv_heads: int, dtype: str, padded: bool) -> None:
    """Compiles the fused forward and backward once for this launch configuration (two blocks of ``tile`` of a
    full pattern, each kernel at the tile rule's tile), turning a Triton or Pallas failure into one ValueError
    naming the tile, head dim and dtype (never a silent fallback to another path). Cached: one check per
    configuration and process."""
    from attn_lab.attention.block_mask import create_block_mask

    plan = fused_tile(tile, head_dim, jnp.dtype(dtype))  # the rule's own one-line refusal, if any
    mask = create_block_mask(lambda q, k: (q >= 0) & (k >= 0), 2 * tile, tile)  # every tile full
    shape = (1, 2 * tile, heads, head_dim)
    q = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))
    kv = jax.ShapeDtypeStruct((1, 2 * tile, kv_heads, head_dim), jnp.dtype(dtype))
    valid = jax.ShapeDtypeStruct((1, 2 * tile), jnp.bool_) if padded else None

    def loss(q, k, v, valid):
        return block_sparse_flash(q, k, v, mask, key_valid=valid).astype(jnp.float32).sum()
    try:
        _compile(jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))), q, kv, kv, valid)
    except Exception as e:  # noqa: BLE001 (Triton and Mosaic raise their own types)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"fused kernel: tile {tile}, head dim {head_dim}, {dtype} failed to compile "
                         f"({plan.launch()}; {type(e).__name__}: {first}); set implementation to the XLA path "
                         "(e.g. 'blockwise') or another fused_block_size") from None


def _compile(fn, *args) -> None:
    """Lowers and compiles ``fn`` at ``args`` (apart, so a test can make it fail)."""
    fn.lower(*args).compile()
