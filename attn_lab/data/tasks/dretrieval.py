"""D-retrieval: one position's answer combines D separate lookups, each an argmax over the sequence by its own
feature (the generalized D-retrieval target of "The Effect of Attention Head Count on Transformer Approximation",
arXiv 2510.06662: D features retrieved from different positions, combined at one read-out position).

A sequence holds ``seq_keys`` distinct keys drawn from ``num_keys``, in random order, each as one token holding the
key and its value (``k13=v2``; values uniform over ``num_values``, independent per position), then one read-out
token ``?``. Feature i ranks the keys by a fixed random order (the task's own, from ``seed``); lookup i is the
value of the present key that ranks highest in order i. At the read-out position only, the model predicts one
answer token: ``combine='tuple'`` names the D looked-up values in feature order (``=v2,v0``; V^D answers),
``combine='sum'`` gives their sum mod ``num_values`` (``=s2``; V answers) -- the paper's outer function F0 on the
retrieved features. Every other target is the pad id, as in MQAR.

Why the head count could decide it: one softmax head scores every key with one function and so selects where one
order peaks; the D orders are unrelated, so D sharp lookups need D scores -- h >= D heads. A single head can instead
average over the keys and let what follows decode the mixture. For a tuple answer that is easy: its logits can be a
sum of per-lookup scores, and an average of per-key scores carries such a sum -- measured at 17 positions and widths
16-64 (docs/head_count.md), one head does as well as two given the steps. A sum mod V is not a sum of per-lookup
scores, and one value alone says nothing of it (a model retrieving one lookup stays at chance), so with the paper's
FFN after attention, one head stays near chance where two solve (docs/head_count.md, the sharp task).

Ids: 0-3 are the lab's pad / bos / eos / unk, then the ``num_keys * num_values`` key=value tokens, the read-out
token, and the answer tokens. Each split has its own random stream from ``seed``.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from attn_lab.data import builders
from attn_lab.data.tasks import Task, TaskSpec, register
from attn_lab.data.tokenizers import PAD_ID, SPECIAL_TOKENS, Vocab

DEFAULTS = dict(num_keys=64, seq_keys=16, num_values=4, num_lookups=2, combine="tuple", num_train=20000,
                num_validation=1000, num_test=1000, seed=0)
COMBINE = ("tuple", "sum")  # the answer names the D values, or their sum mod num_values
SPLITS, split_rng = builders.SPLITS, builders.split_rng
FIRST_PAIR = len(SPECIAL_TOKENS)
MAX_VOCAB = 50_000  # the answer tokens grow as V^D: bound them before anything is built


def num_answers(num_values: int, num_lookups: int, combine: str) -> int:
    """V^D answers naming each value ('tuple'), or V sums ('sum')."""
    return num_values ** num_lookups if combine == "tuple" else num_values


def id_offsets(num_keys: int, num_values: int, num_lookups: int, combine: str = "tuple") -> tuple[int, int, int]:
    """The read-out id, the first answer id, and the vocabulary size."""
    readout = FIRST_PAIR + num_keys * num_values
    return readout, readout + 1, readout + 1 + num_answers(num_values, num_lookups, combine)


def feature_ranks(seed: int, num_keys: int, num_lookups: int) -> np.ndarray:
    """``[D, num_keys]``: each feature's rank of every key (a random order per feature, fixed by the task seed)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, len(SPLITS)]))  # a stream no split uses
    return np.stack([rng.permutation(num_keys) for _ in range(num_lookups)])


def example(rng: np.random.Generator, ranks: np.ndarray, *, num_keys: int, seq_keys: int, num_values: int,
            combine: str = "tuple") -> tuple[np.ndarray, np.ndarray]:
    """One sequence ``(inputs [K + 1], targets [K + 1])``: K key=value tokens then the read-out token; the answer
    is the last target, the pad id elsewhere."""
    readout, first_answer, _ = id_offsets(num_keys, num_values, len(ranks), combine)
    keys = rng.choice(num_keys, seq_keys, replace=False)  # (K,) distinct, in sequence order
    values = rng.integers(0, num_values, seq_keys)  # (K,)
    looked_up = values[np.argmax(ranks[:, keys], axis=1)]  # (D,) per feature, the value of its top key
    inputs = np.append(FIRST_PAIR + keys * num_values + values, readout).astype(np.int32)
    targets = np.full(seq_keys + 1, PAD_ID, np.int32)
    answer = (np.ravel_multi_index(looked_up, (num_values,) * len(ranks)) if combine == "tuple"
              else looked_up.sum() % num_values)
    targets[seq_keys] = first_answer + int(answer)
    return inputs, targets


