"""The one labelled line each analysis method ends with: which head, what number, in words (the full figures are in
the method's JSON and plots)."""

from __future__ import annotations

import numpy as np


def head(grid, pick=np.argmax) -> tuple[str, float]:
    """``('L<layer>h<head>', value)`` of the head ``pick`` chooses in a ``[L, N]`` grid."""
    grid = np.asarray(grid, np.float64)
    layer, h = np.unravel_index(int(pick(grid)), grid.shape)
    return f"L{layer}h{h}", float(grid[layer, h])


def per_kind(grids: dict, describe) -> str:
    """``'kind: <describe(grid)>; ...'`` over the attention kinds."""
    return "; ".join(f"{kind}: {describe(np.asarray(grid, np.float64))}" for kind, grid in grids.items())


def number(value) -> str:
    return "–" if value is None else f"{value:.3g}"
