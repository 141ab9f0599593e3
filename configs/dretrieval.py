"""D-retrieval (attn_lab/data/tasks/dretrieval.py): one answer combines D lookups, each an argmax by its own order.

  python scripts/train.py --config configs/dretrieval.py:quick --workdir runs/dretrieval_quick

The model is one attention-only block (no MLP), d_model 64 split over the heads. Measured (docs/head_count.md): at
17 positions one head does as well as two (0.92 / 0.90 test accuracy): widths of 32-64 are in the memorization
regime of arXiv 2510.06662, so the h = D transition needs T well above the width.
"""

from attn_lab.data.tasks import defaults
from attn_lab.train.config import base_config


def get_config(arg: str = "") -> "ml_collections.ConfigDict":  # noqa: F821
    """``arg``: '' (D = 2 over 8 keys, 3000 steps) or 'quick' (the same task, 600 steps: seconds on a CPU)."""
    c = base_config()
    c.task.update(name="dretrieval", **defaults("dretrieval"))  # every option, so each can be overridden by flag
    c.model.update(num_layers=1, d_model=64, num_heads=2, mlp_dim=0, dropout=0.0, positions="learned",
                   tie_embeddings=True)
    c.train.update(num_steps=3000, batch_size=64, learning_rate=3e-3, warmup_steps=100, schedule="cosine",
                   label_smoothing=0.0, weight_decay=0.0, eval_every=1000, checkpoint_every=1000, log_every=100)
    if arg == "quick":
        c.train.update(num_steps=600, eval_every=600, checkpoint_every=600)
    elif arg:
        raise ValueError(f"unknown preset '{arg}' for configs/dretrieval.py; use '' or 'quick'")
    return c
