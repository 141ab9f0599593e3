"""SentencePiece subword vocabularies for the natural-language tasks (as in Flax's WMT example).

The model is trained offline on the task's training split the first time it is needed and cached beside the
prepared data (``<dataset dir>/spm_<type>_<size>.model``, written atomically), so every later run -- and every trial
of a sweep -- reuses the same pieces. Ids 0..3 are pad, bos, eos and unk, as in :mod:`attn_lab.data.tokenizers`.
"""

from __future__ import annotations

import io
import os
import pathlib
from typing import Iterable, Sequence

import sentencepiece as sentencepiece_lib

from attn_lab.data.tokenizers import BOS_ID, EOS_ID, PAD_ID, UNK_ID, content_ids
from attn_lab.io import write_bytes_atomic

MODEL_TYPES = ("unigram", "bpe")


class SpmVocab:
    """A trained SentencePiece model behind the :class:`~attn_lab.data.tokenizers.Vocab` interface."""

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def __init__(self, model_proto: bytes):
        self._sp = sentencepiece_lib.SentencePieceProcessor(model_proto=model_proto)

    @property
    def size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` (no bos/eos: the pipeline adds those)."""
        return self._sp.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, stopping at eos and skipping pad and bos."""
        return self._sp.decode(content_ids(ids))


def model_path(dataset_dir: str, model_type: str, vocab_size: int) -> pathlib.Path:
    return pathlib.Path(dataset_dir, f"spm_{model_type}_{vocab_size}.model")


def load_or_train(dataset_dir: str, texts: Iterable[str], vocab_size: int, model_type: str = "unigram") -> SpmVocab:
    """The cached model for (type, size) in ``dataset_dir``, trained on ``texts`` (the train split) if missing.

    ``vocab_size`` is an upper bound (``hard_vocab_limit=False``): a small corpus gets fewer pieces, not an error.
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(f"task.spm_model_type={model_type!r} is not one of {MODEL_TYPES}")
    path = model_path(dataset_dir, model_type, vocab_size)
    if not path.exists():
        proto = io.BytesIO()
        sentencepiece_lib.SentencePieceTrainer.train(
            sentence_iterator=iter(t for t in texts if t.strip()), model_writer=proto, vocab_size=vocab_size,
            model_type=model_type, character_coverage=1.0, hard_vocab_limit=False, pad_id=PAD_ID, bos_id=BOS_ID,
            eos_id=EOS_ID, unk_id=UNK_ID, input_sentence_size=200_000, shuffle_input_sentence=True,
            num_threads=os.cpu_count() or 1, minloglevel=2)
        write_bytes_atomic(path, proto.getvalue())
    return SpmVocab(path.read_bytes())
