"""Number translation (num2words): English words -> German words by default.

  python scripts/train.py --config configs/numbers.py --workdir runs/numbers
  python scripts/train.py --config configs/numbers.py:quick --workdir runs/numbers_quick   # ~2 min on 2 CPUs
"""

from attn_lab.data.tasks import defaults
from attn_lab.train.config import base_config


def get_config(arg: str = "") -> "ml_collections.ConfigDict":  # noqa: F821
    """``arg``: '' (full) or 'quick' (a small model and few steps that still clearly learns)."""
    c = base_config()
    c.task.update(name="numbers", **defaults("numbers"))  # every option, so each can be overridden by flag
    c.eval.bleu_tokenize = "char"  # targets are single compound words: score characters
    c.train.num_steps, c.train.batch_size, c.train.learning_rate = 4000, 64, 1e-3
    if arg == "quick":
        c.model.num_layers, c.model.d_model, c.model.mlp_dim, c.model.dropout = 2, 64, 256, 0.0
        c.train.num_steps, c.train.warmup_steps, c.train.learning_rate = 600, 100, 2e-3
        c.train.eval_every = c.train.checkpoint_every = 300
    elif arg:
        raise ValueError(f"unknown preset '{arg}' for configs/numbers.py; use '' or 'quick'")
    return c
