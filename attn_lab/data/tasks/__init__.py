"""The tasks the trainer knows, behind one small interface.

`load_task(cfg)` prepares a task's data on first use (or finds it prepared),
loads the vocab stored with it, and hands out batch datasets per split.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Literal

import grain
import tensorflow_datasets as tfds
from num2words import CONVERTER_CLASSES

from attn_lab.data import builders, catalog, pipeline, spm
from attn_lab.data.builders import bible, digits, listops, numbers, sentiment
from attn_lab.data.tokenizers import Vocab

SPLITS: tuple[str, ...] = ("train", "validation", "test")
SPM = dict(vocab_size=8000, spm_model_type="unigram")  # subword options shared by the natural-language tasks

# Task options and their defaults; the config files set the same names. 'tfds:<catalog name>' uses TFDS_DEFAULTS.
DEFAULTS: dict[str, dict[str, Any]] = {
    "numbers": dict(src_lang="en", tgt_lang="de", min_value=0, max_value=9999, split_seed=0, max_input_length=64,
                    max_target_length=64),
    "listops": dict(max_depth=6, max_args=5, min_length=32, max_length=128, num_train=20000, num_validation=1000,
                    num_test=1000, seed=0),
    "bible": dict(src="lsg", tgt="web", books=(), max_input_length=128, max_target_length=128, **SPM),
    "sentiment": dict(split_seed=0, limit=0, max_length=64, **SPM),
    "digits": dict(split_seed=0),
}
TASKS: tuple[str, ...] = (*DEFAULTS, "tfds:<name>")
TASK_KINDS: dict[str, str] = {"numbers": "translation", "listops": "classification", "bible": "translation",
                              "sentiment": "classification", "digits": "classification"}
_POSITIVE = ("max_input_length", "max_target_length", "max_depth", "min_length", "max_length", "num_train",
             "num_validation", "num_test", "vocab_size", "spm_max_texts")
_NON_NEGATIVE = ("split_seed", "seed", "limit")  # seeds of numpy's default_rng; limit 0 means all
_INTEGER = ("min_value", "max_value", "max_args")
DIGITS_IMAGES, DIGITS_LENGTH = 1797, 64  # scikit-learn's load_digits: a fixed set of 8x8 images
BIBLE_BOOKS = 66


@dataclasses.dataclass(frozen=True)
class Task:
    """A prepared task: its vocab, sizes, and batch datasets per split.

    Attributes:
      name: a task name from TASKS, or 'tfds:<catalog name>'.
      kind: 'translation' (inputs/targets sequences) or 'classification'
        (inputs sequence, int label, row mask).
      vocab: the vocab built from the train split (shared by both sides of a
        translation task): characters or words for the synthetic tasks, a
        SentencePiece model for natural language.
      num_classes: label count for classification, None for translation.
      max_input_length: longest input in tokens (eos included for translation).
      max_target_length: longest target (eos included); None for
        classification.
      sources: split -> decoded TFDS records, in prepared order (held in
        memory for the bundled tasks, which are small; random access into the
        array_record files for catalog datasets).
    """

    name: str
    kind: Literal["translation", "classification"]
    vocab: Vocab
    num_classes: int | None
    max_input_length: int
    max_target_length: int | None
    sources: dict[str, Any] = dataclasses.field(repr=False)

    def num_examples(self, split: str) -> int:
        """Number of examples in `split`."""
        return len(self._source(split))

    def dataset(self, split: str, batch_size: int, *, train: bool, seed: int = 0,
                shard: tuple[int, int] = (0, 1)) -> grain.MapDataset:
        """Batches of `split`, padded to bucketed lengths.

        Args:
          split: 'train', 'validation' or 'test'.
          batch_size: rows per batch (fixed, fill rows included).
          train: True: shuffled with `seed`, repeated forever, partial batches
            dropped, so `ds[step]` is the batch of a training step. False: one
            ordered pass; the last batch is topped up with all-pad rows
            (classification also marks them with mask 0).
          seed: shuffle seed, used when `train`.
          shard: (process index, process count): this process's rows of each
            batch only (multi-host data parallel, see pipeline.batched).

        Returns:
          A grain MapDataset of dicts of numpy arrays.
        """
        rows = batch_size // shard[1]  # this process's rows of every global batch
        input_buckets = pipeline.bucket_lengths(self.max_input_length)
        if self.kind == "translation":
            encode = pipeline.encode_translation(self.vocab, self.max_input_length, self.max_target_length)
            collate = pipeline.collate_translation(
                rows, input_buckets, pipeline.bucket_lengths(self.max_target_length)
            )
        else:
            encode = pipeline.encode_classification(self.vocab, self.max_input_length)
            collate = pipeline.collate_classification(rows, input_buckets)
        return pipeline.batched(self._source(split), encode, collate, batch_size, train=train, seed=seed,
                                shard=shard)

    def references(self, split: str) -> list[str] | list[int]:
        """What the eval pass should predict, in dataset order.

        Returns:
          Target strings (untruncated) for translation, to score BLEU or exact
          match against decoded outputs; int labels for classification.
        """
        source = self._source(split)
        records = (source[i] for i in range(len(source)))
        if self.kind == "translation":
            return [pipeline.as_text(r["target"]) for r in records]
        return [int(r["label"]) for r in records]

    def decode(self, ids) -> str:
        """Text of token ids (stops at eos, skips pad and bos)."""
        return self.vocab.decode(ids)

    def _source(self, split: str):
        if split not in self.sources:
            raise ValueError(f"unknown split {split!r}; choose one of: {', '.join(self.sources)}")
        return self.sources[split]


def task_kind(cfg: Any) -> str:
    """'translation' or 'classification' for a task config (a catalog dataset says which in ``task.kind``)."""
    name = _get(cfg, "name", None)
    return catalog.options(cfg)["kind"] if catalog.is_catalog(name) else TASK_KINDS[name]


def task_options(cfg: Any) -> dict[str, Any]:
    """The task's options: defaults overridden by what ``cfg`` (a ConfigDict, object or mapping) sets."""
    name = _get(cfg, "name", None)
    if catalog.is_catalog(name):
        return catalog.options(cfg)
    if name not in DEFAULTS:
        raise ValueError(f"unknown task.name {name!r}; choose one of: {', '.join(TASKS)}")
    return {k: _get(cfg, k, v) for k, v in DEFAULTS[name].items()}


