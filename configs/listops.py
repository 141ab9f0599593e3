"""ListOps (Long Range Arena): classify the value (0-9) of a nested MAX/MIN/MED/SM expression.

  python scripts/train.py --config configs/listops.py:quick --workdir runs/listops_quick
  python scripts/train.py --config configs/listops.py --workdir runs/listops --config.task.max_length=2000
"""

from attn_lab.data.tasks import defaults
from attn_lab.train.config import base_config


def get_config(arg: str = "") -> "ml_collections.ConfigDict":  # noqa: F821
    """``arg``: '' (full) or 'quick' (short sequences, few steps; beats the 10% chance level)."""
    c = base_config()
    c.task.update(name="listops", **defaults("listops"))  # every option, so each can be overridden by flag
    c.task.max_length = 512  # longer than the task's default 128: the full run measures long-range attention
    c.model.pooling = "mean"
    c.train.num_steps, c.train.batch_size, c.train.learning_rate = 5000, 32, 5e-4
    c.train.label_smoothing = 0.0
    if arg == "quick":
        c.task.max_depth, c.task.min_length, c.task.max_length = 3, 16, 64  # shallow, short: minutes on a CPU
        c.task.num_train = 5000
        c.model.num_layers, c.model.d_model, c.model.mlp_dim = 2, 64, 128
        c.train.num_steps, c.train.warmup_steps, c.train.learning_rate = 1500, 100, 1e-3
        c.train.eval_every = c.train.checkpoint_every = 500
    elif arg:
        raise ValueError(f"unknown preset '{arg}' for configs/listops.py; use '' or 'quick'")
    return c
