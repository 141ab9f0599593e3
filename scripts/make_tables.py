"""Tables and plots of a finished sweep folder: ``python -m attn_lab.reporting`` (attn_lab/reporting/__main__.py),
kept as a path.

  python scripts/make_tables.py --workdir runs/head_count
  python scripts/make_tables.py --workdir runs/variants --bench bench/attention.csv
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("attn_lab.reporting", run_name="__main__", alter_sys=True)
