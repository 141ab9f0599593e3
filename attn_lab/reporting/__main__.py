"""Turn a finished sweep folder into Markdown and LaTeX tables and PNG plots, with the published numbers beside ours
(``python -m attn_lab.reporting``; ``scripts/make_tables.py`` and ``attn-tables`` run this).

  python -m attn_lab.reporting --workdir runs/head_count
  python -m attn_lab.reporting --workdir runs/variants --bench bench/attention.csv

Writes ``<workdir>/tables/<experiment name>.md``, ``.tex`` and PNGs (``--out`` for another folder): the table of
the experiment the sweep ran, mean +- sd over seeds, and its verdicts where the experiment has a design. On a
run's folder or a folder of runs (no sweep.json): ``tables/runs.md``, a row per finished run.
"""
# An entry point, above every layer: it reads the sweep folder with attn_lab.sweep (sweep.json names the experiment
# file; every trial's results.json gives the rows) and hands the rows to the ``report`` function that file defines,
# which reads the trials' analysis/*.json where it needs them. The library modules of attn_lab.reporting never
# import attn_lab.sweep.
from __future__ import annotations

import csv
import dataclasses
import json
import os
import pathlib
import shutil
import sys

from absl import flags

from attn_lab.cli import main_args, run_entry_point

_WORKDIR = flags.DEFINE_string("workdir", None, "A sweep folder (python -m attn_lab.sweep's --workdir), a run's "
                                "folder or a folder of runs; required.")
_OUT = flags.DEFINE_string("out", None, "Output folder (default <workdir>/tables).")
_BENCH = flags.DEFINE_string("bench", "bench/attention.csv", "variants: scripts/bench_attention.py's CSV (used if "
                             "it exists).")
_DESIGN = flags.DEFINE_enum("design", "registered", ["registered", "current"], "Judge the verdicts under the design "
                            "registered when the sweep started, or the experiment file's current one (to read a "
                            "pilot under findings revised after it; labelled, never a verdict).")


def main(argv: list[str]) -> int:
    """Checks the sweep folder, then writes the experiment's tables and the environments they came from."""
    if _WORKDIR.value is None and len(argv) == 2:  # the sweep folder used to be positional
        sys.exit(f"error: unexpected argument {argv[1]!r}; give the sweep folder as --workdir {argv[1]}")
    main_args(argv)
    if _WORKDIR.value is None:
        sys.exit("error: --workdir is required (a sweep folder, a run's folder or a folder of runs)")
    from attn_lab.checks import RunError
    from attn_lab.io import write_text_atomic
    from attn_lab.reporting.tables import write_tables
    from attn_lab.sweep.runner import collect
    from attn_lab.sweep.spec import load_experiment, recorded_preset

    sweep_dir = _WORKDIR.value
    info_path = os.path.join(sweep_dir, "sweep.json")
    if not os.path.exists(info_path):
        return _runs(sweep_dir)
    try:
        with open(info_path) as f:
            info = json.load(f)
        path, sep, preset = info["experiment"].rpartition(":")
        path, preset = (path, preset) if sep else (preset, "quick")
        if info.get("name") and os.path.isfile(path):  # the preset that builds the recorded sweep now (renamed
            # presets followed; a preset that builds another sweep is refused: it would tabulate these trials)
            preset = recorded_preset(path, preset, info["name"])
        exp = load_experiment(f"{path}:{preset}", root=info["root"])
        seeds = (info.get("registration") or {}).get("seeds")
        if seeds:  # the seeds the sweep ran (a --seeds run, e.g. a pilot, tabulates its own trials)
            exp = dataclasses.replace(exp, seeds=[int(s) for s in seeds])
        exp = dataclasses.replace(exp, judge=_DESIGN.value)
    except KeyError as e:
        sys.exit(f"error: --workdir={sweep_dir}: {info_path} has no key {e} (written by python -m attn_lab.sweep)")
    except (OSError, ValueError) as e:
        sys.exit(f"error: --workdir={sweep_dir}: {info_path}: {e}".replace("\n", " "))
    if exp.report_fn is None:  # the shared report: every arm and the verdicts
        from attn_lab.reporting.default import default_report

        exp = dataclasses.replace(exp, report_fn=default_report)
    name = pathlib.Path(path).stem  # tables/<name>.md
    try:
        rows = collect(exp, sweep_dir)
    except RunError as e:  # a trial's results.json cannot be read
        sys.exit(f"error: {e}")
    if not any(r["status"] in ("ok", "skipped") for r in rows):
        sys.exit(f"error: --workdir={sweep_dir}: no finished trial")
    bench = None
    if os.path.exists(_BENCH.value):
        with open(_BENCH.value) as f:
            bench = list(csv.DictReader(f))
    out = _writable_out(sweep_dir)
    new = not os.path.exists(out)
    os.makedirs(out, exist_ok=True)
    try:
        tables = exp.report_fn(rows, sweep_dir, exp, out, bench)
    except (ValueError, RunError) as e:  # an analysis JSON of a trial cannot be read: one line naming it
        if new:  # a refused command leaves no folder
            shutil.rmtree(out, ignore_errors=True)
        sys.exit(f"error: {e}")
    print(write_tables(out, name, tables))
    _curves(out, sweep_dir, rows)
    _verdict_steps(out, sweep_dir, rows, exp)
    envs = _environments(sweep_dir, rows)
    print("Environments of these runs:\n" + "\n".join(f"  {line}" for line in envs))
    write_text_atomic(pathlib.Path(out, "environments.md"),
                      "# Environments of these runs\n\n" + "".join(f"- {line}\n" for line in envs))
    print(f"wrote {out}/{name}.md, .tex, environments.md and PNGs")
    return 0


