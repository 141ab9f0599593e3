"""The associative-recall report's own parts (experiments/recall.py): recall per kernel and length, one table and
one Zoology-Figure-2 plot (recall against T) per width; and the paired differences its findings are judged on,
which compare rows at chosen lengths rather than one arm against a baseline.

Rows are named ``<kernel>/T<T>/d<width>`` (e.g. ``dense/T128/d64``); each finished row carries ``test_accuracy``
(recall at the query positions) and its per-example count, so a difference with no spread over seeds is decided
from the counts (:func:`attn_lab.reporting.verdicts.compare`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from attn_lab.reporting.stats import Interval
from attn_lab.reporting.tables import Table, column, mean_std
from attn_lab.reporting.verdicts import compare

METRIC = "test_accuracy"  # recall: accuracy at the query positions


def row_name(kernel: str, t: int, width: int) -> str:
    """The arm of one kernel at sequence length ``t`` and d_model ``width``."""
    return f"{kernel}/T{t}/d{width}"


def lengths(exp: Any) -> list[tuple[int, int]]:
    """The preset's (T, N), shortest first, read from its arms (the report needs no other declaration of them)."""
    return sorted({(ov["task.seq_len"], ov["task.num_kv_pairs"]) for ov in exp.variants.values()})


def widths(exp: Any) -> list[int]:
    """The preset's d_model values, smallest first."""
    return sorted({int(v.rsplit("/d", 1)[1]) for v in exp.variants})


def worst(dense: Sequence[Sequence[dict]]) -> list[dict]:
    """Per seed, dense attention's row at its worst length (each carries its own per-example count), over the seeds
    that finished every length: 'attention solves' holds only if the hardest length is solved."""
    by_seed: dict[int, dict] = {}
    for rows in dense:
        for r in rows:
            seed = int(r["seed"])
            if seed not in by_seed or r[METRIC] < by_seed[seed][METRIC]:
                by_seed[seed] = r
    seeds = set.intersection(*({int(r["seed"]) for r in rows} for rows in dense)) if all(dense) else set()
    return [by_seed[s] for s in sorted(seeds)]


def comparisons(groups: Mapping[str, list[dict]], width: int, judged: Sequence[tuple[int, int]],
                pairs: Mapping[str, tuple[tuple[str, int], tuple[str, int]]], solves: str | None = None
                ) -> tuple[dict[str, Interval | None], dict[str, list[int]]]:
    """Each finding's verdict interval at one width over the ``judged`` lengths (None where a row is missing), and
    per finding the seeds whose compared run diverged.

    Args:
      groups: arm -> its finished rows.
      pairs: finding -> ((kernel, length index), (kernel, length index)): the second minus the first, paired by seed,
        a length index into ``judged`` (0 the shortest, -1 the longest judged).
      solves: the finding that compares dense at its worst judged length with perfect recall (1.0).
    """
    def at(kernel: str, index: int) -> list[dict]:
        return groups.get(row_name(kernel, judged[index][0], width), [])

    found = {}
    for key, (base, other) in pairs.items():
        a, b = at(*base), at(*other)
        found[key] = compare(a, b, METRIC) if a and b else (None, [])
    if solves is not None:
        rows = worst([groups.get(row_name("dense", t, width), []) for t, _ in judged])
        found = {solves: compare([], rows, METRIC, fixed=1.0) if rows else (None, []), **found}
    return {k: d for k, (d, _) in found.items()}, {k: s for k, (_, s) in found.items()}


def recall_tables(groups: Mapping[str, list[dict]], exp: Any, out_dir: str, note: str) -> list[Table]:
    """One table per width (recall per kernel and length, steps/s at the longest length) and its plot,
    ``recall_d<width>.png``: recall against T, one line per kernel that finished some length."""
    from attn_lab.reporting.plots import errorbar_plot

    kernels = list(dict.fromkeys(v.split("/")[0] for v in exp.variants))
    sizes, tables = lengths(exp), []
    for width in widths(exp):
        body, series = [], {}
        for kernel in kernels:
            cells = [groups.get(row_name(kernel, t, width), []) for t, _ in sizes]
            body.append([kernel, *(mean_std(column(g, METRIC), 3) for g in cells),
                         *(f"{np.mean(column(g, 'steps_per_sec')):.1f}" if g else "–" for g in cells[-1:])])
            done = [(t, column(g, METRIC)) for (t, _), g in zip(sizes, cells) if g]
            if done:
                series[kernel] = ([t for t, _ in done], [v for _, v in done])
        errorbar_plot(os.path.join(out_dir, f"recall_d{width}.png"), series, "sequence length T",
                      "recall (test accuracy at queries)", f"MQAR, d_model {width}")
        tables.append(Table(f"Recall at d_model {width} (mean ± std over seeds)",
                            ["kernel", *(f"T={t}, N={n}" for t, n in sizes), f"steps/s at T={sizes[-1][0]}"],
                            body, note))
    return tables
