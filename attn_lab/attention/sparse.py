"""Fixed sparse attention patterns: Sparse Transformer (strided/fixed), Longformer and BigBird.

Each kernel is exact softmax attention restricted to a static pattern ``A(i)`` of keys for query i, written as a
:class:`~attn_lab.attention.flex.PatternAttention` (a ``mask_mod`` plus a block-level cover): on a CUDA GPU the
fused block-sparse flash kernel (:mod:`attn_lab.attention.flash`) visits only the tiles the pattern touches;
elsewhere :func:`attn_lab.attention.blocksparse.block_sparse_attention` gathers each pattern's hand-built layout in
O(T * |A(i)|) memory (no ``[T, T]`` matrix unless the weights are asked for). Conventions shared by the three:

- bidirectional patterns are the symmetric (or all-position) versions; ``is_causal`` intersects the pattern with
  ``j <= i`` (so a causal window is the left half of the two-sided one plus the query itself);
- key padding masks keys out; a query whose pattern keys are all padding gets uniform weights over its pattern
  (finite, and still causal), never weight outside it;
- self-attention only (T == S) and no KV-cache decoding: the patterns are defined on whole sequences;
- no attention dropout (the weights are never materialized on the fast path).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from attn_lab.attention.block_mask import BLOCK_SIZES
from attn_lab.attention.blocksparse import Layout, build_layout, clipped_window, num_blocks
from attn_lab.attention.flex import PatternAttention
from attn_lab.attention.registry import register


def _positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """Validates an integer option; one-line ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"attention.{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _positions(value: Any, name: str) -> tuple[int, ...]:
    """Validates a tuple of non-negative token positions (a list from a config is accepted)."""
    items = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    for item in items:
        _positive_int(item, name, minimum=0)
    return tuple(sorted({int(item) for item in items}))


def _band_cover(nb: int, reach_blocks: int) -> np.ndarray:
    """``[nb, nb]`` blocks within ``reach_blocks`` of the diagonal."""
    return np.abs(np.arange(nb)[:, None] - np.arange(nb)[None, :]) <= reach_blocks


