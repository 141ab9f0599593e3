"""Any TFDS catalog dataset that prepares as array_record without TensorFlow (needs the network once).

  python scripts/train.py --config configs/tfds.py --workdir runs/imdb \\
      --config.task.name=tfds:imdb_reviews --config.task.input_key=text --config.task.target_key=label \\
      --config.task.splits='train[:90%],train[90%:],test'
  python scripts/train.py --config configs/tfds.py:translation --workdir runs/pt_en \\
      --config.task.name=tfds:ted_hrlr_translate/pt_to_en --config.task.input_key=pt --config.task.target_key=en

Text is tokenized with a SentencePiece model trained on the training split and cached with the prepared data.
"""

from attn_lab.data.tasks import defaults
from attn_lab.train.config import base_config


def get_config(arg: str = "") -> "ml_collections.ConfigDict":  # noqa: F821
    """``arg``: '' (classification) or 'translation'."""
    c = base_config()
    c.task.update(name="tfds:imdb_reviews", **defaults("tfds:imdb_reviews"))  # every option, overridable by flag
    c.train.label_smoothing = 0.0
    if arg == "translation":
        c.task.name, c.task.kind = "tfds:ted_hrlr_translate/pt_to_en", "translation"
        c.task.input_key, c.task.target_key = "pt", "en"
        c.train.label_smoothing = 0.1
    elif arg:
        raise ValueError(f"unknown preset '{arg}' for configs/tfds.py; use '' or 'translation'")
    return c
