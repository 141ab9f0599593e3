"""Run an ablation sweep from one experiment file: ``python -m attn_lab.sweep`` (attn_lab/sweep/__main__.py), kept
as a path.

  python scripts/sweep.py --experiment experiments/head_count.py:quick --workdir runs/head_count
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("attn_lab.sweep", run_name="__main__", alter_sys=True)
