"""Static block masks for the fused block-sparse flash kernel (:mod:`attn_lab.attention.flash`).

A sparse pattern is one function, ``mask_mod(q_pos, k_pos) -> bool`` (numpy broadcasting; query ``q_pos`` may
see key ``k_pos``), as PyTorch's FlexAttention names it. :func:`create_block_mask` cuts the ``[T, T]`` pattern into
``block_size x block_size`` tiles once, in numpy at trace time, and keeps what the kernel needs to visit only the
tiles the pattern touches:

- per query block, the list of its active key blocks (``kv_indices``, ``kv_counts``) and, per key block, the list
  of query blocks that see it (``q_indices``, ``q_counts``: the backward pass's dK/dV loop);
- the exact token mask of every active tile, deduplicated (``tiles``; tile 0 is the all-True tile, so a tile the
  pattern covers fully costs no mask bytes of its own).

So the kernel's work is proportional to the number of active tiles (:attr:`BlockMask.active`), not to ``T^2``.
Evaluating ``mask_mod`` on all ``T^2`` pairs is what a long sequence cannot afford, so a pattern may give a
``cover``: a superset of its active tiles at block level (``cover(num_blocks, block_size) -> bool [nb, nb]``), and
``mask_mod`` is then evaluated only inside it. A pattern whose mask depends only on ``q - k`` (sliding windows,
strides) says ``shift_invariant=True`` and its tiles are evaluated once per block offset.

Nothing here is traced: a BlockMask is hashed by identity and meant to be cached (the patterns use
``functools.lru_cache``), so one length compiles once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

MaskMod = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (q_pos, k_pos) -> bool, numpy broadcasting
Cover = Callable[[int, int], "np.ndarray | None"]  # (num_blocks, block_size) -> [nb, nb] superset of active tiles

BLOCK_SIZES = (16, 32, 64, 128)  # Triton: power-of-two tiles, >= 16 for tl.dot, <= 128 for shared memory
MAX_EVALUATED = 1 << 31  # token pairs mask_mod may be evaluated on (~2 GiB of booleans)


def check_block_size(value: object, name: str = "attention.fused_block_size") -> int:
    """A block size the GPU path compiles: one of ``BLOCK_SIZES``; a one-line ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) not in BLOCK_SIZES:
        raise ValueError(f"{name} must be one of {BLOCK_SIZES} (Triton tiles are powers of two, >= 16 for its "
                         f"matrix unit and <= 128 for shared memory), got {value!r}")
    return int(value)


