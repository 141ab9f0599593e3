"""``--what=gates``: L0 head gates (Voita et al. 2019, "Analyzing Multi-Head Self-Attention") trained from this run
for each --gate-targets share of heads to keep, each a derived run under ``analysis/gates/target=<share>``; heads
kept vs the test metric (BLEU for translation, else accuracy), this run included as keeping every head. Writes
gates.json, gates.png and one logged step per row."""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import flags

from attn_lab import results
from attn_lab.analysis.methods import register_method
from attn_lab.analysis.methods._flags import ShareListParser, list_flag

if TYPE_CHECKING:  # the heavy modules (jax, the models) are imported when a method runs: --help answers at once
    from attn_lab.analysis.context import AnalysisContext

_TARGETS = list_flag(ShareListParser(), "gate-targets", "0.5,0.25",
                     "gates: comma-separated shares of heads to keep, each in (0, 1]; one run each.")
_STEPS = flags.DEFINE_integer("gate-steps", 500, "gates: training steps of each gates run.", lower_bound=1)


def _row(target: float, kept: int, metric: str, record: dict, workdir: str, **gated) -> dict:
    return {"target": target, "kept": kept, **gated, "metric": metric, "test": results.test_metrics(record)[metric],
            "workdir": workdir}


@register_method("gates", order=50, trains=True)
def gates(ctx: AnalysisContext) -> None:
    """L0 gates trained from this run for each target share of heads; heads kept vs the test metric."""
    from attn_lab.analysis import derived

    metric = "bleu" if ctx.run.generates else "accuracy"
    source = ctx.flags.workdir
    _announce(source, _TARGETS.value, _STEPS.value)
    rows = [_row(1.0, sum(n * h for n, h in ctx.shapes.values()), metric, results.require_finished(source), source)]
    for target in _TARGETS.value:
        workdir = ctx.path("gates", f"target={target:g}")
        record = derived.train_gates(ctx.run.config, source, target, _STEPS.value, workdir)
        gated = results.gates(record)
        rows.append(_row(target, gated["kept"], metric, record, workdir, total=gated["total"],
                         binary=gated["binary"]))
    ctx.write_json("gates", rows)
    ctx.lines("gates", {"L0 gates": ([r["kept"] for r in rows], [r["test"] for r in rows])},
              xlabel="heads kept", ylabel=f"test {metric}", title="L0 head gates (Voita et al.)")
    for r in rows:
        ctx.log({"gates/target": r["target"], "gates/kept": r["kept"], f"gates/test_{metric}": r["test"]})
    print(f"gates (heads kept -> test {metric}):", "; ".join(_point(r) for r in rows))


def _point(row: dict) -> str:
    name = "this run" if row["target"] == 1.0 else f"target {row['target']:g}"
    return f"{row['kept']} heads ({name}) {row['test']:.4g}"


def _announce(source: str, targets: list[float], steps: int) -> None:
    """How long the derived runs will take, from the source run's own speed (compilation not counted)."""
    speed = results.speed(results.require_finished(source))
    rate = speed["steady"] or speed["whole"] or 0.0
    took = f", about {len(targets) * steps / rate / 60:.1f} min at this run's {rate:.1f} steps/s" if rate else ""
    print(f"gates: training {len(targets)} derived runs of {steps} steps (targets {', '.join(map(str, targets))})"
          f"{took}, plus compilation", flush=True)
