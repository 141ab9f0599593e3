"""Tables from finished sweeps: rows grouped over seeds (mean +- std), rendered as Markdown and LaTeX.

What every experiment's report shares. A report is ``report(rows, sweep_dir, exp, out_dir, bench) -> [Table]`` in
its experiment file (``experiments/<table>.py``, next to the published numbers it prints): rows from
:func:`attn_lab.sweep.runner.collect`, the experiment, where to draw PNGs, and the attention benchmark's CSV rows (or
None). Failed trials stay visible: a row whose trials did not all finish gets a status column ('failed (1 of 3
seeds)'; its numbers are over the seeds that finished, '–' when none did), and every report ends with the trials
without results and their error lines. Our tasks are far smaller than the papers', so the published numbers beside
ours compare shapes and ratios -- which setting wins, and by how much relative to seed spread -- not absolute BLEU.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from attn_lab.checks import describe
from attn_lab.markdown import cell, markdown_table


class Table:
    """A titled table: header plus rows of already formatted cells; renders to Markdown and LaTeX."""

    def __init__(self, title: str, header: Sequence[str], rows: Iterable[Sequence[Any]], note: str = ""):
        self.title, self.header, self.note = title, list(header), note
        self.rows = [[cell(v) for v in row] for row in rows]

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", markdown_table(self.header, self.rows)]
        return "\n".join(lines + (["", self.note] if self.note else [])) + "\n"

    def latex(self) -> str:
        esc = lambda s: s.replace("\\", "\\textbackslash{}").replace("_", "\\_").replace("%", "\\%").replace(
            "&", "\\&").replace("#", "\\#").replace("±", "$\\pm$")
        lines = [f"% {self.title}", "\\begin{tabular}{" + "l" * len(self.header) + "}", "\\toprule",
                 " & ".join(map(esc, self.header)) + " \\\\", "\\midrule"]
        lines += [" & ".join(map(esc, row)) + " \\\\" for row in self.rows]
        return "\n".join(lines + ["\\bottomrule", "\\end{tabular}"]) + "\n"


def mean_std(values: Sequence[float], digits: int = 3) -> str:
    """``'0.912 ± 0.004 (3)'``: mean, sample std and count; ``'–'`` without values."""
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return "–"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f} (1)"
    return f"{np.mean(vals):.{digits}f} ± {np.std(vals, ddof=1):.{digits}f} ({len(vals)})"


def finished(row: dict) -> bool:
    return row.get("status") in ("ok", "skipped") and "test_loss" in row


def grouped(rows: list[dict], key: Callable[[dict], Any]) -> dict[Any, list[dict]]:
    """Finished rows (status ok/skipped) grouped by ``key``, groups in first-seen order."""
    out: dict[Any, list[dict]] = {}
    for row in rows:
        if finished(row):
            out.setdefault(key(row), []).append(row)
    return out


def statuses(rows: list[dict], key: Callable[[dict], Any]) -> dict[Any, str]:
    """Every group of ``key`` (finished or not, first-seen order) -> 'ok', or what became of its unfinished trials,
    e.g. 'failed (1 of 3 seeds)', 'failed (3 of 3 seeds)', 'not run (2 of 3 seeds)'; a table keeps a row for each."""
    groups: dict[Any, list[dict]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    out = {}
    for name, group in groups.items():
        counts: dict[str, int] = {}
        for row in group:
            if not finished(row):
                kind = str(row.get("status") or "not run").split(":")[0]
                counts[kind] = counts.get(kind, 0) + 1
        out[name] = "; ".join(f"{k} ({n} of {len(group)} seeds)" for k, n in counts.items()) or "ok"
    return out


def variant_of(row: dict) -> str:
    """A row's variant: its ``variant`` column, else its trial name without the seed (a sweep without variants)."""
    return row.get("variant", row["trial"].rsplit(",seed=", 1)[0])


def every_variant(rows: list[dict]) -> list[tuple[str, list[dict], str]]:
    """(variant, its finished rows, its status) for every variant, failed ones included, in first-seen order."""
    done = grouped(rows, variant_of)
    return [(v, done.get(v, []), status) for v, status in statuses(rows, variant_of).items()]


def with_status(header: list[str], body: list[list], status: list[str]) -> tuple[list[str], list[list]]:
    """Adds a status column when some row's trials did not all finish (tables of finished sweeps stay as they were)."""
    if all(s == "ok" for s in status):
        return header, body
    return [*header, "status"], [[*row, s] for row, s in zip(body, status)]


def unfinished_table(rows: list[dict]) -> list[Table]:
    """'Trials without results': each failed trial with its status (its error line), then how many were not run
    (yet: another shard's, or an interrupted sweep's); [] when every trial finished."""
    unfinished = [row for row in rows if not finished(row)]
    body = [[row["trial"], row["status"]] for row in unfinished if str(row.get("status")).startswith("failed")]
    not_run = len(unfinished) - len(body)
    body += [[f"{not_run} other trial{'s' * (not_run > 1)}", "not run"]] if not_run else []
    return [Table("Trials without results", ["trial", "status"], body,
                  "Failed trials keep their folder and error.txt; rerunning the sweep retries them.")] if body else []


def column(group: list[dict], name: str) -> list[float]:
    return [r[name] for r in group if r.get(name) is not None]


def read_json(path: str) -> Any | None:
    """A JSON file, or None when it does not exist (an analysis that was not run)."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:  # one line naming the file, for the commands to print
        raise ValueError(f"{path} cannot be read ({describe(e)}); rerun what wrote it, or move it away") from None


def read_sweep_info(sweep_dir: str) -> dict | None:
    """``<sweep_dir>/sweep.json`` (the experiment, and the registration written when the sweep started), or None
    when it is missing or unreadable."""
    try:
        info = read_json(os.path.join(sweep_dir, "sweep.json"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def analyses(sweep_dir: str, group: list[dict], name: str) -> list[Any]:
    """``analysis/<name>.json`` of every seed of a group that has it (analyze_heads.py writes them per trial)."""
    found = [read_json(os.path.join(sweep_dir, r["trial"], "analysis", f"{name}.json")) for r in group]
    return [f for f in found if f is not None]


def write_tables(out_dir: str, name: str, tables: list[Table]) -> str:
    """``<out_dir>/<name>.md`` and ``.tex`` (atomic); returns the Markdown."""
    from attn_lab.io import write_text_atomic

    os.makedirs(out_dir, exist_ok=True)
    md = "\n".join(t.markdown() for t in tables)
    write_text_atomic(pathlib.Path(out_dir, f"{name}.md"), md)
    write_text_atomic(pathlib.Path(out_dir, f"{name}.tex"), "\n".join(t.latex() for t in tables))
    return md
