"""Multi-query associative recall (Zoology MQAR) with a decoder-only language model.

  python scripts/train.py --config configs/mqar.py:quick --workdir runs/mqar_quick
  python scripts/train.py --config configs/mqar.py --workdir runs/mqar --config.task.seq_len=256 \\
      --config.task.num_kv_pairs=16

The model follows Zoology's Figure 2 attention baseline: 2 layers, attention-only blocks (no MLP), learned absolute
positions, tied embeddings, no label smoothing (recall is exact or wrong). Zoology uses a vocabulary of 8,192,
100,000 training sequences, 64 epochs and the best of four learning rates; the default here is CPU-sized.
"""

from attn_lab.data.tasks import defaults
from attn_lab.train.config import base_config


def get_config(arg: str = "") -> "ml_collections.ConfigDict":  # noqa: F821
    """``arg``: '' (Zoology-sized data: vocabulary 8192, 100k sequences) or 'quick' (vocabulary 256, 20k
    sequences, d_model 64: minutes on a CPU)."""
    c = base_config()
    c.task.update(name="mqar", **defaults("mqar"))  # every option, so each can be overridden by flag
    c.model.update(num_layers=2, d_model=128, num_heads=1, mlp_dim=0, dropout=0.0, positions="learned",
                   tie_embeddings=True)
    c.train.update(num_steps=20000, batch_size=64, learning_rate=1e-3, warmup_steps=200, schedule="cosine",
                   label_smoothing=0.0, weight_decay=0.1, eval_every=2000, checkpoint_every=2000)
    c.task.update(vocab_size=8192, num_train=100_000, num_test=3000)
    if arg == "quick":
        c.task.update(vocab_size=256, num_train=20_000, num_validation=500, num_test=1000)
        c.model.d_model = 64
        c.train.update(num_steps=1500, eval_every=1500, checkpoint_every=1500, log_every=100)
    elif arg:
        raise ValueError(f"unknown preset '{arg}' for configs/mqar.py; use '' or 'quick'")
    return c
