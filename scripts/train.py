"""Train one model from a config file.

  python scripts/train.py --config configs/numbers.py:quick --workdir runs/x --config.model.num_heads=8

Running the same command again on the same workdir resumes from its last checkpoint.
"""

import json
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from attn_lab.cli import parse_flags
from attn_lab.train.config import validate_config
from attn_lab.train.trainer import train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, optionally with ':preset'.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder (metrics, checkpoints, W&B, results.json).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax/tfds INFO lines drown the progress bar
    try:
        validate_config(_CONFIG.value)  # one line naming the bad key, before any data or compilation
    except ValueError as e:
        sys.exit(f"error: {e}")
    try:
        results = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
    except FloatingPointError as e:  # non-finite loss: the last good checkpoint is kept
        sys.exit(f"error: {e}")
    summary = {k: results[k] for k in ("final", "best", "num_params", "steps", "wall_time_sec", "steps_per_sec")
               if k in results}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
