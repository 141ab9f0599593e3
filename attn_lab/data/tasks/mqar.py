"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology", arXiv 2312.04927, Section 3), a language
modelling task on which attention and efficient token mixers differ sharply at small scale.

One sequence of ``seq_len`` tokens lists ``num_kv_pairs`` key-value pairs ``k1 v1 k2 v2 ...``, then queries every
key once: key j sits at ``2 N + 2 g_j``, its gap slot ``g_j`` drawn without replacement from ``0 .. (L - 2N)/2 - 1``
with probability proportional to ``(g + 1)^(power_a - 1)`` (a power law: most queries come soon after the
context). The model must predict the paired value at the position of each query key; only those positions are
scored (targets are the pad id elsewhere), so accuracy is recall. Everything else is filler: a blank token, or
with ``random_non_queries`` uniform random tokens. This follows HazyResearch/zoology's
``zoology/data/multiquery_ar.py`` (keys from the first half of the vocabulary, values from the second, both drawn
without replacement per example; inputs and labels shifted so the label at a query position is its value).

Ids: 0-3 are the lab's pad / bos / eos / unk, 4 is the blank filler (zoology's 0), then the keys, then the values:
``vocab_size`` counts all of them, so ``(vocab_size - 5) // 2`` keys and the rest values. Zoology uses 8,192;
a CPU-sized run uses a few hundred. Each split has its own random stream from ``seed`` (train, validation and test
never share one), so the data are deterministic.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from attn_lab.data import builders
from attn_lab.data.tasks import Task, TaskSpec, register
from attn_lab.data.tokenizers import PAD_ID, SPECIAL_TOKENS, Vocab

DEFAULTS = dict(vocab_size=256, seq_len=64, num_kv_pairs=4, power_a=0.01, random_non_queries=False,
                num_train=20000, num_validation=1000, num_test=1000, seed=0)
SPLITS, split_rng = builders.SPLITS, builders.split_rng
BLANK = len(SPECIAL_TOKENS)  # 4: the filler token (zoology's 0)
FIRST_KEY = BLANK + 1


def id_ranges(vocab_size: int) -> tuple[range, range]:
    """The key ids and the value ids of a vocabulary of ``vocab_size``."""
    keys = (vocab_size - FIRST_KEY) // 2
    return range(FIRST_KEY, FIRST_KEY + keys), range(FIRST_KEY + keys, vocab_size)


def gap_probabilities(space: int, power_a: float) -> np.ndarray:
    """``p(g) ~ a (g + 1)^(a - 1)`` over the ``space`` query slots after the context (zoology's power law)."""
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    return p / p.sum()


def mqar_example(rng: np.random.Generator, *, vocab_size: int, seq_len: int, num_kv_pairs: int, power_a: float,
                 random_non_queries: bool) -> tuple[np.ndarray, np.ndarray]:
    """One sequence: ``(inputs [L], targets [L])``, targets the value at each query position and pad elsewhere."""
    keys_range, values_range = id_ranges(vocab_size)
    n = num_kv_pairs
    keys = rng.choice(np.asarray(keys_range), n, replace=False)  # (N,)
    values = rng.choice(np.asarray(values_range), n, replace=False)  # (N,)
    context = np.empty(2 * n, np.int32)
    context[0::2], context[1::2] = keys, values
    space = (seq_len - 2 * n) // 2
    gaps = rng.choice(space, n, replace=False, p=gap_probabilities(space, power_a))  # (N,) query slots
    inputs = np.full(seq_len, BLANK, np.int32)
    inputs[: 2 * n] = context
    if random_non_queries:
        inputs[2 * n:] = rng.integers(BLANK, vocab_size, seq_len - 2 * n)
    targets = np.full(seq_len, PAD_ID, np.int32)
    inputs[2 * n + 2 * gaps] = keys  # the query key ...
    targets[2 * n + 2 * gaps] = values  # ... is answered at its own position (the next-token target)
    return inputs, targets


def recall_by_pair(inputs: np.ndarray, targets: np.ndarray, predicted: np.ndarray, num_kv_pairs: int) -> np.ndarray:
    """Recall of the j-th listed pair, per j: ``inputs``, ``targets``, ``predicted`` ``[B, L]`` ids -> ``[N]``, the
    share of sequences whose query of the key listed j-th is answered with its value. Why: a 2-layer model recalls
    by copying each key into its value's position with a position-specific first layer, so a circuit that formed
    for some positions only shows as pairs at ~1.0 beside pairs at chance among the ones it confuses."""
    n = num_kv_pairs
    keys = inputs[:, 0 : 2 * n : 2]  # (B, N) the listed keys, in order
    scored = targets != PAD_ID  # (B, L) the query positions
    asks = (inputs[:, None, :] == keys[:, :, None]) & scored[:, None, :]  # (B, N, L) where key j is queried
    correct = (predicted == targets) & scored  # (B, L)
    return (asks & correct[:, None, :]).any(-1).mean(0)  # (N,)