@dataclasses.dataclass(eq=False)
class DRetrievalConfig(tfds.core.BuilderConfig):
    """Generation parameters; build with :func:`dretrieval_config` so the name matches."""

    num_keys: int = DEFAULTS["num_keys"]
    seq_keys: int = DEFAULTS["seq_keys"]
    num_values: int = DEFAULTS["num_values"]
    num_lookups: int = DEFAULTS["num_lookups"]
    combine: str = DEFAULTS["combine"]
    num_train: int = DEFAULTS["num_train"]
    num_validation: int = DEFAULTS["num_validation"]
    num_test: int = DEFAULTS["num_test"]
    seed: int = DEFAULTS["seed"]


def dretrieval_config(**opts: Any) -> DRetrievalConfig:
    """A config whose name encodes every option (the prepared folder: equal options share it)."""
    combine = "" if opts["combine"] == "tuple" else f"_{opts['combine']}"  # folders prepared before it keep their name
    name = (f"R{opts['num_keys']}_K{opts['seq_keys']}_V{opts['num_values']}_D{opts['num_lookups']}{combine}"
            f"_n{opts['num_train']}-{opts['num_validation']}-{opts['num_test']}_seed{opts['seed']}")
    return DRetrievalConfig(name=name, **opts)


class DRetrieval(builders.SyntheticBuilder, skip_registration=True):
    """D-retrieval sequences as ``inputs`` / ``targets`` id sequences (the ids are the tokens)."""

    name = "dretrieval"
    BUILDER_CONFIGS = [dretrieval_config(**DEFAULTS)]  # noqa: RUF012
    FEATURES = {"inputs": tfds.features.Sequence(np.int32), "targets": tfds.features.Sequence(np.int32)}
    SUPERVISED_KEYS = ("inputs", "targets")

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        c = self.builder_config
        sizes = dict(zip(SPLITS, (c.num_train, c.num_validation, c.num_test)))
        ranks = feature_ranks(c.seed, c.num_keys, c.num_lookups)
        options = dict(num_keys=c.num_keys, seq_keys=c.seq_keys, num_values=c.num_values, combine=c.combine)
        return {split: self._generate_examples(split_rng(c.seed, split), size, ranks, options)
                for split, size in sizes.items()}

    def _generate_examples(self, rng, size, ranks, options):
        for i in range(size):
            inputs, targets = example(rng, ranks, **options)
            yield i, {"inputs": inputs, "targets": targets}


def vocab(num_keys: int, num_values: int, num_lookups: int, combine: str = "tuple") -> Vocab:
    """Named tokens: ``k<i>=v<j>`` key=value entries, ``?`` the read-out, ``=v<i>,v<j>`` answers ('tuple') or
    ``=s<i>`` sums ('sum')."""
    pairs = tuple(f"k{k}=v{v}" for k in range(num_keys) for v in range(num_values))
    answers = (tuple("=" + ",".join(f"v{v}" for v in a)
                     for a in itertools.product(range(num_values), repeat=num_lookups)) if combine == "tuple"
               else tuple(f"=s{s}" for s in range(num_values)))
    return Vocab(SPECIAL_TOKENS + pairs + ("?",) + answers, "word")


def check(opts: dict[str, Any]) -> None:
    """A sequence's keys are distinct, and the answer tokens stay a vocabulary a model can hold."""
    for key in ("num_keys", "seq_keys", "num_values", "num_lookups"):
        if isinstance(opts[key], bool) or not isinstance(opts[key], int) or opts[key] < 1:
            raise ValueError(f"task.{key} must be a positive integer, got {opts[key]!r}")
    if opts["combine"] not in COMBINE:
        raise ValueError(f"task.combine={opts['combine']!r} is not a way to combine the lookups; use one of "
                         f"{', '.join(COMBINE)}")
    r, k, v, d = opts["num_keys"], opts["seq_keys"], opts["num_values"], opts["num_lookups"]
    if k > r:
        raise ValueError(f"task.seq_keys={k} exceeds task.num_keys={r}: a sequence holds distinct keys "
                         "(seq_keys <= num_keys)")
    size = id_offsets(r, v, d, opts["combine"])[2]
    if size > MAX_VOCAB:
        raise ValueError(f"task.num_lookups={d} with num_values={v} and num_keys={r} makes a vocabulary of {size} "
                         f"tokens ({v ** d} answers); at most {MAX_VOCAB}: lower num_values, num_lookups or num_keys")


def tfds_builder(opts: dict[str, Any]) -> tuple[type[DRetrieval], DRetrievalConfig]:
    return DRetrieval, dretrieval_config(**opts)


def load(opts: dict[str, Any], data_dir: str) -> Task:
    """Ids as tokens; rows of ``seq_keys + 1`` positions, the last one scored."""
    prepared = builders.prepare(*tfds_builder(opts), data_dir)
    return Task("dretrieval", "lm", vocab(opts["num_keys"], opts["num_values"], opts["num_lookups"], opts["combine"]),
                None,
                opts["seq_keys"] + 1, None, builders.in_memory(prepared))


register(TaskSpec("dretrieval", "lm", DEFAULTS, load, builder=tfds_builder, check=check,
                  train_size=lambda opts: opts["num_train"],
                  sequence_lengths=lambda opts: (opts["seq_keys"] + 1, None)))
