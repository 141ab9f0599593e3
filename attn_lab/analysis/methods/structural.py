"""``--what=structural``: removes the least important --structural-percent of the heads physically (smaller
projections, fewer parameters) and times the forward pass against the full and the masked model; skipped, with the
reason in structural.json, for grouped key/value heads (see ``attn_lab.analysis.structural.grouped_kinds``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import flags

from attn_lab.analysis.methods import register_method

if TYPE_CHECKING:  # the heavy modules (jax, the models) are imported when a method runs: --help answers at once
    from attn_lab.analysis.context import AnalysisContext

_PERCENT = flags.DEFINE_float("structural-percent", 50.0, "structural: % of heads removed, in [0, 100).")
_SPEED_BATCH = flags.DEFINE_integer("speed-batch", 64, "structural: batch size of the timed forward pass.",
                                    lower_bound=1)
flags.register_validator("structural-percent", lambda v: 0 <= v < 100, message="must be in [0, 100)")


@register_method("structural", order=40)
def structural_pruning(ctx: AnalysisContext) -> None:
    """Physically pruned model vs the full one: parameters, max |pruned - masked| output and forward speed."""
    from attn_lab.analysis import pruning, structural

    grouped = structural.grouped_kinds(ctx.model())
    if grouped:
        reason = (f"{', '.join(grouped)} has grouped key/value heads (num_kv_heads < num_heads); structural pruning "
                  "removes heads of full multi-head attention only -- the masked pruning curve ('prune') covers it")
        ctx.write_json("structural", {"skipped": reason})
        print(f"structural: skipped: {reason}")
        return
    masks = pruning.prune_masks(ctx.head_importance(normalize=True), _PERCENT.value)
    report = structural.speed_report(ctx.run.graphdef, ctx.run.state, masks,
                                     structural.tile_batch(ctx.batches[0], _SPEED_BATCH.value))
    ctx.write_json("structural", report)
    ctx.summary({f"structural/{k}": v for k, v in report.items() if isinstance(v, (int, float))})
    print(f"structural: {report['percent_pruned']:.0f}% of heads removed, max |pruned - masked| "
          f"{report['max_abs_diff']:.2e}, forward {report['speedup_vs_full']:.2f}x the full model's speed")
