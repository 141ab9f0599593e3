"""Handwritten digits as token sequences: scikit-learn's bundled 8x8 ``load_digits`` images, 64 pixels each.

Each image becomes the 64 intensities (0..16) in raster order as word tokens, so a Transformer classifies it as a
sequence (an image-as-sequence task in the spirit of LRA's pixel tasks, small enough for a CPU). 1,797 images,
split 80/10/10 by a seeded permutation. This file holds the task whole: its options and defaults, checks, TFDS
builder and loader.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from attn_lab.data import builders
from attn_lab.data.tasks import Task, TaskSpec, register

# The task's options and their defaults (config files start from these).
DEFAULTS = dict(split_seed=0)
IMAGES, LENGTH = 1797, 64  # scikit-learn's load_digits: a fixed set of 8x8 images


@dataclasses.dataclass(eq=False)
class DigitsConfig(tfds.core.BuilderConfig):
    split_seed: int = DEFAULTS["split_seed"]


def digits_config(*, split_seed: int) -> DigitsConfig:
    return DigitsConfig(name=f"seed{split_seed}", split_seed=split_seed)


def check_installed() -> None:
    builders.package_file("sklearn", task="digits", extra="digits")


def load_images() -> tuple[np.ndarray, np.ndarray]:
    """(pixels [N, 64] ints 0..16, labels [N])."""
    check_installed()
    from sklearn.datasets import load_digits  # optional dependency, imported only when preparing

    data = load_digits()
    return data.data.astype(np.int64), data.target.astype(np.int64)


class Digits(builders.SyntheticBuilder, skip_registration=True):
    """8x8 digit images as 64-token sequences, 10 classes."""

    name = "digits"
    BUILDER_CONFIGS = [digits_config(**DEFAULTS)]  # noqa: RUF012
    FEATURES = {"source": tfds.features.Text(), "label": tfds.features.ClassLabel(num_classes=10)}  # noqa: RUF012
    SUPERVISED_KEYS = ("source", "label")

    def _split_generators(self, dl_manager):
        del dl_manager  # bundled with scikit-learn, nothing to download
        pixels, labels = load_images()
        order = np.random.default_rng(self.builder_config.split_seed).permutation(len(labels))
        parts = np.split(order, [len(order) * 8 // 10, len(order) * 9 // 10])
        builders.save_vocab(self, [" ".join(map(str, row)) for row in pixels[parts[0]]], level="word")
        return {split: self._generate_examples(pixels, labels, idx)
                for split, idx in zip(("train", "validation", "test"), parts)}

    def _generate_examples(self, pixels, labels, indices):
        for i in indices:
            yield int(i), {"source": " ".join(map(str, pixels[i])), "label": int(labels[i])}


def tfds_builder(opts: dict[str, Any]) -> tuple[type[Digits], DigitsConfig]:
    return Digits, digits_config(split_seed=opts["split_seed"])


def load(opts: dict[str, Any], data_dir: str) -> Task:
    """Word-level tokens (the 17 intensities); ten classes."""
    prepared = builders.prepare(*tfds_builder(opts), data_dir)
    return Task("digits", "classification", builders.load_vocab(prepared, "word"), 10, LENGTH, None,
                builders.in_memory(prepared))


register(TaskSpec("digits", "classification", DEFAULTS, load, builder=tfds_builder,
                  check=lambda opts: check_installed(), train_size=lambda opts: IMAGES * 8 // 10,
                  sequence_lengths=lambda opts: (LENGTH, None)))