@dataclasses.dataclass(frozen=True, eq=False)
class BlockMask:
    """Which tiles of the ``[T, T]`` pattern are active, and their token masks (numpy; never traced).

    Attributes:
      length: T (queries == keys).
      block_size: bs; the sequence is padded to ``num_blocks * bs``.
      kv_indices: ``[nb, max_k]`` active key blocks of each query block (first ``kv_counts[q]`` entries).
      kv_counts: ``[nb]``.
      kv_tiles: ``[nb, max_k]`` the tile id of each (query block, key block) entry.
      q_indices, q_counts, q_tiles: the same lists per key block (``[nb, max_q]``, ``[nb]``, ``[nb, max_q]``).
      tiles: ``[num_tiles, bs, bs]`` bool; ``tiles[0]`` is all True; rows are queries, columns keys.
    """

    length: int
    block_size: int
    kv_indices: np.ndarray
    kv_counts: np.ndarray
    kv_tiles: np.ndarray
    q_indices: np.ndarray
    q_counts: np.ndarray
    q_tiles: np.ndarray
    tiles: np.ndarray

    @property
    def num_blocks(self) -> int:
        return self.kv_counts.shape[0]

    @property
    def active(self) -> int:
        """Active tiles: the kernel's work, in tiles (``num_blocks ** 2`` for dense attention)."""
        return int(self.kv_counts.sum())

    @property
    def density(self) -> float:
        """Fraction of the ``nb x nb`` tiles that are active."""
        return self.active / self.num_blocks ** 2

    def ragged(self, side: str = "kv") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The lists of ``side`` ('kv': per query block its key blocks; 'q': per key block its query blocks) in
        CSR form -- ``offsets [nb + 1]``, ``blocks [active]``, ``tile ids [active]`` (int32) -- what the fused kernel
        embeds in its program: O(active tiles), where the padded ``[nb, max]`` lists are O(blocks^2) for a pattern
        with global blocks (BigBird at 64K tokens: 16 MiB padded, tests/test_kernel_flash.py)."""
        indices, counts, tile_ids = ((self.kv_indices, self.kv_counts, self.kv_tiles) if side == "kv"
                                     else (self.q_indices, self.q_counts, self.q_tiles))
        used = np.arange(indices.shape[1])[None, :] < counts[:, None]  # (nb, max): the real entries, row-major
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        return offsets, indices[used].astype(np.int32), tile_ids[used].astype(np.int32)

    def dense(self) -> np.ndarray:
        """The ``[T, T]`` pattern the block mask encodes (O(T^2): for tests and analysis)."""
        nb, bs = self.num_blocks, self.block_size
        out = np.zeros((nb * bs, nb * bs), bool)
        for q in range(nb):
            for j in range(self.kv_counts[q]):
                k = self.kv_indices[q, j]
                out[q * bs:(q + 1) * bs, k * bs:(k + 1) * bs] = self.tiles[self.kv_tiles[q, j]]
        return out[:self.length, :self.length]


def _candidate_pairs(nb: int, bs: int, cover: Cover | None, is_causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(q_block, k_block)`` pairs the cover allows (all pairs without one), causal ones only when causal."""
    active = None if cover is None else cover(nb, bs)
    if active is None:
        active = np.ones((nb, nb), bool)
    else:
        active = np.asarray(active, bool)
        if active.shape != (nb, nb):
            raise ValueError(f"a block-mask cover must return a [{nb}, {nb}] boolean array, got {active.shape}")
    if is_causal:
        active = active & np.tri(nb, dtype=bool)  # key block <= query block
    return np.nonzero(active)  # (P,), (P,), sorted by query block


def _tile_masks(mask_mod: MaskMod, qb: np.ndarray, kb: np.ndarray, bs: int, length: int, is_causal: bool
                ) -> np.ndarray:
    """``[P, bs, bs]`` exact masks of the pairs: pattern, causality and real keys (``k < T``).

    ``mask_mod`` sees positions clipped to ``T - 1`` (a pattern may index tables of T entries); the block-filling
    keys are masked out afterwards and the filling queries' rows are never read.
    """
    r = np.arange(bs)
    q_pos = qb[:, None, None] * bs + r[None, :, None]  # (P, bs, 1)
    k_pos = kb[:, None, None] * bs + r[None, None, :]  # (P, 1, bs)
    allowed = mask_mod(np.minimum(q_pos, length - 1), np.minimum(k_pos, length - 1))
    mask = np.broadcast_to(np.asarray(allowed, bool), (qb.size, bs, bs))
    mask = mask & (k_pos < length)
    return mask & (k_pos <= q_pos) if is_causal else mask


def _dedupe(masks: np.ndarray, unique: dict[bytes, int], tiles: list[np.ndarray]) -> np.ndarray:
    """Tile ids of ``masks [P, bs, bs]``, adding unseen tiles to ``tiles`` (``unique``: packed bytes -> id)."""
    ids = np.empty(masks.shape[0], np.int32)
    for i, tile in enumerate(masks):
        ids[i] = unique.setdefault(np.packbits(tile).tobytes(), len(unique))
        if ids[i] == len(tiles):
            tiles.append(tile)
    return ids


