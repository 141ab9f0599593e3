"""Train one model from a config file: ``python -m attn_lab.train`` (attn_lab/train/__main__.py), kept as a path.

  python scripts/train.py --config configs/numbers.py:quick --workdir runs/x --config.model.num_heads=8
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("attn_lab.train", run_name="__main__", alter_sys=True)