def validate_task_config(cfg: Any) -> None:
    """Checks a task config without preparing any data; raises a one-line ValueError naming the bad key."""
    opts = task_options(cfg)
    for keys, test, allowed in ((_POSITIVE, lambda v: v > 0, "a positive integer"),
                                (_NON_NEGATIVE, lambda v: v >= 0, "an integer >= 0"),
                                (_INTEGER, lambda v: True, "an integer")):
        for key in keys:
            if key in opts and not (_is_int(opts[key]) and test(opts[key])):
                raise ValueError(f"task.{key} must be {allowed}, got {opts[key]!r}")
    if "spm_model_type" in opts and opts["spm_model_type"] not in spm.MODEL_TYPES:
        raise ValueError(f"task.spm_model_type={opts['spm_model_type']!r} is not one of {spm.MODEL_TYPES}")
    name = _get(cfg, "name", None)
    if catalog.is_catalog(name):
        catalog.check(name, opts)
        return
    checks = {"numbers": _check_numbers, "listops": _check_listops, "bible": _check_bible,
              "sentiment": _check_sentiment, "digits": _check_digits}
    checks[name](opts)


def _check_numbers(opts: dict[str, Any]) -> None:
    for key in ("src_lang", "tgt_lang"):
        if opts[key] not in CONVERTER_CLASSES:
            raise ValueError(f"task.{key}={opts[key]!r} is not a num2words language")
    if opts["max_value"] - opts["min_value"] < 9:
        raise ValueError(
            f"task.max_value={opts['max_value']!r} must be at least min_value+9 so every split gets integers")


def _check_listops(opts: dict[str, Any]) -> None:
    if opts["max_args"] < 2:
        raise ValueError(f"task.max_args must be >= 2, got {opts['max_args']!r}")
    if opts["min_length"] > opts["max_length"]:
        raise ValueError(f"task.min_length={opts['min_length']} exceeds max_length={opts['max_length']}")
    if opts["max_length"] < 4:
        raise ValueError(f"task.max_length must be >= 4, got {opts['max_length']}")
    reach = listops.max_tokens(opts["max_depth"], opts["max_args"])
    if reach < opts["min_length"]:
        raise ValueError(f"task.min_length={opts['min_length']} is unreachable with max_depth={opts['max_depth']} "
                         f"and max_args={opts['max_args']} (at most {reach} tokens)")


