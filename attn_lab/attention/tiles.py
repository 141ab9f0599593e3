"""The fused kernels' tile rule: which tile and pipeline depth each kernel runs at (pure; tested on a CPU).

A Triton program of the block-sparse flash kernels keeps on chip its resident operand tiles, its float32
accumulators, and ``stages`` copies of the tiles it streams through its loop (Triton's software pipeline):

- forward: q resident, o accumulated, k and v streamed;
- dQ: q and dO resident, dq accumulated, k and v streamed;
- dK/dV: k and v resident, dk and dv accumulated, q and dO streamed (the largest: two float32 accumulators).

Each streamed step also loads the tile's int8 token mask (a partial tile's). :func:`kernel_bytes` adds these up.
Accumulators live in registers rather than shared memory, but a tile whose accumulators would not fit the 227 KiB
either spills registers or fails to compile, so they count against the one on-chip budget (:func:`smem_limit`):
a conservative rule until a device check (scripts/fused_check.py) measures where compilation really stops.

Each kernel gets its own tile (as jax's reference Pallas flash attention gives its backward kernels their own
block sizes): the largest of :data:`TILES` that divides the block mask's block and fits at :data:`STAGES` stages,
else at one stage; the kernel walks a block as ``(block / tile)^2`` tiles. So dK/dV at head dim 128 in bfloat16
runs 64-wide tiles inside 128-wide blocks (128 would need 272 KiB even at one stage). A configuration
beyond the limit is never compiled: a block with a kernel that fits at no tile is refused in one line.
"""

from __future__ import annotations

import dataclasses

import numpy as np

SMEM_LIMIT = 227 * 1024  # bytes of shared memory per thread block on sm_90 (H100 / H200): 232,448
STAGES = 2  # pipeline depth a kernel gets when it fits (jax's Pallas flash attention uses 2)
TILES = (128, 64, 32, 16)  # Triton: powers of two, >= 16 for tl.dot; the largest first
KERNELS = ("forward", "dq", "dkdv")
_ROLES = {  # (resident [tile, Hp] operands, float32 [tile, Hp] accumulators, streamed [tile, Hp] operands)
    "forward": (1, 1, 2), "dq": (2, 1, 2), "dkdv": (2, 2, 2)}


def smem_limit(device_kind: str | None = None) -> int:
    """Bytes of shared memory one program may use: 227 KiB on an H100 or H200 (sm_90), the only GPUs this rule
    has been written for; other devices get the same figure (the device check is where to correct it)."""
    del device_kind  # one figure until another GPU is measured
    return SMEM_LIMIT


def padded_head_dim(head_dim: int) -> int:
    """The head dim the kernel computes at: the next power of two, at least 16 (Triton's dot)."""
    return max(16, 1 << (int(head_dim) - 1).bit_length())


def kernel_bytes(kernel: str, tile_q: int, tile_k: int, head_dim: int, dtype: object, stages: int) -> int:
    """Estimated on-chip bytes of one program of ``kernel`` ('forward', 'dq' or 'dkdv').

    Args:
      kernel: which of the three kernels.
      tile_q, tile_k: the query and key tile (rows and columns of a ``[tile_q, tile_k]`` score tile).
      head_dim: the head dim (padded here as the kernel pads it).
      dtype: the operand dtype (accumulators are float32 whatever it is).
      stages: pipeline stages of the streamed operands.

    Returns:
      Resident operands + float32 accumulators + ``stages`` x (streamed operands + the int8 token mask).
    """
    resident, accumulators, streamed = _ROLES[kernel]
    own, other = (tile_k, tile_q) if kernel == "dkdv" else (tile_q, tile_k)  # the program's rows; the loop's rows
    e, hp = np.dtype(dtype).itemsize, padded_head_dim(head_dim)
    return own * hp * (resident * e + accumulators * 4) + stages * (streamed * other * hp * e + tile_q * tile_k)


