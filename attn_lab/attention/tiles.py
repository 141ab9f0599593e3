"""The fused kernel's tile rule: which tile and pipeline depth fit a GPU's shared memory (pure; tested on a CPU).

A Triton program keeps in shared memory the operand tiles its ``tl.dot`` calls read, times the pipeline stages of
the tiles it streams through its loop: the forward and dQ kernels stream key/value tiles past a resident query
tile, the dK/dV kernel streams query/dO tiles past resident key/value tiles, and each kernel also stages the
``[tile, tile]`` probabilities (dK/dV: and their gradients) as a dot operand, and the tile's int8 token mask per
stage. :func:`kernel_bytes` is that estimate; accumulators (float32) live in registers and are not counted.
The three kernels share one tile (the block mask's), so a tile is allowed when every kernel fits with at least
one stage; each kernel then runs the most stages (up to :data:`STAGES`) that fit, so dK/dV -- the largest -- may
pipeline less than the forward (as jax's reference Pallas flash attention gives its backward kernels their own
block sizes).

The limit is an H100/H200's 227 KiB of shared memory per block (:data:`SMEM_LIMIT`). A configuration beyond it is
never compiled: the fused path refuses it in one line naming the tile, head dim and dtype, with the largest tile
that fits (:func:`fused_plan`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

SMEM_LIMIT = 227 * 1024  # bytes of shared memory per thread block on sm_90 (H100 / H200)
STAGES = 2  # pipeline depth a kernel gets when it fits (jax's Pallas flash attention uses 2)
TILES = (16, 32, 64, 128)  # Triton: powers of two, >= 16 for tl.dot
KERNELS = ("forward", "dq", "dkdv")


def padded_head_dim(head_dim: int) -> int:
    """The head dim the kernel computes at: the next power of two, at least 16 (Triton's dot)."""
    return max(16, 1 << (int(head_dim) - 1).bit_length())


def kernel_bytes(kernel: str, tile: int, head_dim: int, dtype: object, stages: int) -> int:
    """Estimated shared memory of one program of ``kernel`` ('forward', 'dq' or 'dkdv') at ``tile`` and the padded
    ``head_dim``, operands in ``dtype``, with ``stages`` pipeline stages of the streamed tiles."""
    e, hp = np.dtype(dtype).itemsize, padded_head_dim(head_dim)
    row_tile, square = tile * hp * e, tile * tile * e  # one [tile, Hp] operand; one [tile, tile] operand
    streamed = stages * (2 * row_tile + tile * tile)  # k, v (or q, dO) and the int8 token mask, per stage
    resident = {"forward": row_tile + square,  # q; p as the second dot's operand
                "dq": 2 * row_tile + square,  # q, dO; ds
                "dkdv": 2 * row_tile + 2 * square}[kernel]  # k, v; p and ds (transposed dots)
    return streamed + resident


@dataclasses.dataclass(frozen=True)
class Plan:
    """The fused kernels' launch: one tile, per kernel its pipeline stages, and why (for the dispatch line)."""

    tile: int
    stages: tuple[int, int, int]  # forward, dq, dkdv (hashable: the plan is a static argument)
    why: str

    def of(self, kernel: str) -> int:
        """The stages ``kernel`` runs with."""
        return self.stages[KERNELS.index(kernel)]


def stages_that_fit(kernel: str, tile: int, head_dim: int, dtype: object, limit: int = SMEM_LIMIT) -> int:
    """The most stages (<= :data:`STAGES`) with which ``kernel`` fits; 0 when even one stage does not."""
    return max((s for s in range(1, STAGES + 1) if kernel_bytes(kernel, tile, head_dim, dtype, s) <= limit),
               default=0)


def largest_tile(head_dim: int, dtype: object, limit: int = SMEM_LIMIT) -> int | None:
    """The largest tile at which all three kernels fit, or None."""
    fits = [t for t in TILES if all(stages_that_fit(k, t, head_dim, dtype, limit) for k in KERNELS)]
    return max(fits, default=None)


def fused_plan(tile: int, head_dim: int, dtype: object, limit: int = SMEM_LIMIT) -> Plan:
    """The stages each kernel runs at ``tile``, or a one-line ValueError when a kernel does not fit at all."""
    stages = {k: stages_that_fit(k, tile, head_dim, dtype, limit) for k in KERNELS}
    name = np.dtype(dtype).name
    if not all(stages.values()):
        worst = max(KERNELS, key=lambda k: kernel_bytes(k, tile, head_dim, dtype, 1))
        best = largest_tile(head_dim, dtype, limit)
        raise ValueError(f"fused kernel: tile {tile} with head dim {head_dim} in {name} does not fit in "
                         f"{limit // 1024} KiB of shared memory ({worst}: "
                         f"{kernel_bytes(worst, tile, head_dim, dtype, 1) // 1024} KiB at one stage); "
                         + (f"use fused_block_size={best} or less" if best else "no tile fits this head dim"))
    reduced = [k for k in KERNELS if stages[k] < STAGES]
    why = (f"tile {tile}, head dim {padded_head_dim(head_dim)} {name}: "
           + (f"{', '.join(reduced)} at {min(stages.values())} stage(s) to fit {limit // 1024} KiB" if reduced
              else f"{STAGES} stages each, within {limit // 1024} KiB"))
    return Plan(tile, tuple(stages[k] for k in KERNELS), why)
