"""Language modelling on public-domain Bible verses (default: World English Bible), perplexity on held-out books.

  pip install -e ".[bible]"
  python scripts/train.py --config configs/bible_lm.py:quick --workdir runs/bible_lm_quick
  python scripts/train.py --config configs/bible_lm.py --workdir runs/bible_lm --config.task.translation=kjv

A decoder-only model (``model.name`` defaults to 'lm' for this task); the test loss is the mean next-token
cross-entropy over held-out books, perplexity its exponential.
"""

from attn_lab.data.tasks import defaults
from attn_lab.train.config import base_config


def get_config(arg: str = "") -> "ml_collections.ConfigDict":  # noqa: F821
    """``arg``: '' (a GPT-small-like model) or 'quick' (2 layers, d_model 64: minutes on 2 CPU cores)."""
    c = base_config()
    c.task.update(name="bible_lm", **defaults("bible_lm"))  # every option, so each can be overridden by flag
    c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.mlp_dim = 6, 512, 8, 2048
    c.train.num_steps, c.train.batch_size, c.train.learning_rate, c.train.warmup_steps = 50000, 64, 6e-4, 2000
    c.train.schedule, c.train.label_smoothing = "cosine", 0.0  # the loss is the perplexity's log: unsmoothed
    c.train.eval_every = c.train.checkpoint_every = 2000
    c.train.max_eval_batches = 16
    if arg == "quick":
        c.task.vocab_size, c.task.max_length = 2000, 64
        c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.mlp_dim = 2, 64, 8, 256
        c.model.dropout = 0.0
        c.train.num_steps, c.train.batch_size, c.train.learning_rate, c.train.warmup_steps = 400, 32, 3e-3, 50
        c.train.eval_every = c.train.checkpoint_every = 400
        c.train.max_eval_batches = 8
    elif arg:
        raise ValueError(f"unknown preset '{arg}' for configs/bible_lm.py; use '' or 'quick'")
    return c