def _curves(out: str, sweep_dir: str, rows: list[dict]) -> None:
    """Learning curves per variant beside the tables; a plot that fails is a note (the tables are written)."""
    from attn_lab.reporting.curves import write_variant_curves

    try:
        path = write_variant_curves(out, sweep_dir, rows)
    except Exception as e:  # noqa: BLE001 (matplotlib fails in many ways; the tables are written either way)
        print(f"note: learning curves not drawn ({type(e).__name__}: {e})")
        return
    if path:
        print(f"learning curves per variant (mean over seeds, band min-max): {path}")


def _verdict_steps(out: str, sweep_dir: str, rows: list[dict], exp) -> None:
    """Each finding's paired difference against step (validation), beside the tables; a note when it fails."""
    from attn_lab.reporting.moving import write_verdict_steps

    try:
        path = write_verdict_steps(out, sweep_dir, rows, exp)
    except Exception as e:  # noqa: BLE001 (as the curves: the tables are written either way)
        print(f"note: the verdict-vs-step figure was not drawn ({type(e).__name__}: {e})")
        return
    if path:
        print(f"each finding's paired difference against step (validation, interval over seeds): {path}")


def _runs(folder: str) -> int:
    """A run's folder or a folder of runs (no sweep.json): ``tables/runs.md`` with a row per finished run."""
    from attn_lab import results
    from attn_lab.checks import RunError
    from attn_lab.environment import summarize
    from attn_lab.reporting.runs import RUNS_NAME, find_runs, runs_table
    from attn_lab.reporting.tables import write_tables

    if not os.path.isdir(folder):
        sys.exit(f"error: --workdir={folder}: no such folder")
    try:
        runs = find_runs(folder)
    except RunError as e:  # a damaged results.json: named, never rewritten
        sys.exit(f"error: {e}")
    if not runs:
        sys.exit(f"error: --workdir={folder}: no sweep.json and no finished run (results.json) in it or in its "
                 "subfolders; give a sweep folder, a run's folder or a folder of runs")
    out = _writable_out(folder)
    print(write_tables(out, RUNS_NAME, [runs_table(folder, runs)]))
    envs = summarize([results.environment(results.finished_results(run)) for run in runs])
    print("Environments of these runs:\n" + "\n".join(f"  {line}" for line in envs))
    print(f"wrote {out}/{RUNS_NAME}.md and .tex")
    return 0


def _writable_out(folder: str) -> str:
    """The tables' folder (``--out``, default ``<folder>/tables``), checked writable before anything is written: a
    read-only sweep folder is one line naming it and --out, not a traceback."""
    from attn_lab.checks import check_writable

    out = _OUT.value or os.path.join(folder, "tables")
    try:
        check_writable(out, "--out")
    except ValueError as e:
        sys.exit(f"error: {e}" + ("" if _OUT.value else " (the tables go to <workdir>/tables; give --out elsewhere)"))
    return out


def _environments(sweep_dir: str, rows: list[dict]) -> list[str]:
    """One line per distinct environment (versions, devices, commit) among the finished trials' results.json."""
    from attn_lab import results
    from attn_lab.environment import summarize

    finished = [results.finished_results(os.path.join(sweep_dir, row["trial"])) for row in rows
                if row["status"] in ("ok", "skipped")]
    return summarize([results.environment(record) for record in finished if record is not None])


def run() -> None:
    """The ``attn-tables`` console script."""
    run_entry_point(main, __name__)


if __name__ == "__main__":
    run()
