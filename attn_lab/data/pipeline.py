"""Grain input pipelines: tokenize, batch, and pad to a few bucketed lengths.

Everything stays a `grain.MapDataset`, so the training batch for step s is
simply `ds[s]`: a resumed run asks for the step it stopped at and gets the
exact batch it would have seen, with no iterator state to checkpoint.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable, Mapping, Sequence

import grain
import numpy as np

from attn_lab.data.tokenizers import BOS_ID, EOS_ID, PAD_ID, Vocab

Example = Mapping[str, Any]
Batch = dict[str, np.ndarray]


def bucket_lengths(max_length: int, min_bucket: int = 8) -> tuple[int, ...]:
    """Padded lengths a batch may take, so a jitted step compiles few times.

    Args:
      max_length: the longest sequence the task allows.
      min_bucket: the smallest bucket.

    Returns:
      Powers of two from `min_bucket` and the midpoints between them (8, 12, 16, 24, 32, 48, ...) below
      `max_length`, then `max_length` rounded up to a multiple of `min_bucket`. Two buckets per octave keep the
      padding waste under a third while bounding compilations to about 2 * log2(max_length / min_bucket).
    """
    if max_length < 1:
        raise ValueError(f"max_length must be positive, got {max_length}")
    last = -(-max_length // min_bucket) * min_bucket
    buckets = []
    b = min_bucket
    while b < last:
        buckets.append(b)
        if b * 3 // 2 < last:
            buckets.append(b * 3 // 2)
        b *= 2
    return tuple(buckets) + (last,)


def pad_to_bucket(seqs: Sequence[Sequence[int]], buckets: Sequence[int], rows: int) -> np.ndarray:
    """Stacks sequences into an int32 array padded with PAD_ID.

    Args:
      seqs: token id sequences, none longer than the last bucket.
      buckets: allowed lengths, ascending.
      rows: batch size; rows past len(seqs) are all padding (fill rows).

    Returns:
      [rows, L] int32, where L is the smallest bucket >= the longest sequence.
    """
    longest = max((len(s) for s in seqs), default=1)
    i = bisect.bisect_left(buckets, longest)
    if i == len(buckets):
        raise ValueError(f"sequence of length {longest} exceeds the last bucket {buckets[-1]}")
    out = np.full((rows, buckets[i]), PAD_ID, dtype=np.int32)
    for r, s in enumerate(seqs):
        out[r, : len(s)] = s
    return out


def encode_translation(vocab: Vocab, max_input_length: int, max_target_length: int) -> Callable[[Example], dict]:
    """Returns a map fn: record -> source and target ids, each ending in eos.

    Overlong sequences are cut so that eos still ends them, since the model
    learns to stop from eos.
    """

    def encode(example: Example) -> dict[str, list[int]]:
        src = vocab.encode(as_text(example["source"]))[: max_input_length - 1]
        tgt = vocab.encode(as_text(example["target"]))[: max_target_length - 1]
        return {"inputs": src + [EOS_ID], "targets": tgt + [EOS_ID]}

    return encode


def encode_classification(vocab: Vocab, max_length: int) -> Callable[[Example], dict]:
    """Returns a map fn: record -> input ids (cut to max_length) and label."""

    def encode(example: Example) -> dict[str, Any]:
        return {"inputs": vocab.encode(as_text(example["source"]))[:max_length], "label": int(example["label"])}

    return encode


def collate_translation(
    batch_size: int, input_buckets: Sequence[int], target_buckets: Sequence[int]
) -> Callable[[Sequence[dict]], Batch]:
    """Returns a batch fn padding inputs and targets to their own buckets.

    Fill rows (in a last partial eval batch) are all pad, so a loss weighted
    by `targets != 0` ignores them.
    """

    def collate(examples: Sequence[dict]) -> Batch:
        return {
            "inputs": pad_to_bucket([e["inputs"] for e in examples], input_buckets, batch_size),
            "targets": pad_to_bucket([e["targets"] for e in examples], target_buckets, batch_size),
        }

    return collate


def collate_classification(batch_size: int, input_buckets: Sequence[int]) -> Callable[[Sequence[dict]], Batch]:
    """Returns a batch fn adding int32 `targets` and a float32 row `mask`."""

    def collate(examples: Sequence[dict]) -> Batch:
        n = len(examples)
        targets = np.zeros(batch_size, dtype=np.int32)
        targets[:n] = [e["label"] for e in examples]
        mask = np.zeros(batch_size, dtype=np.float32)
        mask[:n] = 1.0
        return {
            "inputs": pad_to_bucket([e["inputs"] for e in examples], input_buckets, batch_size),
            "targets": targets,
            "mask": mask,
        }

    return collate


def encode_lm(vocab: Vocab, max_length: int) -> Callable[[Example], dict]:
    """Returns a map fn for a language-model record: next-token ``inputs`` and ``targets`` of equal length.

    A record with ``inputs`` and ``targets`` id sequences (a synthetic task such as MQAR, whose targets hold the pad
    id where a position is not scored) is taken as it is, cut to ``max_length``. A record with ``text`` becomes
    ``[bos] + ids`` -> ``ids + [eos]``: every token is predicted from the ones before it, the first from bos; an
    overlong text is cut so the pair still has ``max_length`` positions.
    """

    def encode(example: Example) -> dict[str, list[int]]:
        if "text" not in example:
            return {"inputs": list(example["inputs"])[:max_length], "targets": list(example["targets"])[:max_length]}
        ids = [BOS_ID, *vocab.encode(as_text(example["text"])), EOS_ID][: max_length + 1]
        return {"inputs": ids[:-1], "targets": ids[1:]}

    return encode


def collate_lm(batch_size: int, buckets: Sequence[int]) -> Callable[[Sequence[dict]], Batch]:
    """Returns a batch fn padding ``inputs`` and ``targets`` to one common bucket (fill rows are all pad, so their
    targets weigh nothing)."""

    def collate(examples: Sequence[dict]) -> Batch:
        longest = max((len(e["inputs"]) for e in examples), default=1)
        lengths = [b for b in buckets if b >= longest][:1]
        return {key: pad_to_bucket([e[key] for e in examples], lengths or buckets, batch_size)
                for key in ("inputs", "targets")}

    return collate


def batched(
    source: Sequence[Example],
    encode: Callable[[Example], dict],
    collate: Callable[[Sequence[dict]], Batch],
    batch_size: int,
    *,
    train: bool,
    seed: int = 0,
    shard: tuple[int, int] = (0, 1),
) -> grain.MapDataset:
    """Builds the batch dataset over a random-access source.

    Args:
      source: records with random access (e.g. a TFDS array_record source).
      encode: record -> token ids.
      collate: list of encoded records -> padded batch (fill rows included)
        of `batch_size // shard[1]` rows.
      batch_size: rows per global batch.
      train: True shuffles with `seed` (a fresh order each epoch), repeats
        forever and drops partial batches; False makes one ordered pass whose
        last batch is topped up with fill rows.
      seed: shuffle seed (train only).
      shard: (process index, process count). Process p reads, encodes and
        pads only rows [p * b, (p + 1) * b) of every global batch, b =
        batch_size / count, so each host of a multi-host run touches only its
        own records; the hosts' pieces, stacked, are the one-process batch
        (after padding to the longest piece, see DataParallel.batch).

    Returns:
      A MapDataset of this process's batches; `ds[s]` is its part of batch s.
    """
    index, count = shard
    if batch_size < 1 or batch_size % count:
        raise ValueError(f"batch_size={batch_size} must be positive and divisible by the {count} processes")
    ds = grain.MapDataset.source(source)
    if train:
        if len(source) < batch_size:
            raise ValueError(f"batch_size={batch_size} exceeds the {len(source)} training examples")
        ds = ds.shuffle(seed=seed).repeat(None).map(encode)
    else:  # whole global batches: indices past the end are fill rows ({}), so every host has a last batch
        n, encoded = len(source), ds.map(encode)
        ds = grain.MapDataset.range(-(-n // batch_size) * batch_size).map(lambda i: encoded[i] if i < n else {})
    ds = ds.batch(batch_size // count, drop_remainder=train, batch_fn=lambda rows: collate([r for r in rows if r]))
    return ds[index::count] if count > 1 else ds


def as_text(value: Any) -> str:
    """Text of a TFDS text feature (bytes from a data source)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
