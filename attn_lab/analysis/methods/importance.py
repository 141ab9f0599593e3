"""``--what=importance``: each head's importance E|dL/dxi| (Michel et al. 2019, "Are Sixteen Heads Really Better
than One?"), the expected size of the loss gradient with respect to the head's mask, over the batches of --split.
Writes importance.json and importance.png ``{kind: [L, N]}``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from absl import flags

from attn_lab.analysis.methods import register_method
from attn_lab.analysis.methods._summary import head, per_kind

if TYPE_CHECKING:  # the heavy modules (jax, the models) are imported when a method runs: --help answers at once
    from attn_lab.analysis.context import AnalysisContext

_NORMALIZE = flags.DEFINE_bool("normalize", False, "importance: unit l2 norm per layer (Michel et al.).")


@register_method("importance", order=10)
def importance(ctx: AnalysisContext) -> None:
    """Head importance E|dL/dxi| per head (``--normalize``: unit l2 norm per layer)."""
    imp = ctx.head_importance(_NORMALIZE.value)
    ctx.output("importance", {k: v.tolist() for k, v in imp.items()}, grids=imp, title="head importance E|dL/dxi|")
    print("importance (E|dL/dxi| per head; the grid in importance.json):", per_kind(imp, _describe))


def _describe(grid: np.ndarray) -> str:
    (top, high), (low, least) = head(grid), head(grid, np.argmin)
    return f"top {top} {high:.3g}, mean {grid.mean():.3g}, lowest {low} {least:.3g}"