@dataclasses.dataclass(eq=False)
class MqarConfig(tfds.core.BuilderConfig):
    """Generation parameters; build with :func:`mqar_config` so the name matches."""

    vocab_size: int = DEFAULTS["vocab_size"]
    seq_len: int = DEFAULTS["seq_len"]
    num_kv_pairs: int = DEFAULTS["num_kv_pairs"]
    power_a: float = DEFAULTS["power_a"]
    random_non_queries: bool = DEFAULTS["random_non_queries"]
    num_train: int = DEFAULTS["num_train"]
    num_validation: int = DEFAULTS["num_validation"]
    num_test: int = DEFAULTS["num_test"]
    seed: int = DEFAULTS["seed"]


def mqar_config(**opts: Any) -> MqarConfig:
    """A config whose name encodes every option (the prepared folder: equal options share it)."""
    name = (f"v{opts['vocab_size']}_L{opts['seq_len']}_N{opts['num_kv_pairs']}_a{opts['power_a']:g}"
            f"_rand{int(opts['random_non_queries'])}_n{opts['num_train']}-{opts['num_validation']}-{opts['num_test']}"
            f"_seed{opts['seed']}")
    return MqarConfig(name=name, **opts)


class Mqar(builders.SyntheticBuilder, skip_registration=True):
    """MQAR sequences as ``inputs`` / ``targets`` id sequences (no text: the ids are the tokens)."""

    name = "mqar"
    BUILDER_CONFIGS = [mqar_config(**DEFAULTS)]  # noqa: RUF012
    FEATURES = {"inputs": tfds.features.Sequence(np.int32), "targets": tfds.features.Sequence(np.int32)}
    SUPERVISED_KEYS = ("inputs", "targets")

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        c = self.builder_config
        sizes = dict(zip(SPLITS, (c.num_train, c.num_validation, c.num_test)))
        options = dict(vocab_size=c.vocab_size, seq_len=c.seq_len, num_kv_pairs=c.num_kv_pairs, power_a=c.power_a,
                       random_non_queries=c.random_non_queries)
        return {split: self._generate_examples(split_rng(c.seed, split), size, options)
                for split, size in sizes.items()}

    def _generate_examples(self, rng, size, options):
        for i in range(size):
            inputs, targets = mqar_example(rng, **options)
            yield i, {"inputs": inputs, "targets": targets}


def vocab(vocab_size: int) -> Vocab:
    """Named tokens for reading examples: ``_`` the blank, ``k<i>`` keys, ``v<i>`` values."""
    keys, values = id_ranges(vocab_size)
    return Vocab(SPECIAL_TOKENS + ("_",) + tuple(f"k{i}" for i in range(len(keys)))
                 + tuple(f"v{i}" for i in range(len(values))), "word")


def check(opts: dict[str, Any]) -> None:
    """The pairs and their queries fit in ``seq_len``, the vocabulary holds N distinct keys and values, the power
    law is defined."""
    n, length, size = opts["num_kv_pairs"], opts["seq_len"], opts["vocab_size"]
    if 4 * n > length:
        raise ValueError(f"task.seq_len={length} cannot hold num_kv_pairs={n}: the {n} pairs take {2 * n} tokens "
                         f"and their {n} queries need {2 * n} more (seq_len >= 4 * num_kv_pairs = {4 * n})")
    keys, values = id_ranges(size)
    if min(len(keys), len(values)) < n:
        raise ValueError(f"task.vocab_size={size} is too small for num_kv_pairs={n}: it holds {len(keys)} keys and "
                         f"{len(values)} values after the {FIRST_KEY} reserved ids (need vocab_size >= "
                         f"{FIRST_KEY + 2 * n})")
    if not (isinstance(opts["power_a"], (int, float)) and not isinstance(opts["power_a"], bool)
            and opts["power_a"] > 0):
        raise ValueError(f"task.power_a must be a positive number (zoology: 0.01), got {opts['power_a']!r}")
    if not isinstance(opts["random_non_queries"], bool):
        raise ValueError(f"task.random_non_queries must be True or False, got {opts['random_non_queries']!r}")


def tfds_builder(opts: dict[str, Any]) -> tuple[type[Mqar], MqarConfig]:
    return Mqar, mqar_config(**opts)


def load(opts: dict[str, Any], data_dir: str) -> Task:
    """Ids as tokens; rows of exactly ``seq_len`` positions, ``num_kv_pairs`` of them scored."""
    prepared = builders.prepare(*tfds_builder(opts), data_dir)
    return Task("mqar", "lm", vocab(opts["vocab_size"]), None, opts["seq_len"], None, builders.in_memory(prepared))


register(TaskSpec("mqar", "lm", DEFAULTS, load, builder=tfds_builder, check=check,
                  train_size=lambda opts: opts["num_train"], sequence_lengths=lambda opts: (opts["seq_len"], None)))
