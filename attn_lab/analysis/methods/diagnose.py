"""``--what=diagnose``: per-head statistics of the first batch's attention maps (Clark et al. 2019: entropy,
distance, mass on the same / first key, exact zeros; :data:`attn_lab.train.diagnostics.HEAD_STATS`), per-head
gradient norms over the batches, the flags (dead, diagonal, clumping, duplicate heads), what kernels that learn their
shape learned (spans, alphas), and one example's attention maps per kind (``--example``). Writes diagnose.json
(``'<kind>/<layer>'`` -> statistics), ``diagnose_<stat>.png``, ``learned_<stat>[_hist].png``, ``maps_<kind>.png``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from absl import flags

from attn_lab.analysis import plots
from attn_lab.analysis.methods import register_method

if TYPE_CHECKING:  # the heavy modules (jax, the models) are imported when a method runs: --help answers at once
    from attn_lab.analysis.context import AnalysisContext

_EXAMPLE = flags.DEFINE_integer("example", 0, "diagnose: which example of the first batch to draw.", lower_bound=0)

GRADIENT_NORM = "gradient_norm"  # added to each layer's report here: it needs gradients, the maps alone do not


def _grids(layers: dict, shapes: dict[str, tuple[int, int]], stat: str) -> dict[str, np.ndarray]:
    """``{kind: [L, N]}`` of one statistic from the per-layer reports."""
    return {kind: np.array([layers[f"{kind}/{layer}"][stat] for layer in range(n_layers)])
            for kind, (n_layers, _) in shapes.items()}


def _learned_plots(ctx: AnalysisContext, values_of: dict[str, dict[str, np.ndarray]]) -> None:
    """Per learned quantity: a layer x head grid per attention kind (e.g. adaptive span's spans) and a histogram per
    kind (e.g. entmax's alphas), as in Sukhbaatar et al.'s and Correia et al.'s figures."""
    for stat in sorted({k for values in values_of.values() for k in values}):
        by_kind: dict[str, list] = {}
        for name, values in values_of.items():
            if stat in values:
                by_kind.setdefault(name.split("/")[0], []).append(values[stat])
        grids = {kind: np.array(rows) for kind, rows in by_kind.items()}  # (layers, heads)
        ctx.grid(f"learned_{stat}", grids, title=f"learned {stat} per head", summary_prefix=stat)
        plots.histogram_plot(ctx.path(f"learned_{stat}_hist.png"), grids, xlabel=stat,
                             title=f"learned {stat} per attention kind")


@register_method("diagnose", order=60)
def diagnose(ctx: AnalysisContext) -> None:
    """Per-head attention statistics, gradient norms, flags and learned shapes; the maps of one example."""
    from attn_lab.analysis import importance
    from attn_lab.analysis.run import capture_maps
    from attn_lab.train import diagnostics, learned

    captured = capture_maps(ctx.run, ctx.batches[0])
    layers = {name: diagnostics.layer_report(c["maps"], c["valid_keys"], c["head_outputs"], c.get("valid_queries"))
              for name, c in captured.items()}
    grads = importance.compile_gradients(ctx.run.graphdef)
    for kind, grid in importance.head_gradient_norms(ctx.run.state, ctx.batches, ctx.model().sites(), grads).items():
        for layer, row in enumerate(grid):
            layers[f"{kind}/{layer}"][GRADIENT_NORM] = row.tolist()
    learned_values = learned.per_head(ctx.model())  # spans / alphas of kernels that learn them
    for name, values in learned_values.items():
        layers[name].update({k: v.tolist() for k, v in values.items()})
    ctx.write_json("diagnose", layers)
    for stat in (*diagnostics.HEAD_STATS, GRADIENT_NORM):
        ctx.grid(f"diagnose_{stat}", _grids(layers, ctx.shapes, stat), title=stat, summary_prefix=stat)
    _learned_plots(ctx, learned_values)
    for kind in ctx.shapes:
        plots.maps_plot(ctx.path(f"maps_{kind}.png"), captured, kind, example=_EXAMPLE.value)
    flagged = [_flagged(name, r["flags"]) for name, r in layers.items()]
    print("diagnose (heads flagged dead / diagonal / clumping / duplicate, per layer; every statistic in "
          "diagnose.json):", "; ".join(f for f in flagged if f) or "no head flagged")


def _flagged(layer: str, flags: dict[str, list]) -> str:
    """``'encoder_self/0: dead h1 h3, duplicate h0=h2'``; '' for a layer with nothing flagged."""
    parts = [f"{kind} " + " ".join(f"h{h[0]}=h{h[1]}" if isinstance(h, list) else f"h{h}" for h in heads)
             for kind, heads in flags.items() if heads]
    return f"{layer}: {', '.join(parts)}" if parts else ""
