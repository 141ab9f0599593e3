"""The report every experiment shares: a row per arm (status, the deciding metric, parameters, speed, and the
columns the experiment adds) and the verdict table of its findings; and the paired differences those findings are
judged on, which the pilot measures too (:mod:`attn_lab.sweep.pilot`).

An experiment file that defines no ``report`` gets :func:`default_report`; one that does calls it with its own
columns (:class:`Column`) and adds its own tables and plots. A finding compares its arm with the preset's
``baseline`` in the preset's :class:`attn_lab.experiment.Metric` (:func:`arm_differences`), unless the file defines
``differences(rows, sweep_dir, exp) -> ({key: Interval | None}, {key: diverged seeds})``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from attn_lab.reporting.stats import Interval
from attn_lab.reporting.tables import Table, column, every_variant, mean_std, unfinished_table, with_status
from attn_lab.reporting.verdicts import arm_comparisons, verdict_table

GENERIC = (("test_loss", "test loss"), ("test_accuracy", "test accuracy"), ("test_exact_match", "exact match"),
           ("test_bleu", "BLEU"))  # shown when a preset names no metric (and the rows have them)


@dataclasses.dataclass(frozen=True)
class Column:
    """A results-table column: its header and its cell from an arm's name and finished rows (one per seed)."""

    header: str
    cell: Callable[[str, list[dict]], Any]


def metric_column(key: str, header: str, digits: int = 3, transform: Callable[[float], float] | None = None) -> Column:
    """Mean ± sd over seeds of the rows' ``key`` (``transform`` applied to each value first, e.g. exp for PPL)."""
    return Column(header, lambda arm, g: mean_std([transform(v) if transform else v for v in column(g, key)], digits))


def default_columns(exp: Any, rows: Sequence[Mapping]) -> list[Column]:
    """The deciding metric (or the usual test metrics the rows have), then parameters and steps/s."""
    metric = getattr(getattr(exp, "preset", None), "metric", None)
    shown = [(metric.key, metric.key.removeprefix("test_").replace("_", " "))] if metric else \
        [(k, h) for k, h in GENERIC if any(k in r for r in rows)]
    return [*(metric_column(k, h, 4 if "loss" in k else 3) for k, h in shown),
            Column("params", lambda arm, g: g[0].get("num_params") if g else None),
            Column("steps/s", lambda arm, g: f"{np.mean(column(g, 'steps_per_sec')):.2f}" if g else "–")]


def results_table(rows: Sequence[Mapping], exp: Any, columns: Sequence[Column], title: str, note: str = "") -> Table:
    """One row per arm (failed and unrun arms included, with their status)."""
    body, status = [], []
    for arm, group, state in every_variant(list(rows)):
        status.append(state)
        body.append([arm, *(c.cell(arm, group) for c in columns)])
    header, body = with_status(["arm", *(c.header for c in columns)], body, status)
    return Table(title, header, body, note or "Mean ± std over seeds (seeds in brackets).")


def as_declared(exp: Any, metric: Any, baseline: str) -> Any:
    """``exp`` with a stand-in preset where it has none -- an experiment built by ``get_experiment`` tabulated by a
    shipped report -- judging its design's findings in ``metric`` against ``baseline`` (when it is one of its arms)."""
    if getattr(exp, "preset", None) is not None:
        return exp
    from attn_lab.experiment import Preset

    arms = dict(getattr(exp, "variants", None) or {"all": {}})
    design = getattr(exp, "design", None)
    stand_in = Preset(exp.name or "sweep", "-", arms, findings=dict(design.findings) if design else {},
                      baseline=baseline if baseline in arms else None, metric=metric)
    return dataclasses.replace(exp, preset=stand_in)


def arm_differences(rows: Sequence[Mapping], sweep_dir: str, exp: Any) -> tuple[dict, dict]:
    """Each finding's arm minus the preset's baseline, paired by seed in the preset's metric (times its sign):
    ``({key: Interval | None}, {key: seeds whose arm diverged})``; a finding whose arm has no finished row is None."""
    preset, design = getattr(exp, "preset", None), getattr(exp, "design", None)
    if preset is None or preset.metric is None or design is None:
        return {}, {}
    groups = {arm: g for arm, g, _ in every_variant(list(rows))}
    if not groups.get(preset.baseline):  # nothing to compare with: no verdict table
        return {}, {}
    return arm_comparisons(groups, preset.baseline, list(design.findings), preset.metric.key, preset.metric.sign,
                           design.level)


def differences(rows: Sequence[Mapping], sweep_dir: str, exp: Any) -> tuple[dict[str, Interval | None], dict]:
    """The experiment's own ``differences`` where it defines one, else :func:`arm_differences`; always
    ``(intervals, diverged)``."""
    fn = getattr(exp, "differences_fn", None)
    out = fn(list(rows), sweep_dir, exp) if fn else arm_differences(rows, sweep_dir, exp)
    return out if isinstance(out, tuple) else (out, {})


def verdicts(rows: Sequence[Mapping], sweep_dir: str, exp: Any, label: str | None = None) -> Table | None:
    """The verdict table of the experiment's findings (None without a design or a comparison)."""
    diffs, diverged = differences(rows, sweep_dir, exp)
    metric = getattr(getattr(exp, "preset", None), "metric", None)
    label = label or (metric.label if metric else "the metric")
    return verdict_table(getattr(exp, "design", None), diffs, label, sweep_dir, exp, diverged=diverged)


def default_report(rows, sweep_dir, exp, out_dir, bench=None, columns: Sequence[Column] = (), title: str = "",
                   note: str = "") -> list[Table]:
    """[results table (default columns, then ``columns``), verdict table, trials without results]."""
    table = results_table(rows, exp, [*default_columns(exp, rows), *columns], title or exp.name, note)
    judged = verdicts(rows, sweep_dir, exp)
    return [table, *([judged] if judged else []), *unfinished_table(list(rows))]
