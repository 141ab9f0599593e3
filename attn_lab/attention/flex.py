"""FlexAttention-style patterns: a sparse attention kernel written as one ``mask_mod`` function.

A forker adds a pattern by subclassing :class:`PatternAttention` and writing ``mask_mod(q_pos, k_pos) -> bool``
(numpy broadcasting over integer positions; PyTorch FlexAttention's name for it), e.g. ::

    @register("dilated")
    class DilatedAttention(PatternAttention):
        shift_invariant = True  # depends on q - k only: tiles are evaluated once per block offset

        def mask_mod(self, q_pos, k_pos):
            return (abs(q_pos - k_pos) < 64) & ((q_pos - k_pos) % 2 == 0)

and gets both paths: on a CUDA GPU the fused block-sparse flash kernel (:mod:`attn_lab.attention.flash`), which
visits only the tiles the pattern touches; elsewhere the XLA gather (:mod:`attn_lab.attention.blocksparse`) over
the same active blocks. Optional overrides: :meth:`PatternAttention.cover` (a block-level superset of the active
tiles, so long sequences do not evaluate ``mask_mod`` on all ``T^2`` pairs) and :meth:`PatternAttention.layout`
(a hand-built XLA layout, as the Sparse Transformer, Longformer and BigBird kernels in ``sparse.py`` have).

Conventions: self-attention only, key-padding masks only, no KV-cache decoding, no attention dropout;
``is_causal`` intersects the pattern with ``k <= q``; a query whose pattern keys are all padding averages them
uniformly; every query must see at least one key (checked when the block mask is built).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from attn_lab.attention.block_mask import BlockMask, check_block_size, create_block_mask
from attn_lab.attention.blocksparse import Layout, block_sparse_attention, build_layout
from attn_lab.attention.dispatch import FUSED, call_facts, check_fused_option, choose_fused
from attn_lab.attention.flash import fused_path
from attn_lab.attention.registry import AttentionKernel, key_padding

_BLOCK_MASKS: dict[tuple, BlockMask] = {}  # (kernel class, options, T, causal, block) -> block mask
_LAYOUTS: dict[tuple, Layout] = {}
_CACHE_SIZE = 64


def _cached(cache: dict, key: tuple, build):
    """``cache[key]``, built once; the oldest entry is dropped past ``_CACHE_SIZE`` (one per length and option)."""
    if key not in cache:
        if len(cache) >= _CACHE_SIZE:
            cache.pop(next(iter(cache)))
        cache[key] = build()
    return cache[key]


class PatternAttention(AttentionKernel):
    """Exact softmax attention restricted to ``mask_mod``'s pattern (see the module docstring).

    Options shared by every pattern:
      implementation: 'auto' (default: 'xla' until the fused kernel passed a GPU check), 'xla' (the gather path),
        'fused' (the Pallas kernel compiled for a CUDA GPU; a one-line error elsewhere) or 'fused_interpret' (the
        same kernel run as jax operations on any backend: slow, for tests and debugging).
      fused_block_size: tile size of the fused kernel, one of 16, 32, 64, 128 (Triton's rule); None = the
        pattern's :meth:`default_fused_block` (64 unless the pattern has blocks of its own).
    """

    supports_cross = False
    supports_decode = False
    supports_dropout = False
    shift_invariant: ClassVar[bool] = False  # mask_mod depends on q - k only
    IMPLEMENTATIONS = ("auto", "xla", "fused", "fused_interpret")

    def __init__(self, *, implementation: str = "auto", fused_block_size: int | None = None, **shared: Any):
        super().__init__(**shared)
        if implementation not in self.IMPLEMENTATIONS:
            raise ValueError(f"attention.implementation must be one of {self.IMPLEMENTATIONS}, "
                             f"got {implementation!r}")
        check_fused_option(implementation, allowed=self.IMPLEMENTATIONS, fallback="xla")
        self.implementation = implementation
        self.fused_block_size = None if fused_block_size is None else check_block_size(fused_block_size)

    # --- what a pattern defines -------------------------------------------------------------------------------
    def mask_mod(self, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
        """Whether query ``q_pos`` may see key ``k_pos`` (numpy broadcasting; causality is applied separately)."""
        raise NotImplementedError

    def cover(self, num_blocks: int, block_size: int) -> np.ndarray | None:
        """``[nb, nb]`` superset of the active tiles, or None (evaluate every tile: O(T^2) at trace time)."""
        return None

    def default_fused_block(self) -> int:
        return 64

    def options_key(self) -> tuple:
        """The options that decide the pattern (cache key); default: every public scalar/tuple attribute."""
        return tuple(sorted((k, v) for k, v in vars(self).items() if not k.startswith("_")
                            and isinstance(v, (int, float, str, bool, tuple, type(None)))))

    def pattern_at(self, length: int, is_causal: bool) -> tuple[Any, Any]:
        """``(mask_mod, cover)`` at this length: a pattern drawn per length (BigBird's random blocks) overrides it."""
        return self.mask_mod, self.cover

    # --- derived ----------------------------------------------------------------------------------------------
    def fused_block(self) -> int:
        return self.fused_block_size or self.default_fused_block()

    def block_mask(self, length: int, is_causal: bool) -> BlockMask:
        """The fused kernel's block mask at this length (built once per length and options)."""
        bs = self.fused_block()

        def build():
            mask_mod, cover = self.pattern_at(length, is_causal)
            return create_block_mask(mask_mod, length, bs, is_causal=is_causal, cover=cover,
                                     shift_invariant=self.shift_invariant, name=f"attention '{self.name}'")
        return _cached(_BLOCK_MASKS, (type(self), self.options_key(), length, is_causal, bs), build)

    def layout(self, length: int, is_causal: bool) -> Layout:
        """The XLA path's layout: the block mask's active blocks, gathered (O(T * active keys per query))."""
        def build():
            mask = self.block_mask(length, is_causal)
            last = np.maximum(mask.kv_counts[:, None] - 1, 0)  # (nb, 1): padding entries repeat the last block
            blocks = np.take_along_axis(mask.kv_indices, np.minimum(np.arange(mask.kv_indices.shape[1]), last), axis=1)
            pattern = self.pattern_at(length, is_causal)[0]
            return build_layout(length, mask.block_size, pattern=pattern, is_causal=is_causal, blocks=blocks)
        return _cached(_LAYOUTS, (type(self), self.options_key(), length, is_causal, self.fused_block()), build)

    def dispatch(self, *, backend: str, dtype: Any = None, mask: str = "key_padding", is_causal: bool = False,
                 needs_matrix: bool = False, q_len: int | None = None, kv_len: int | None = None,
                 max_head_dim: int = 128) -> str:
        """'fused', 'fused_interpret', 'xla' or 'explicit' (the weights: the XLA path materializes them)."""
        return choose_fused(self.implementation, fallback="xla", needs_matrix=needs_matrix, backend=backend,
                            allowed=self.IMPLEMENTATIONS)

    def __call__(self, query, key, value, *, mask, is_causal, dropout_rng, dropout_rate, broadcast_dropout,
                 deterministic, precision, need_weights):
        self.check_call(query, key, dropout_rate, deterministic)
        key_valid = key_padding(mask, self.name)
        path = self.dispatch(**call_facts(query, key, mask, is_causal), needs_matrix=need_weights)
        if path in FUSED:
            mask = self.block_mask(query.shape[1], bool(is_causal))
            return fused_path(path, query, key, value, mask, key_valid), None
        return block_sparse_attention(query, key, value, self.layout(query.shape[1], bool(is_causal)),
                                      key_valid=key_valid, precision=precision, need_weights=need_weights)
