"""Head analysis of a finished run: ``python -m attn_lab.analysis`` (attn_lab/analysis/__main__.py), kept as a path.

  python scripts/analyze_heads.py --workdir runs/numbers_quick --what importance,ablate,prune,structural,gates,diagnose
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("attn_lab.analysis", run_name="__main__", alter_sys=True)
