"""How often each candidate verdict interval covers the true mean difference, by simulation (docs/sweeps.md).

  python scripts/interval_coverage.py            # 4,000 simulated sweeps per cell, about two minutes

Rows: the paired t, the bootstrap-t, BCa and their hull (the verdicts' interval), for normal, heavy-tailed, skewed
and 15%-collapse per-seed differences, at 3, 5 and 10 pairs; nominal level 0.95. The candidates and shapes are
``attn_lab.reporting.coverage``, which tests/test_stats.py bounds.
"""

from attn_lab.markdown import markdown_table
from attn_lab.reporting import coverage

if __name__ == "__main__":
    cells = coverage.table()
    rows = [[name, shape, *(f"{cells[name, shape, n]:.3f}" for n in coverage.PAIRS)]
            for shape in coverage.SHAPES for name in coverage.CANDIDATES]
    worst = [[name, *(f"{min(cells[name, s, n] for s in coverage.SHAPES):.3f}" for n in coverage.PAIRS)]
             for name in coverage.CANDIDATES]
    print(markdown_table(["interval", "differences", *(f"{n} pairs" for n in coverage.PAIRS)], rows))
    print()
    print(markdown_table(["interval (worst shape)", *(f"{n} pairs" for n in coverage.PAIRS)], worst))