def choose_tile(kernel: str, head_dim: int, dtype: object, block: int, limit: int | None = None
                ) -> tuple[int, int, str] | None:
    """The tile and stages ``kernel`` runs at inside ``block``-wide blocks, and why; None when none fits.

    The largest of :data:`TILES` dividing ``block`` that fits at :data:`STAGES` stages, else the largest that fits
    at one stage (every tile divides the padded sequence, a multiple of the block).
    """
    limit = smem_limit() if limit is None else limit
    tiles = [t for t in TILES if t <= block and block % t == 0]
    for stages in (STAGES, 1):
        fits = [t for t in tiles if kernel_bytes(kernel, t, t, head_dim, dtype, stages) <= limit]
        if fits:
            tile = fits[0]
            need = kernel_bytes(kernel, block, block, head_dim, dtype, stages) // 1024
            why = "" if tile == block else f" ({block}x{stages}: {need} KiB)"
            return tile, stages, f"{kernel} {tile}x{stages}{why}"
    return None


@dataclasses.dataclass(frozen=True)
class Plan:
    """The fused kernels' launch: per kernel its tile and pipeline stages, and why (for the dispatch line)."""

    block: int
    tiles: tuple[int, int, int]  # forward, dq, dkdv (hashable: the plan is a static argument)
    stages: tuple[int, int, int]
    why: str

    def of(self, kernel: str) -> tuple[int, int]:
        """``(tile, stages)`` of ``kernel``."""
        i = KERNELS.index(kernel)
        return self.tiles[i], self.stages[i]

    def launch(self) -> str:
        """``'forward 64x2, dq 64x2, dkdv 32x2'``: each kernel's tile x stages."""
        return ", ".join(f"{k} {t}x{s}" for k, t, s in zip(KERNELS, self.tiles, self.stages))


def fused_tile(block: int, head_dim: int, dtype: object, limit: int | None = None) -> Plan:
    """Per kernel the tile and stages of the tile rule inside ``block``-wide blocks; a one-line ValueError naming
    the block, head dim and dtype when a kernel fits at no tile."""
    limit = smem_limit() if limit is None else limit
    name = np.dtype(dtype).name
    chosen = {k: choose_tile(k, head_dim, dtype, block, limit) for k in KERNELS}
    missing = [k for k in KERNELS if chosen[k] is None]
    if missing:
        least = min(t for t in TILES if t <= block)
        raise ValueError(f"fused kernel: block {block} with head dim {head_dim} in {name} does not fit in "
                         f"{limit // 1024} KiB of shared memory at any tile ({missing[0]}: "
                         f"{kernel_bytes(missing[0], least, least, head_dim, dtype, 1) // 1024} KiB at tile {least}, "
                         "one stage); use an implementation that is not fused")
    why = (f"block {block}, head dim {padded_head_dim(head_dim)} {name}: "
           + ", ".join(chosen[k][2] for k in KERNELS) + f" within {limit // 1024} KiB")
    return Plan(block, tuple(chosen[k][0] for k in KERNELS), tuple(chosen[k][1] for k in KERNELS), why)


def forced_plan(block: int, tile: int, stages: int, head_dim: int, dtype: object, limit: int | None = None) -> Plan:
    """Every kernel at ``tile`` and ``stages`` (the device check's compile matrix), checked against the same
    estimate: a one-line ValueError naming the tile, head dim and dtype instead of compiling beyond the limit."""
    limit = smem_limit() if limit is None else limit
    name = np.dtype(dtype).name
    if tile > block or block % tile:
        raise ValueError(f"fused kernel: tile {tile} does not divide the block {block}")
    over = {k: kernel_bytes(k, tile, tile, head_dim, dtype, stages) for k in KERNELS}
    over = {k: b for k, b in over.items() if b > limit}
    if over:
        k = max(over, key=over.get)
        raise ValueError(f"fused kernel: tile {tile} with head dim {head_dim} in {name} at {stages} stage(s) does "
                         f"not fit in {limit // 1024} KiB of shared memory ({k}: {over[k] // 1024} KiB)")
    return Plan(block, (tile,) * 3, (stages,) * 3, f"tile {tile}x{stages} (set), head dim {head_dim} {name}")


def fused_plan(block: int, head_dim: int, dtype: object, limit: int | None = None) -> Plan:
    """The tile rule's plan for ``block``-wide blocks (:func:`fused_tile`; the name config validation imports)."""
    return fused_tile(block, head_dim, dtype, limit)
