"""Handwritten digits (scikit-learn's 8x8 images) classified as 64-token pixel sequences.

  pip install -e ".[digits]"
  python scripts/train.py --config configs/digits.py:quick --workdir runs/digits_quick
"""

from attn_lab.data.tasks import defaults
from attn_lab.train.config import base_config


def get_config(arg: str = "") -> "ml_collections.ConfigDict":  # noqa: F821
    """``arg``: '' (full) or 'quick' (a few minutes on 2 CPU cores)."""
    c = base_config()
    c.task.update(name="digits", **defaults("digits"))  # every option, so each can be overridden by flag
    c.model.positions = "sinusoidal"  # measured: learned positions (init 0.02 beside unit-scale embeddings) reach 57%
    c.model.pooling = "mean"
    c.train.num_steps, c.train.batch_size, c.train.learning_rate = 3000, 32, 1e-3
    c.train.label_smoothing = 0.0
    if arg == "quick":
        c.model.num_layers, c.model.d_model, c.model.mlp_dim = 2, 64, 128
        c.train.num_steps, c.train.warmup_steps = 2000, 100
        c.train.eval_every = c.train.checkpoint_every = 1000
    elif arg:
        raise ValueError(f"unknown preset '{arg}' for configs/digits.py; use '' or 'quick'")
    return c
