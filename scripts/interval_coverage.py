"""How often the verdict interval covers the true mean difference, by simulation (what docs/sweeps.md quotes).

  python scripts/interval_coverage.py            # 4,000 simulated sweeps per cell, about a minute

Rows: the paired t-interval (the verdicts' interval) and the percentile bootstrap of the mean (the one before), on
normal and on log-normal (skewed) per-seed differences, at 3, 5 and 10 pairs; nominal level 0.95. The same
``attn_lab.reporting.stats.coverage`` is what tests/test_stats.py bounds.
"""

import math

import numpy as np

from attn_lab.markdown import markdown_table
from attn_lab.reporting import stats

DRAWS = {"normal (mean 0.1, sd 0.05)": (lambda rng, shape: 0.1 + 0.05 * rng.standard_normal(shape), 0.1),
         "log-normal (skewness 6.2)": (lambda rng, shape: np.exp(rng.standard_normal(shape)), math.exp(0.5))}
INTERVALS = {"paired t": stats.t_interval,
             "percentile bootstrap (2,000 resamples)": lambda d: stats.percentile_bootstrap(d, resamples=2000)}

if __name__ == "__main__":
    rows = [[name, data, *(f"{stats.coverage(fn, draw, n, truth):.3f}" for n in (3, 5, 10))]
            for data, (draw, truth) in DRAWS.items() for name, fn in INTERVALS.items()]
    print(markdown_table(["interval", "differences", "3 pairs", "5 pairs", "10 pairs"], rows))
