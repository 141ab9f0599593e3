"""Tables of plain runs (no sweep): ``make_tables --workdir runs/x`` on one run's folder, or on a folder of runs
(``train.py --workdir 'runs/x/seed={seed}'``, or runs started by hand side by side): one row per finished run, its
test scores, parameters and speed, each metric named in its column.
"""

from __future__ import annotations

import math
import os

from attn_lab import results
from attn_lab.reporting.tables import Table

RUNS_NAME = "runs"  # tables/runs.md
COLUMNS = (("loss", "test loss"), ("accuracy", "token accuracy"), ("exact_match", "exact match"), ("bleu", "BLEU"))


def find_runs(folder: str, depth: int = 2) -> list[str]:
    """``folder`` itself when it holds a finished run (results.json), else the finished runs below it, at most
    ``depth`` folders down, sorted by path."""
    if results.finished_results(folder) is not None:
        return [folder]
    found = []
    for root, dirs, _ in os.walk(folder):
        if root[len(folder):].count(os.sep) >= depth:
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if d not in ("checkpoints", "wandb", "analysis", "tables"))
        found += [os.path.join(root, d) for d in dirs if results.finished_results(os.path.join(root, d)) is not None]
    return sorted(found)


def runs_table(folder: str, runs: list[str]) -> Table:
    """One row per run: its folder (relative to ``folder``), steps, parameters, test scores (perplexity beside the
    loss) and steps/s after compilation."""
    records = [results.finished_results(run) for run in runs]
    tests = [r.get("final", {}).get("test", {}) for r in records]
    shown = [(key, label) for key, label in COLUMNS if any(key in t for t in tests)]
    header = ["run", "steps", "params", *(label for _, label in shown), "perplexity", "steps/s"]
    body = []
    for run, record, test in zip(runs, records, tests):
        name = os.path.relpath(run, folder) if run != folder else os.path.basename(os.path.abspath(run))
        loss = test.get("loss")
        body.append([name, record.get("steps"), record.get("num_params"),
                     *(_fmt(test.get(key)) for key, _ in shown),
                     _fmt(math.exp(min(loss, 700)) if isinstance(loss, (int, float)) else None),
                     _fmt(record.get("steady_steps_per_sec") or record.get("steps_per_sec"), 2)])
    return Table("Runs", header, body, "Test scores of each finished run (results.json's final.test); perplexity is "
                 "exp(test loss); steps/s after compilation. Each run's curves: <run>/curves.png.")


def _fmt(value, digits: int = 4) -> str:
    return "–" if not isinstance(value, (int, float)) or not math.isfinite(value) else f"{value:.{digits}g}"
