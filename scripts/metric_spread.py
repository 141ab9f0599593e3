"""Which metric pairs most tightly across seeds: for each arm against the baseline, each final test metric's mean
paired difference, the sd of the per-seed differences, and their ratio (the larger |mean| / sd, the fewer seeds
decide it). A design's deciding metric is picked from its pilot this way, before the verdict run.

  python scripts/metric_spread.py --workdir runs/head_count/pilot --baseline A-h8

Reads the sweep's ``results.csv`` (one row per trial, written by every sweep); the metrics are its ``test_*``
columns. Only seeds that finished in both arms pair.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from collections import defaultdict

from attn_lab.reporting.stats import differences


def spreads(rows: list[dict[str, str]], baseline: str) -> list[tuple[str, str, int, float, float]]:
    """``(arm, metric, pairs, mean difference, paired sd)`` per arm and test metric, arm minus baseline by seed."""
    by = defaultdict(dict)  # (variant, metric) -> {seed: value}
    for row in rows:
        for key, value in row.items():
            if key.startswith("test_") and not key.endswith("_count") and value not in ("", None) and \
                    row.get("status") in ("ok", "skipped"):
                by[(row["variant"], key)][row["seed"]] = float(value)
    out = []
    for (arm, metric), values in sorted(by.items()):
        diffs = differences(by.get((baseline, metric), {}), values)  # paired by seed, as every verdict is
        if arm != baseline and len(diffs) >= 2:
            out.append((arm, metric, len(diffs), float(diffs.mean()), float(diffs.std(ddof=1))))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="a sweep folder (its results.csv)")
    parser.add_argument("--baseline", required=True, help="the arm every other is compared with")
    args = parser.parse_args()
    path = os.path.join(args.workdir, "results.csv")
    if not os.path.isfile(path):
        sys.exit(f"error: --workdir={args.workdir}: no results.csv (written by python -m attn_lab.sweep)")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if "variant" not in (rows[0] if rows else {}) or args.baseline not in {r["variant"] for r in rows}:
        arms = sorted({r.get("variant", "") for r in rows})
        sys.exit(f"error: --baseline={args.baseline}: not an arm of {path}; arms: {', '.join(arms) or 'none'}")
    print("| arm | metric | pairs | mean difference | paired sd | abs(mean) / sd |\n|---|---|---|---|---|---|")
    for arm, metric, pairs, mean, sd in spreads(rows, args.baseline):
        ratio = abs(mean) / sd if sd > 0 else math.inf
        print(f"| {arm} | {metric} | {pairs} | {mean:+.4f} | {sd:.4f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
