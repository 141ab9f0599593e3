"""Train one model from a config file.

  python scripts/train.py --config configs/numbers.py:quick --workdir runs/x --config.model.num_heads=8

Running the same command again on the same workdir resumes from its last checkpoint.
"""

import json
import sys

from absl import app, flags
from ml_collections import config_flags

from attn_lab.train.trainer import train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, optionally with ':preset'.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder (metrics, checkpoints, W&B, results.json).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {argv[1:]}")
    try:
        results = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
    except ValueError as e:  # config validation: one line, before anything compiles
        sys.exit(f"error: {e}")
    except FloatingPointError as e:
        sys.exit(f"error: {e}")
    summary = {k: results[k] for k in ("final", "best", "num_params", "steps", "wall_time_sec", "steps_per_sec")
               if k in results}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    app.run(main)