def strided_pattern(kind: str, stride: int, num_summary: int):
    """The symmetric pattern ``pattern(i, j) -> bool`` of :class:`StridedAttention` (numpy broadcasting)."""
    if kind == "strided":
        return lambda i, j: (np.abs(i - j) < stride) | ((i - j) % stride == 0)
    return lambda i, j: (i // stride == j // stride) | (j % stride >= stride - num_summary)


@register("strided")
class StridedAttention(PatternAttention):
    """Sparse Transformer factorized attention (Child et al. 2019, "Generating Long Sequences with Sparse
    Transformers", arXiv:1904.10509), with stride ``l``.

    The paper splits each pattern into two sets given to different heads (or layers); here every head attends to
    the *union* in one softmax, which keeps every head equivalent and the cost O(T * (l + T / l)):

    - ``pattern='strided'``: ``A(i) = {j : |i - j| < l} U {j : (i - j) % l == 0}`` -- the previous (and, when
      bidirectional, next) ``l - 1`` positions plus every l-th position. Causal: ``j <= i``, i.e. the paper's
      ``{max(0, i - l), ..., i} U {j <= i : l | i - j}``.
    - ``pattern='fixed'``: ``A(i) = {j : j // l == i // l} U {j : j % l >= l - c}`` -- the query's own block of l
      plus the last ``c = num_summary`` positions of every block (summary columns). Causal: ``j <= i``;
      bidirectional: summary columns of all blocks, past and future.

    Options:
      pattern: 'strided' (default) or 'fixed'.
      stride: l, the block/stride size (default 64; about sqrt(T) balances the two sets).
      num_summary: c, summary positions per block for 'fixed' (default 1; 1 <= c <= l).
    """

    PATTERNS = ("strided", "fixed")

    def __init__(self, *, pattern: str = "strided", stride: int = 64, num_summary: int = 1,
                 implementation: str = "auto", fused_block_size: int | None = None, **shared: Any):
        super().__init__(implementation=implementation, fused_block_size=fused_block_size, **shared)
        if pattern not in self.PATTERNS:
            raise ValueError(f"attention.pattern must be one of {self.PATTERNS}, got {pattern!r}")
        self.pattern, self.stride = pattern, _positive_int(stride, "stride")
        self.num_summary = _positive_int(num_summary, "num_summary")
        if self.num_summary > self.stride:
            raise ValueError(f"attention.num_summary ({num_summary}) must be <= attention.stride ({stride})")

    @property
    def shift_invariant(self) -> bool:
        return self.pattern == "strided"

    def mask_mod(self, q_pos, k_pos):
        return strided_pattern(self.pattern, self.stride, self.num_summary)(q_pos, k_pos)

    def cover(self, nb: int, bs: int) -> np.ndarray | None:
        """'fixed': key blocks sharing a stride block with the query block, or holding a summary position."""
        if self.pattern == "strided":  # every l-th key reaches every block once l <= bs: evaluated per offset
            return None
        first = np.arange(nb) * bs
        lo, hi = first // self.stride, (first + bs - 1) // self.stride  # stride blocks each block touches
        shared = (lo[:, None] <= hi[None, :]) & (lo[None, :] <= hi[:, None])
        summary = ((first[:, None] + np.arange(bs)) % self.stride >= self.stride - self.num_summary).any(axis=1)
        return shared | summary[None, :]

    def layout(self, length: int, is_causal: bool) -> Layout:
        return strided_layout(length, is_causal, self.pattern, self.stride, self.num_summary)


@functools.lru_cache(maxsize=64)
def strided_layout(length: int, is_causal: bool, kind: str, stride: int, num_summary: int) -> Layout:
    """Blocks of l: neighbour blocks plus columns (strided) or own block plus summary keys (fixed).

    Cached, so eager calls reuse one compiled program per (length, options).
    """
    l, nb = stride, num_blocks(length, stride)
    pattern = strided_pattern(kind, l, num_summary)
    if kind == "strided":
        blocks = clipped_window(nb, 1, 0 if is_causal else 1)  # (nb, 2 or 3): covers |i - j| < l
        return build_layout(length, l, pattern=pattern, is_causal=is_causal, blocks=blocks, columns=True)
    summary = np.flatnonzero(np.arange(length) % l >= l - num_summary)  # (T * c / l,) summary columns
    return build_layout(length, l, pattern=pattern, is_causal=is_causal, blocks=clipped_window(nb, 0, 0),
                        extra_keys=summary)


@register("longformer")
class LongformerAttention(PatternAttention):
    """Longformer attention (Beltagy et al. 2020, "Longformer: The Long-Document Transformer", arXiv:2004.05150):
    a sliding window plus a few task-chosen global tokens (e.g. CLS).

    ``A(i) = {j : |i - j| <= window // 2} U G`` for ordinary queries, and every key for a global query ``i in G``
    (symmetric: global tokens see everything and everything sees them). Causal: ``j <= i`` on top, so the window is
    the ``window // 2`` previous positions plus the query, and a global query sees its whole prefix. The window is
    computed in blocks of ``window // 2`` (each block gathers itself and both neighbours), the global rows densely.

    Options:
      window: total window width w (default 128; ``w // 2`` keys on each side).
      global_tokens: positions with global attention (default ``(0,)``; positions >= T are ignored).
    """

    def __init__(self, *, window: int = 128, global_tokens: tuple[int, ...] = (0,), implementation: str = "auto",
                 fused_block_size: int | None = None, **shared: Any):
        super().__init__(implementation=implementation, fused_block_size=fused_block_size, **shared)
        self.window = _positive_int(window, "window")
        self.global_tokens = _positions(global_tokens, "global_tokens")

    def mask_mod(self, q_pos, k_pos):
        glob = np.asarray(self.global_tokens, np.int64)
        return (np.abs(q_pos - k_pos) <= self.window // 2) | np.isin(q_pos, glob) | np.isin(k_pos, glob)

    def cover(self, nb: int, bs: int) -> np.ndarray:
        """The window's diagonal band of blocks, plus the rows and columns of the global tokens' blocks."""
        glob = np.zeros(nb, bool)
        glob[[g // bs for g in self.global_tokens if g < nb * bs]] = True
        return _band_cover(nb, -(-(self.window // 2) // bs)) | glob[:, None] | glob[None, :]

    def layout(self, length: int, is_causal: bool) -> Layout:
        return longformer_layout(length, is_causal, self.window, self.global_tokens)


@functools.lru_cache(maxsize=64)
def longformer_layout(length: int, is_causal: bool, window: int, global_tokens: tuple[int, ...]) -> Layout:
    """Blocks of half a window, each gathering itself and its neighbours; global keys extra, global rows dense."""
    half = window // 2
    bs = max(1, min(half, length))
    reach = -(-half // bs)  # blocks on each side
    glob = np.asarray(global_tokens, np.int64)

    def pattern(i, j):
        return (np.abs(i - j) <= half) | np.isin(i, glob) | np.isin(j, glob)

    blocks = clipped_window(num_blocks(length, bs), reach, 0 if is_causal else reach)
    return build_layout(length, bs, pattern=pattern, is_causal=is_causal, blocks=blocks, extra_keys=global_tokens,
                        global_queries=global_tokens)


def bigbird_random_blocks(nb: int, *, num_window_blocks: int, num_global_blocks: int, num_random_blocks: int,
                          seed: int, is_causal: bool) -> np.ndarray:
    """``[nb, num_random_blocks]`` random key blocks per query block, drawn once from ``numpy`` with ``seed``.

    Candidates for query block q exclude its window and the global blocks (already attended); causal restricts
    them to earlier blocks. Rows with fewer candidates than asked repeat block q (masked as a duplicate).
    Global query blocks get their draw too but never use it (they attend densely).
    """
    rng = np.random.default_rng(seed)
    q, m = np.arange(nb)[:, None], np.arange(nb)[None, :]
    half = num_window_blocks // 2
    candidate = (np.abs(q - m) > half) & (m >= num_global_blocks)  # (nb, nb)
    if is_causal:
        candidate &= m < q
    scores = np.where(candidate, rng.random((nb, nb)), np.inf)
    chosen = np.argsort(scores, axis=1, kind="stable")[:, :num_random_blocks]  # (nb, r) lowest scores first
    ok = np.take_along_axis(candidate, chosen, axis=1)
    return np.where(ok, chosen, q).astype(np.int32)


@register("bigbird")
class BigBirdAttention(PatternAttention):
    """BigBird block-sparse attention (Zaheer et al. 2020, "Big Bird: Transformers for Longer Sequences",
    arXiv:2007.14062; the ITC variant: global tokens are existing positions).

    Blocks of ``block_size``; query block q attends to key blocks ``|q - m| <= num_window_blocks // 2`` (window),
    the first ``num_global_blocks`` blocks (global), and ``num_random_blocks`` random blocks fixed per query block
    from a numpy RNG seeded with ``seed`` at trace time (deterministic, static indices; they depend on the number
    of blocks, so on T rounded up to a block). Queries in global blocks attend to every key. Causal: ``j <= i`` on
    top, and random blocks are drawn among earlier blocks only.

    Options:
      block_size: positions per block (default 64).
      num_window_blocks: odd window width in blocks (default 3: own block and one each side).
      num_global_blocks: leading global blocks (default 1).
      num_random_blocks: random key blocks per query block (default 2).
      seed: RNG seed of the random blocks (default 0).
    """

    def __init__(self, *, block_size: int = 64, num_window_blocks: int = 3, num_global_blocks: int = 1,
                 num_random_blocks: int = 2, seed: int = 0, implementation: str = "auto",
                 fused_block_size: int | None = None, **shared: Any):
        super().__init__(implementation=implementation, fused_block_size=fused_block_size, **shared)
        self.block_size = _positive_int(block_size, "block_size")
        self.num_window_blocks = _positive_int(num_window_blocks, "num_window_blocks")
        if self.num_window_blocks % 2 == 0:
            raise ValueError(f"attention.num_window_blocks must be odd (own block plus equal sides), "
                             f"got {num_window_blocks}")
        self.num_global_blocks = _positive_int(num_global_blocks, "num_global_blocks", minimum=0)
        self.num_random_blocks = _positive_int(num_random_blocks, "num_random_blocks", minimum=0)
        self.seed = _positive_int(seed, "seed", minimum=0)

    def random_blocks(self, length: int, is_causal: bool) -> np.ndarray:
        """The random block indices used at this length (for analysis and tests)."""
        return bigbird_random_blocks(num_blocks(length, self.block_size), num_window_blocks=self.num_window_blocks,
                                     num_global_blocks=self.num_global_blocks,
                                     num_random_blocks=self.num_random_blocks, seed=self.seed, is_causal=is_causal)

    def default_fused_block(self) -> int:
        """The largest tile dividing the BigBird block, so every tile is whole (full tiles carry no mask)."""
        return max((b for b in BLOCK_SIZES if self.block_size % b == 0), default=BLOCK_SIZES[0])

    def pattern_at(self, length: int, is_causal: bool):
        """The pattern at this length: the random blocks are drawn per number of blocks (and causality)."""
        member = bigbird_member(length, is_causal, self.block_size, self.num_window_blocks, self.num_global_blocks,
                                self.num_random_blocks, self.seed)  # (nbb, nbb)
        bbs = self.block_size

        def mask_mod(q_pos, k_pos):
            return member[q_pos // bbs, k_pos // bbs]

        def cover(nb: int, bs: int) -> np.ndarray:
            """Tiles overlapping an active BigBird block pair: ``touch_q @ member @ touch_k^T > 0``."""
            pos = np.minimum(np.arange(nb * bs), length - 1).reshape(nb, bs) // bbs  # (nb, bs) BigBird block
            touch = np.zeros((nb, member.shape[0]), np.float32)
            touch[np.repeat(np.arange(nb), bs), pos.reshape(-1)] = 1.0
            return touch @ member.astype(np.float32) @ touch.T > 0

        return mask_mod, cover

    def layout(self, length: int, is_causal: bool) -> Layout:
        return bigbird_layout(length, is_causal, self.block_size, self.num_window_blocks, self.num_global_blocks,
                              self.num_random_blocks, self.seed)


def bigbird_blocks(length: int, is_causal: bool, block_size: int, num_window_blocks: int, num_global_blocks: int,
                   num_random_blocks: int, seed: int) -> np.ndarray:
    """``[nb, w + r]`` window and random key blocks of each query block (causal windows look back only)."""
    nb, half = num_blocks(length, block_size), num_window_blocks // 2
    window = clipped_window(nb, half, 0 if is_causal else half)  # (nb, w)
    rand = bigbird_random_blocks(nb, num_window_blocks=num_window_blocks, num_global_blocks=num_global_blocks,
                                 num_random_blocks=num_random_blocks, seed=seed, is_causal=is_causal)
    return np.concatenate([window, rand], axis=1)  # (nb, w + r)


@functools.lru_cache(maxsize=64)
def bigbird_layout(length: int, is_causal: bool, block_size: int, num_window_blocks: int, num_global_blocks: int,
                   num_random_blocks: int, seed: int) -> Layout:
    """Window and random blocks gathered per query block; global blocks as extra keys and dense rows."""
    bs, nb = block_size, num_blocks(length, block_size)
    blocks = bigbird_blocks(length, is_causal, block_size, num_window_blocks, num_global_blocks, num_random_blocks,
                            seed)
    num_global = min(num_global_blocks, nb) * bs
    member = _member(blocks, num_global_blocks)

    def pattern(i, j):
        return member[i // bs, j // bs]

    return build_layout(length, bs, pattern=pattern, is_causal=is_causal, blocks=blocks,
                        extra_keys=range(num_global), global_queries=range(num_global))


def _member(blocks: np.ndarray, num_global_blocks: int) -> np.ndarray:
    """``[nb, nb]`` bool: key block m is in query block q's set (its window and random blocks), global rows and
    columns included."""
    nb = blocks.shape[0]
    member = np.zeros((nb, nb), bool)
    np.put_along_axis(member, blocks, True, axis=1)
    member[:num_global_blocks], member[:, :num_global_blocks] = True, True
    return member


@functools.lru_cache(maxsize=64)
def bigbird_member(length: int, is_causal: bool, block_size: int, num_window_blocks: int, num_global_blocks: int,
                   num_random_blocks: int, seed: int) -> np.ndarray:
    """The BigBird pattern at block level, ``[nb, nb]`` (causality is applied on top, token by token)."""
    blocks = bigbird_blocks(length, is_causal, block_size, num_window_blocks, num_global_blocks, num_random_blocks,
                            seed)
    return _member(blocks, num_global_blocks)
