"""Does a finding still move at the budget judged? Each finding's paired difference in its deciding metric, measured
on the validation set at every evaluation the runs logged, with its interval over seeds, against the training step
(``<tables>/verdict_steps.png``, written with the experiment's tables).

The verdict is decided on the test set at the end of training; this figure reads the validation evaluations the
runs already log (``metrics.jsonl``: ``eval/<metric>``), so a reader sees whether the difference had settled or was
still growing, shrinking or crossing the margin when the budget ended. Only findings that compare an arm with the
preset's baseline in a metric the runs evaluate during training are drawn (a pruning curve or a recall length has
no per-step counterpart).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from attn_lab import results
from attn_lab.reporting.stats import LEVEL, paired

STEPS_FILE = "verdict_steps.png"


def validation_key(metric: str) -> str | None:
    """The metrics.jsonl key of a final test metric's validation counterpart: ``test_loss`` -> ``eval/loss``."""
    return f"eval/{metric.removeprefix('test_')}" if metric.startswith("test_") else None


def by_step(workdir: str, key: str) -> dict[int, float]:
    """``{step: value}`` of a run's finite ``key`` (metrics.jsonl; the last value logged at a step wins)."""
    out = {}
    for record in results.metric_lines(workdir):
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[int(record["step"])] = float(value)
    return out


def paired_by_step(sweep_dir: str, rows: Sequence[Mapping[str, Any]], exp: Any) -> dict[str, dict[str, list]]:
    """``{finding: {'steps', 'mean', 'low', 'high', 'pairs'}}``: at each validation step every seed of both arms
    logged, the interval of (arm minus baseline) times the metric's sign, paired by seed (as the verdict's)."""
    preset, design = getattr(exp, "preset", None), getattr(exp, "design", None)
    key = validation_key(preset.metric.key) if preset and preset.metric else None
    if key is None or design is None or getattr(exp, "differences_fn", None) is not None:
        return {}
    runs: dict[str, dict[int, dict[int, float]]] = {}  # arm -> seed -> step -> value
    for row in rows:
        if row.get("status") in ("ok", "skipped") and "seed" in row:
            arm = str(row.get("variant", row["trial"]))
            runs.setdefault(arm, {})[int(row["seed"])] = by_step(os.path.join(sweep_dir, row["trial"]), key)
    base, out = runs.get(preset.baseline, {}), {}
    for finding in design.findings:
        other = runs.get(finding, {})
        seeds = sorted(set(base) & set(other))
        steps = sorted(set.intersection(*(set(base[s]) & set(other[s]) for s in seeds))) if seeds else []
        series: dict[str, list] = {"steps": [], "mean": [], "low": [], "high": [], "pairs": []}
        for step in steps:
            diff = paired({s: preset.metric.sign * base[s][step] for s in seeds},
                          {s: preset.metric.sign * other[s][step] for s in seeds}, design.level)
            if diff is not None:
                for name, value in zip(series, (step, diff.mean, diff.low, diff.high, diff.pairs)):
                    series[name].append(value)
        if series["steps"]:
            out[finding] = series
    return out


def _edges(direction: str, margin: float) -> list[float]:
    """Where a finding's verdict changes: 0 and the margin on the paper's side (both sides for 'same')."""
    return {"up": [0.0, margin], "down": [0.0, -margin], "same": [-margin, margin]}.get(direction, [0.0, -margin])


def write_verdict_steps(out_dir: str, sweep_dir: str, rows: Sequence[Mapping[str, Any]], exp: Any) -> str | None:
    """``<out_dir>/verdict_steps.png``: a panel per finding, the paired difference against step with its interval
    band, the verdict's edges (0 and the margin) dashed; None when no finding has a per-step difference."""
    series = paired_by_step(sweep_dir, rows, exp)
    if not series:
        return None
    from attn_lab.figures import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, len(series), figsize=(4.8 * len(series), 3.6), squeeze=False)
    for ax, (key, s) in zip(axes[0], series.items()):
        finding = exp.design.findings[key]
        ax.plot(s["steps"], s["mean"], marker="o", markersize=3, label=f"{key} - {exp.preset.baseline}")
        ax.fill_between(s["steps"], s["low"], s["high"], alpha=0.25, label=f"{LEVEL:.0%} interval over seeds")
        for edge in _edges(finding.direction, finding.margin):
            ax.axhline(edge, color="grey", linestyle="--" if edge else ":", linewidth=0.8)
        ax.set(xlabel="step", ylabel=f"{exp.preset.metric.label}: difference (validation)",
               title=f"{key}: {finding.direction}, margin {finding.margin:g}")
        ax.legend(fontsize="x-small")
    path = os.path.join(out_dir, STEPS_FILE)
    save_figure(fig, path)
    return path
