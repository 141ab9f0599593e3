"""``--what=ablate``: the --metric change with each head masked alone, and with every head of a layer masked but one
(Michel et al. 2019), each with a paired bootstrap p-value; and how well importance ranks the single-head drops
(Spearman, raw and per-layer normalized importance). Writes ablate.json and ablate.png (the single-head changes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attn_lab.analysis.methods import register_method
from attn_lab.analysis.methods._summary import head, number

if TYPE_CHECKING:  # the heavy modules (jax, the models) are imported when a method runs: --help answers at once
    from attn_lab.analysis.context import AnalysisContext


@register_method("ablate", order=20)
def ablate(ctx: AnalysisContext) -> None:
    """Single-head and all-but-one masking, scored with --metric; importance vs the single-head drop."""
    from attn_lab.analysis import importance

    single = importance.single_head_ablation(ctx.run.state, ctx.shapes, ctx.score)
    keep_one = importance.all_but_one(ctx.run.state, ctx.shapes, ctx.score)
    deltas = {k: np.asarray(single[k]["delta"]) for k in ctx.shapes}  # (L, N) each
    diagnosis = {"batches": len(ctx.batches), **{
        name: importance.importance_vs_drop(ctx.head_importance(normalize), deltas)
        for name, normalize in (("raw", False), ("normalized", True))}}
    metric = ctx.flags.metric
    ctx.output("ablate", {"metric": metric, "single_head": single, "all_but_one": keep_one,
                          "importance_vs_drop": diagnosis},
               grids=deltas, title=f"{metric} change with the head masked", summary_prefix="ablate_delta")
    ctx.summary({f"all_but_one/{k}/L{r['layer']}": r["delta"] for k in ctx.shapes for r in keep_one[k]})
    print(f"ablate ({metric} change with one head masked; rho: Spearman of importance vs that drop; all but one: "
          "each layer with only its best head):", "; ".join(_line(k, deltas[k], diagnosis["raw"], keep_one[k])
                                                             for k in ctx.shapes))


def _line(kind: str, deltas: np.ndarray, rho: dict, keep_one: list[dict]) -> str:
    name, drop = head(deltas, np.argmin)
    kept = " ".join(f"L{r['layer']} {r['delta']:+.4f}" for r in keep_one)
    return f"{kind}: largest drop {name} {drop:+.4f}, rho {number(rho.get(kind))}, all but one {kept}"
