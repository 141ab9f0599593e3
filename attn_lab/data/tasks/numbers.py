"""Number translation: integers written out in one language and another.

A clean seq2seq task whose difficulty is known (e.g. German writes the units
before the tens: 42 -> 'zweiundvierzig'), generated locally with num2words.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow_datasets as tfds
from num2words import num2words

from attn_lab.data import builders

SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(eq=False)
class NumbersConfig(tfds.core.BuilderConfig):
    """Generation parameters; build with `numbers_config` so the name matches."""

    src_lang: str = "en"
    tgt_lang: str = "de"
    min_value: int = 0
    max_value: int = 9999
    split_seed: int = 0
    train_percent: int = 80
    validation_percent: int = 10


def numbers_config(
    src_lang: str = "en",
    tgt_lang: str = "de",
    min_value: int = 0,
    max_value: int = 9999,
    split_seed: int = 0,
    train_percent: int = 80,
    validation_percent: int = 10,
) -> NumbersConfig:
    """Returns a config whose name encodes every parameter.

    The name is the dataset's directory, so different settings never share
    prepared files and equal settings reuse them.

    Args:
      src_lang: num2words language code of the source side.
      tgt_lang: num2words language code of the target side.
      min_value: smallest integer (inclusive).
      max_value: largest integer (inclusive).
      split_seed: seed of the permutation that assigns integers to splits.
      train_percent: share of integers in train.
      validation_percent: share in validation; test gets the rest.

    Returns:
      A NumbersConfig.
    """
    name = f"{src_lang}-{tgt_lang}_{min_value}-{max_value}_seed{split_seed}_split{train_percent}-{validation_percent}"
    return NumbersConfig(
        name=name,
        src_lang=src_lang,
        tgt_lang=tgt_lang,
        min_value=min_value,
        max_value=max_value,
        split_seed=split_seed,
        train_percent=train_percent,
        validation_percent=validation_percent,
    )


def split_values(config: NumbersConfig) -> dict[str, np.ndarray]:
    """Assigns every integer in the range to exactly one split.

    Args:
      config: the generation parameters.

    Returns:
      split name -> sorted int64 array; the arrays are disjoint and cover
      [min_value, max_value].
    """
    values = np.arange(config.min_value, config.max_value + 1, dtype=np.int64)
    perm = np.random.default_rng(config.split_seed).permutation(values)
    n_train = len(values) * config.train_percent // 100
    n_val = len(values) * config.validation_percent // 100
    parts = np.split(perm, [n_train, n_train + n_val])
    return {s: np.sort(p) for s, p in zip(SPLITS, parts)}


class Numbers(builders.SyntheticBuilder, skip_registration=True):
    """Number translation between two num2words languages."""

    name = "numbers"
    BUILDER_CONFIGS = [numbers_config()]
    FEATURES = {"source": tfds.features.Text(), "target": tfds.features.Text(), "value": np.int64}

    def _split_generators(self, dl_manager):
        del dl_manager  # Nothing to download.
        config = self.builder_config
        examples = {split: [self._example(int(v)) for v in values] for split, values in split_values(config).items()}
        builders.save_vocab(
            self, [e["source"] for e in examples["train"]] + [e["target"] for e in examples["train"]], level="char"
        )
        return {split: self._generate_examples(exs) for split, exs in examples.items()}

    def _example(self, value: int) -> dict[str, object]:
        config = self.builder_config
        return {
            "source": num2words(value, lang=config.src_lang),
            "target": num2words(value, lang=config.tgt_lang),
            "value": value,
        }

    def _generate_examples(self, examples):
        for example in examples:
            yield int(example["value"]), example
