"""Number translation: integers written out in one language and another.

A clean seq2seq task whose difficulty is known (e.g. German writes the units
before the tens: 42 -> 'zweiundvierzig'), generated locally with num2words.
This file holds the task whole: its options and defaults, checks, TFDS
builder and loader.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
from num2words import CONVERTER_CLASSES, num2words

from attn_lab.data import builders
from attn_lab.data.tasks import Task, TaskSpec, register

SPLITS = ("train", "validation", "test")
# The task's options and their defaults (config files start from these).
DEFAULTS = dict(src_lang="en", tgt_lang="de", min_value=0, max_value=9999, split_seed=0, max_input_length=64,
                max_target_length=64)


@dataclasses.dataclass(eq=False)
class NumbersConfig(tfds.core.BuilderConfig):
    """Generation parameters; build with `numbers_config` so the name matches."""

    src_lang: str = DEFAULTS["src_lang"]
    tgt_lang: str = DEFAULTS["tgt_lang"]
    min_value: int = DEFAULTS["min_value"]
    max_value: int = DEFAULTS["max_value"]
    split_seed: int = DEFAULTS["split_seed"]
    train_percent: int = 80
    validation_percent: int = 10


def numbers_config(
    *,
    src_lang: str,
    tgt_lang: str,
    min_value: int,
    max_value: int,
    split_seed: int,
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


GENERATION = ("src_lang", "tgt_lang", "min_value", "max_value", "split_seed")  # the options that shape the data


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
    BUILDER_CONFIGS = [numbers_config(**{k: DEFAULTS[k] for k in GENERATION})]  # noqa: RUF012
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


MAX_VALUES = 10_000_000  # integers one numbers dataset may hold (preparing 10M takes minutes and a few GB)


def check(opts: dict[str, Any]) -> None:
    """Languages num2words knows, and a range wide enough for every split."""
    for key in ("src_lang", "tgt_lang"):
        if opts[key] not in CONVERTER_CLASSES:
            raise ValueError(f"task.{key}={opts[key]!r} is not a num2words language")
    if opts["max_value"] - opts["min_value"] < 9:
        raise ValueError(
            f"task.max_value={opts['max_value']!r} must be at least min_value+9 so every split gets integers")
    if opts["max_value"] - opts["min_value"] >= MAX_VALUES:
        raise ValueError(f"task.max_value={opts['max_value']!r}: {opts['max_value'] - opts['min_value'] + 1:,} "
                         f"integers from task.min_value={opts['min_value']!r}; at most {MAX_VALUES:,} (each one is "
                         "written out in words when the data is prepared, all in memory)")


def tfds_builder(opts: dict[str, Any]) -> tuple[type[Numbers], NumbersConfig]:
    return Numbers, numbers_config(**{k: opts[k] for k in GENERATION})


def load(opts: dict[str, Any], data_dir: str) -> Task:
    """Character-level: the vocab holds both languages' characters."""
    prepared = builders.prepare(*tfds_builder(opts), data_dir)
    return Task("numbers", "translation", builders.load_vocab(prepared, "char"), None, opts["max_input_length"],
                opts["max_target_length"], builders.in_memory(prepared))


def train_size(opts: dict[str, Any]) -> int:
    """Each integer of the range is one example; train takes its share."""
    return (opts["max_value"] - opts["min_value"] + 1) * NumbersConfig.train_percent // 100


register(TaskSpec("numbers", "translation", DEFAULTS, load, builder=tfds_builder, check=check, train_size=train_size))