def _check_bible(opts: dict[str, Any]) -> None:
    for key in ("src", "tgt"):
        if opts[key] not in bible.TRANSLATIONS:
            raise ValueError(f"task.{key}={opts[key]!r} is not a public-domain translation; choose one of: "
                             f"{', '.join(bible.TRANSLATIONS)}")
    if opts["src"] == opts["tgt"]:
        raise ValueError(f"task.src and task.tgt are both {opts['src']!r}")
    _check_books(opts["books"])
    bible.database_path()  # the optional package is installed (else one line naming the extra)


def _check_books(books: Any) -> None:
    """``task.books``: empty (all) or book numbers covering every split, so no split is empty."""
    if not isinstance(books, (tuple, list)) or not all(_is_int(b) and 1 <= b <= BIBLE_BOOKS for b in books):
        raise ValueError(f"task.books={books!r} must be a tuple of book numbers 1..{BIBLE_BOOKS} (empty: all)")
    held_out = {"validation": bible.VALIDATION_BOOKS, "test": bible.TEST_BOOKS}
    for split in ("train", "validation", "test") if books else ():
        if not any(bible.split_of(b) == split for b in books):
            which = ", ".join(map(str, held_out[split])) if split in held_out else "any other book"
            raise ValueError(f"task.books={tuple(books)!r} has no {split} book, so its {split} split would be "
                             f"empty; add one of: {which}")


def _check_sentiment(opts: dict[str, Any]) -> None:
    sentiment.csv_path()


def _check_digits(opts: dict[str, Any]) -> None:
    digits.check_installed()


# The TFDS builder and config of each bundled task: its folder under data_dir is derived from them.
_BUILDERS: dict[str, Any] = {
    "numbers": lambda o: (numbers.Numbers, numbers.numbers_config(
        **{k: o[k] for k in ("src_lang", "tgt_lang", "min_value", "max_value", "split_seed")})),
    "listops": lambda o: (listops.Listops, listops.listops_config(**o)),
    "bible": lambda o: (bible.Bible, bible.bible_config(o["src"], o["tgt"], tuple(o["books"]))),
    "sentiment": lambda o: (sentiment.Sentiment, sentiment.sentiment_config(o["split_seed"], o["limit"])),
    "digits": lambda o: (digits.Digits, digits.digits_config(o["split_seed"])),
}


def is_prepared(cfg: Any, data_dir: str | None = None) -> bool:
    """Whether the task's data is already prepared in ``data_dir`` (nothing is written or downloaded)."""
    name, data_dir = _get(cfg, "name", None), builders.resolve_data_dir(data_dir)
    if catalog.is_catalog(name):
        return catalog.builder_for(name, data_dir).is_prepared()
    return builders.is_prepared(*_BUILDERS[name](task_options(cfg)), data_dir)


def sequence_lengths(cfg: Any) -> tuple[int, int | None]:
    """``(max_input_length, max_target_length or None)`` exactly as the loaded :class:`Task` will report them,
    known from the config alone (no data is read)."""
    name, opts = _get(cfg, "name", None), task_options(cfg)
    if name == "digits":
        return DIGITS_LENGTH, None
    if "max_input_length" not in opts:  # listops and sentiment: one length for their single sequence
        return opts["max_length"], None
    translation = task_kind(cfg) == "translation"
    return opts["max_input_length"], opts["max_target_length"] if translation else None


# Training-split sizes known from the options alone (an upper bound for sentiment's limit, which may exceed the
# distinct tweets). Only preparing tells the others: bible (aligned non-empty verses of the chosen books, counted from
# the database), sentiment without a limit (distinct tweets) and TFDS catalog datasets (sizes come with the data).
_TRAIN_SIZES: dict[str, Any] = {
    "numbers": lambda o: (o["max_value"] - o["min_value"] + 1) * numbers.NumbersConfig.train_percent // 100,
    "listops": lambda o: o["num_train"],
    "digits": lambda o: DIGITS_IMAGES * 8 // 10,
    "sentiment": lambda o: o["limit"] * 8 // 10 if o["limit"] else None,
}


