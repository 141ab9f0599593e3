"""Turn a finished sweep folder into Markdown and LaTeX tables and PNG plots, with the published numbers beside ours.

  python scripts/make_tables.py runs/head_count
  python scripts/make_tables.py runs/variants --bench bench/attention.csv

Reads ``<sweep>/sweep.json`` (written by scripts/sweep.py) to find the experiment file, collects every trial's
results.json, and hands the rows to the ``report`` function that file defines (it reads the trials' ``analysis/*.json``
itself where it needs them, groups seeds and prints its published numbers beside ours); writes
``<sweep>/tables/<experiment file stem>.md``, ``.tex`` and PNGs.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import sys


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep_dir", help="a folder scripts/sweep.py wrote")
    p.add_argument("--out", help="output folder (default <sweep_dir>/tables)")
    p.add_argument("--bench", default="bench/attention.csv", help="variants: scripts/bench_attention.py's CSV")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    from attn_lab.io import write_text_atomic
    from attn_lab.reporting.tables import write_tables
    from attn_lab.sweep.runner import collect
    from attn_lab.sweep.spec import load_experiment

    info_path = os.path.join(args.sweep_dir, "sweep.json")
    if not os.path.exists(info_path):
        sys.exit(f"error: {args.sweep_dir} is not a sweep folder (no sweep.json); run scripts/sweep.py first")
    with open(info_path) as f:
        info = json.load(f)
    exp = load_experiment(info["experiment"], root=info["root"])
    path = info["experiment"].rsplit(":", 1)[0]
    if exp.report_fn is None:
        sys.exit(f"error: {path} defines no report(rows, sweep_dir, exp, out_dir, bench); add one (experiments/*.py)")
    name = pathlib.Path(path).stem  # tables/<name>.md
    rows = collect(exp, args.sweep_dir)
    if not any(r["status"] in ("ok", "skipped") for r in rows):
        sys.exit(f"error: no finished trial in {args.sweep_dir}")
    bench = None
    if os.path.exists(args.bench):
        with open(args.bench) as f:
            bench = list(csv.DictReader(f))
    out = args.out or os.path.join(args.sweep_dir, "tables")
    os.makedirs(out, exist_ok=True)
    tables = exp.report_fn(rows, args.sweep_dir, exp, out, bench)
    print(write_tables(out, name, tables))
    envs = _environments(args.sweep_dir, rows)
    print("Environments of these runs:\n" + "\n".join(f"  {line}" for line in envs))
    write_text_atomic(pathlib.Path(out, "environments.md"),
                      "# Environments of these runs\n\n" + "".join(f"- {line}\n" for line in envs))
    print(f"wrote {out}/{name}.md, .tex, environments.md and PNGs")
    return 0


def _environments(sweep_dir: str, rows: list[dict]) -> list[str]:
    """One line per distinct environment (versions, devices, commit) among the finished trials' results.json."""
    from attn_lab.environment import summarize

    blocks = []
    for row in rows:
        path = os.path.join(sweep_dir, row["trial"], "results.json")
        if row["status"] in ("ok", "skipped") and os.path.exists(path):
            with open(path) as f:
                blocks.append(json.load(f).get("environment"))
    return summarize(blocks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
