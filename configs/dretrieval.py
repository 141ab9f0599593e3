"""D-retrieval (attn_lab/data/tasks/dretrieval.py): one answer combines D lookups, each an argmax by its own order.

  python scripts/train.py --config configs/dretrieval.py:quick --workdir runs/dretrieval_quick
  python scripts/train.py --config configs/dretrieval.py:sum --workdir runs/dretrieval_sum --config.model.num_heads=1

'' / 'quick': the answer names both looked-up values, one attention-only block (no MLP), d_model 64 split over the
heads. Measured (docs/head_count.md): at 17 positions one head does as well as two (0.92 / 0.90 test accuracy) -- a
tuple answer is a sum of per-lookup scores, which one head's average carries. 'sum': the answer is the two values'
sum mod 4, with an MLP after attention (the paper's FFN) at d_model 32 (its hidden size), 200k training sequences and
10,000 steps: one head 0.34 (chance 0.25), two heads 0.89 (seed 0; experiments/head_count.py:sharp decides it).
"""

from attn_lab.data.tasks import defaults
from attn_lab.train.config import base_config


def get_config(arg: str = "") -> "ml_collections.ConfigDict":  # noqa: F821
    """``arg``: '' (D = 2, 16 of 64 keys, 3000 steps), 'quick' (the same task, 600 steps: seconds on a CPU) or 'sum'
    (the answer sums the lookups mod 4, an MLP of 128 at d_model 32, 200k sequences, 10,000 steps: 4 min on a CPU
    core)."""
    c = base_config()
    c.task.update(name="dretrieval", **defaults("dretrieval"))  # every option, so each can be overridden by flag
    c.model.update(num_layers=1, d_model=64, num_heads=2, mlp_dim=0, dropout=0.0, positions="learned",
                   tie_embeddings=True)
    c.train.update(num_steps=3000, batch_size=64, learning_rate=3e-3, warmup_steps=100, schedule="cosine",
                   label_smoothing=0.0, weight_decay=0.0, eval_every=1000, checkpoint_every=1000, log_every=100)
    if arg == "quick":
        c.train.update(num_steps=600, eval_every=600, checkpoint_every=600)
    elif arg == "sum":
        c.task.update(combine="sum", num_train=200_000)
        c.model.update(d_model=32, mlp_dim=128)
        c.train.update(num_steps=10_000, eval_every=2000, checkpoint_every=2000)
    elif arg:
        raise ValueError(f"unknown preset '{arg}' for configs/dretrieval.py; use '', 'quick' or 'sum'")
    return c