def max_train_examples(cfg: Any) -> int | None:
    """An upper bound on the training split's size known before preparation, or None where only preparing tells."""
    size = _TRAIN_SIZES.get(_get(cfg, "name", None))
    return size(task_options(cfg)) if size else None


def load_task(cfg: Any, data_dir: str | None = None) -> Task:
    """Prepares (first time only) and loads a task.

    Args:
      cfg: the task config (``cfg.name`` plus options, see DEFAULTS).
      data_dir: where prepared data lives; defaults to $ATTN_LAB_DATA_DIR, then
        ~/.cache/attn_lab/tensorflow_datasets.

    Returns:
      The Task.
    """
    validate_task_config(cfg)
    opts = task_options(cfg)
    name = _get(cfg, "name", None)
    data_dir = builders.resolve_data_dir(data_dir)
    if catalog.is_catalog(name):
        return Task(**catalog.load(name, opts, data_dir))
    loaders = {"numbers": _load_numbers, "listops": _load_listops, "bible": _load_bible,
               "sentiment": _load_sentiment, "digits": _load_digits}
    return loaders[name](opts, data_dir)


def _load_numbers(opts: dict[str, Any], data_dir: str) -> Task:
    builder = builders.prepare(*_BUILDERS["numbers"](opts), data_dir)
    return Task("numbers", "translation", _vocab(builder, "char"), None, opts["max_input_length"],
                opts["max_target_length"], _in_memory(builder))


def _load_listops(opts: dict[str, Any], data_dir: str) -> Task:
    builder = builders.prepare(*_BUILDERS["listops"](opts), data_dir)
    return Task("listops", "classification", _vocab(builder, "word"), 10, opts["max_length"], None,
                _in_memory(builder))


def _load_bible(opts: dict[str, Any], data_dir: str) -> Task:
    builder = builders.prepare(*_BUILDERS["bible"](opts), data_dir)
    sources = _in_memory(builder)
    texts = [pipeline.as_text(r[k]) for r in sources["train"] for k in ("source", "target")]
    vocab = spm.load_or_train(builder.data_dir, texts, opts["vocab_size"], opts["spm_model_type"])
    return Task("bible", "translation", vocab, None, opts["max_input_length"], opts["max_target_length"], sources)


def _load_sentiment(opts: dict[str, Any], data_dir: str) -> Task:
    builder = builders.prepare(*_BUILDERS["sentiment"](opts), data_dir)
    sources = _in_memory(builder)
    texts = [pipeline.as_text(r["source"]) for r in sources["train"]]
    vocab = spm.load_or_train(builder.data_dir, texts, opts["vocab_size"], opts["spm_model_type"])
    return Task("sentiment", "classification", vocab, len(sentiment.LABELS), opts["max_length"], None, sources)


def _load_digits(opts: dict[str, Any], data_dir: str) -> Task:
    builder = builders.prepare(*_BUILDERS["digits"](opts), data_dir)
    return Task("digits", "classification", _vocab(builder, "word"), 10, DIGITS_LENGTH, None, _in_memory(builder))


def _in_memory(builder: tfds.core.DatasetBuilder) -> dict[str, list[dict]]:
    """Reads every split into memory, in the prepared order.

    The tasks hold at most tens of thousands of short strings, and a list
    lookup is ~100x cheaper than decoding an array_record entry, which would
    otherwise dominate the cost of a training batch.
    """
    return {split: list(source.__getitems__(range(len(source)))) for split, source in builder.as_data_source().items()}


def _vocab(builder: tfds.core.DatasetBuilder, level: str) -> Vocab:
    """The vocab saved at prepare time (rebuilt from train if it went missing)."""
    path = builders.vocab_path(builder)
    if os.path.exists(path):
        return Vocab.load(path)
    train = builder.as_data_source()["train"]
    texts = []
    for i in range(len(train)):
        record = train[i]
        texts.append(pipeline.as_text(record["source"]))
        if "target" in record:
            texts.append(pipeline.as_text(record["target"]))
    vocab = Vocab.build(texts, level)
    vocab.save(path)
    return vocab


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _get(cfg: Any, key: str, default: Any) -> Any:
    """Reads an option from a ConfigDict, plain object or mapping."""
    try:
        return getattr(cfg, key)
    except AttributeError:
        pass
    if hasattr(cfg, "get"):
        return cfg.get(key, default)
    return default
