"""Bible translation (verse-aligned, public-domain translations; default French Louis Segond -> English WEB).

  pip install -e ".[bible]"
  python scripts/train.py --config configs/bible.py:quick --workdir runs/bible_quick
  python scripts/train.py --config configs/bible.py --workdir runs/bible --config.task.src=kjv --config.task.tgt=lsg

Validation and test verses come from books never seen in training; text is tokenized with a SentencePiece model
trained on the training split (``task.vocab_size``, ``task.spm_model_type``) and cached with the prepared data.
"""

from attn_lab.data.tasks import defaults
from attn_lab.train.config import base_config


def get_config(arg: str = "") -> "ml_collections.ConfigDict":  # noqa: F821
    """``arg``: '' (a base-size model), 'quick' (a small model for <= 10 minutes on 2 CPU cores) or 'small' (the
    ablation tables' model: 2+2 layers at d_model 64, 600 steps, about 2 minutes per seed on 2 cores)."""
    c = base_config()
    c.task.update(name="bible", **defaults("bible"))  # every option, so each can be overridden by flag
    c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.mlp_dim = 6, 512, 8, 2048
    c.train.num_steps, c.train.batch_size, c.train.learning_rate, c.train.warmup_steps = 50000, 64, 7e-4, 4000
    c.train.eval_every = c.train.checkpoint_every = 2000
    c.train.max_eval_batches = 16
    if arg == "quick":
        c.task.vocab_size, c.task.max_input_length, c.task.max_target_length = 2000, 64, 64  # small model, CPU
        c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.mlp_dim = 2, 128, 4, 512
        c.model.dropout = 0.1
        c.train.num_steps, c.train.batch_size, c.train.learning_rate, c.train.warmup_steps = 1600, 32, 2e-3, 200
        c.train.eval_every = c.train.checkpoint_every = 800
        c.train.max_eval_batches = 4  # 128 validation and 128 test verses, greedy-decoded
    elif arg == "small":  # paired ablations in test nats, past a target-side LM's (docs/head_count.md) and far from 0
        c.task.vocab_size, c.task.max_input_length, c.task.max_target_length = 2000, 48, 48
        c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.mlp_dim = 2, 64, 8, 256
        c.model.dropout = 0.0
        c.train.num_steps, c.train.batch_size, c.train.learning_rate, c.train.warmup_steps = 600, 32, 3e-3, 50
        c.train.schedule, c.train.label_smoothing = "cosine", 0.0  # the test loss is the perplexity's log
        c.train.eval_every, c.train.checkpoint_every = 200, 300
        c.train.max_eval_batches = 4  # 128 validation and 128 test verses, greedy-decoded
    elif arg:
        raise ValueError(f"unknown preset '{arg}' for configs/bible.py; use '', 'quick' or 'small'")
    return c
