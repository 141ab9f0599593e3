"""A tiny vocabulary for character- and word-level tokenization.

The vocabularies in this project are small (tens of symbols), so a plain
token list is enough; a subword model would only add a dependency.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Iterable, Literal, Sequence

Level = Literal["char", "word"]

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
VOCAB_FILENAME = "vocab.json"


@dataclasses.dataclass(frozen=True)
class Vocab:
    """Maps tokens to ids; ids 0..3 are pad, bos, eos, unk.

    Attributes:
      tokens: all tokens by id, the four special tokens first.
      level: 'char' splits text into characters, 'word' on whitespace.
    """

    tokens: tuple[str, ...]
    level: Level

    def __post_init__(self):
        if self.level not in ("char", "word"):
            raise ValueError(f"vocab level must be 'char' or 'word', got {self.level!r}")
        if tuple(self.tokens[:4]) != SPECIAL_TOKENS:
            raise ValueError(f"vocab must start with {SPECIAL_TOKENS}")
        # A frozen dataclass still lets us cache the reverse map once.
        object.__setattr__(self, "_ids", {t: i for i, t in enumerate(self.tokens)})

    pad_id = PAD_ID
    bos_id = BOS_ID
    eos_id = EOS_ID
    unk_id = UNK_ID

    @property
    def size(self) -> int:
        """Number of ids, special tokens included (the embedding table size)."""
        return len(self.tokens)

    @classmethod
    def build(cls, texts: Iterable[str], level: Level) -> "Vocab":
        """Builds a vocab from every token seen in `texts`.

        Args:
          texts: training texts; tokens absent here map to unk later, so pass
            only the train split to keep evaluation honest.
          level: 'char' or 'word'.

        Returns:
          A Vocab whose non-special tokens are sorted, so the ids do not depend
          on the order of `texts`.
        """
        counts = collections.Counter()
        for text in texts:
            counts.update(_split(text, level))
        for special in SPECIAL_TOKENS:
            counts.pop(special, None)
        return cls(SPECIAL_TOKENS + tuple(sorted(counts)), level)

    def encode(self, text: str) -> list[int]:
        """Returns the ids of `text` (no bos/eos: the pipeline adds those)."""
        ids = self._ids  # pytype: disable=attribute-error
        return [ids.get(t, UNK_ID) for t in _split(text, self.level)]

    def decode(self, ids: Sequence[int]) -> str:
        """Returns the text of `ids`, stopping at eos and skipping pad and bos."""
        out = [self.tokens[i] if 0 <= i < len(self.tokens) else "<unk>" for i in content_ids(ids)]
        return ("" if self.level == "char" else " ").join(out)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the vocab as JSON (atomically, so readers never see half)."""
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"level": self.level, "tokens": list(self.tokens)}, f, ensure_ascii=False, indent=0)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Vocab":
        """Reads a vocab written by `save`; a damaged file is one ValueError line naming it."""
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            return cls(tuple(data["tokens"]), data["level"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"vocabulary {path} cannot be read ({type(e).__name__}: {e}); delete it and it is "
                             "built again from the prepared training split") from None


def content_ids(ids: Sequence[int]) -> list[int]:
    """The ids a decoder turns into text: up to the first eos, without pad and bos."""
    out = []
    for i in map(int, ids):
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            out.append(i)
    return out


def _split(text: str, level: Level) -> list[str]:
    return list(text) if level == "char" else text.split()