def _evaluate(mask_mod: MaskMod, qb: np.ndarray, kb: np.ndarray, bs: int, length: int, is_causal: bool,
              shift_invariant: bool) -> tuple[np.ndarray, np.ndarray]:
    """Deduplicated tiles ``[U, bs, bs]`` (tile 0 all True) and each pair's tile id ``[P]``."""
    nb = -(-length // bs)
    tiles = [np.ones((bs, bs), bool)]
    unique = {np.packbits(tiles[0]).tobytes(): 0}
    ids = np.empty(qb.size, np.int32)
    if shift_invariant:  # one evaluation per block offset; the last key block (partly beyond T) on its own
        offsets, inverse = np.unique(qb - kb, return_inverse=True)
        base = _tile_masks(mask_mod, offsets.clip(0), (-offsets).clip(0), bs, nb * bs, is_causal)  # (O, bs, bs)
        ids[:] = _dedupe(base, unique, tiles)[inverse.reshape(-1)]
        tail = kb == nb - 1
        if tail.any():
            ids[tail] = _dedupe(_tile_masks(mask_mod, qb[tail], kb[tail], bs, length, is_causal), unique, tiles)
        return np.stack(tiles), ids
    if qb.size * bs * bs > MAX_EVALUATED:
        raise ValueError(f"the pattern would be evaluated on {qb.size * bs * bs:,} token pairs (T={length}); give "
                         f"create_block_mask a cover (or shift_invariant=True) so it evaluates only the tiles the "
                         f"pattern can touch")
    chunk = max(1, (1 << 24) // (bs * bs))  # pairs evaluated at once: ~16 MiB of booleans
    for start in range(0, qb.size, chunk):
        part = slice(start, start + chunk)
        ids[part] = _dedupe(_tile_masks(mask_mod, qb[part], kb[part], bs, length, is_causal), unique, tiles)
    return np.stack(tiles), ids


def _lists(major: np.ndarray, minor: np.ndarray, tile_ids: np.ndarray, nb: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per ``major`` block, its ``minor`` blocks and tile ids, padded: ``[nb, m]``, ``[nb]``, ``[nb, m]``."""
    order = np.lexsort((minor, major))
    major, minor, tile_ids = major[order], minor[order], tile_ids[order]
    counts = np.bincount(major, minlength=nb).astype(np.int32)  # (nb,)
    width = max(1, int(counts.max(initial=0)))
    slot = np.arange(major.size) - np.repeat(np.cumsum(counts) - counts, counts)
    indices = np.zeros((nb, width), np.int32)
    tiles = np.zeros((nb, width), np.int32)
    indices[major, slot], tiles[major, slot] = minor, tile_ids
    return indices, counts, tiles


def create_block_mask(mask_mod: MaskMod, length: int, block_size: int, *, is_causal: bool = False,
                      cover: Cover | None = None, shift_invariant: bool = False, name: str = "pattern"
                      ) -> BlockMask:
    """The block mask of ``mask_mod`` (and causality) at length T, in tiles of ``block_size``.

    Args:
      mask_mod: ``(q_pos, k_pos) -> bool`` on integer numpy arrays that broadcast.
      length: T; block_size: one of ``BLOCK_SIZES``.
      is_causal: intersect the pattern with ``k <= q``.
      cover: optional block-level superset of the active tiles (see the module docstring).
      shift_invariant: ``mask_mod`` depends on ``q - k`` only.
      name: how errors name the pattern.

    Raises:
      ValueError (one line): a block size the GPU path cannot compile, or a query that sees no key (the softmax
      of an empty row is undefined; every registered pattern includes the query itself).
    """
    bs = check_block_size(block_size)
    nb = -(-length // bs)
    qb, kb = _candidate_pairs(nb, bs, cover, is_causal)
    tiles, ids = _evaluate(mask_mod, qb, kb, bs, length, is_causal, shift_invariant)
    rows = tiles.any(axis=2)  # (U, bs): which queries of a tile see a key
    keep = rows.any(axis=1)[ids]  # the cover's tiles the pattern leaves empty are dropped
    qb, kb, ids = qb[keep], kb[keep], ids[keep]
    sees = np.zeros((nb, bs), bool)
    np.logical_or.at(sees, qb, rows[ids])
    blind = np.flatnonzero(~sees.reshape(-1)[:length])
    if blind.size:
        block = blind[0] // bs
        raise ValueError(f"{name}: query {blind[0]} (block {block}, positions {block * bs}..{block * bs + bs - 1}) "
                         f"sees no key at T={length}{', causal' if is_causal else ''}; every query must see at "
                         f"least one key ({blind.size} do not)")
    kv = _lists(qb, kb, ids, nb)
    q = _lists(kb, qb, ids, nb)
    return BlockMask(length, bs, *kv, *q, tiles)
