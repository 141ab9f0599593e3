"""ListOps (Nangia & Bowman 2018), as in the Long Range Arena benchmark.

Nested lists of digits under the operators MAX, MIN, MED (median) and SM
(sum mod 10); the label is the value of the expression, 0..9. Serialized like
LRA, without parentheses: '[MAX 4 3 [MIN 2 3 ] 1 0 ]'.

LRA's generator grows trees blindly and rejects those outside the length
range, which takes minutes for long sequences. Here each tree is grown to a
token budget drawn from the range, so nearly every sample is accepted. This
file holds the task whole: its options and defaults, checks, TFDS builder and
loader.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from attn_lab.data import builders
from attn_lab.data.tasks import Task, TaskSpec, register

# The task's options and their defaults (config files start from these); every one shapes the generated data.
DEFAULTS = dict(max_depth=6, max_args=5, min_length=32, max_length=128, num_train=20000, num_validation=1000,
                num_test=1000, seed=0)
OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
END = "]"
SPLITS = ("train", "validation", "test")
# Chance that a non-root node is a digit although its budget allows a list,
# so trees vary in shape rather than always filling their budget.
_LEAF_PROB = 0.15


@dataclasses.dataclass(eq=False)
class ListOpsConfig(tfds.core.BuilderConfig):
    """Generation parameters; build with `listops_config` so the name matches."""

    max_depth: int = DEFAULTS["max_depth"]
    max_args: int = DEFAULTS["max_args"]
    min_length: int = DEFAULTS["min_length"]
    max_length: int = DEFAULTS["max_length"]
    num_train: int = DEFAULTS["num_train"]
    num_validation: int = DEFAULTS["num_validation"]
    num_test: int = DEFAULTS["num_test"]
    seed: int = DEFAULTS["seed"]


def listops_config(
    *,
    max_depth: int,
    max_args: int,
    min_length: int,
    max_length: int,
    num_train: int,
    num_validation: int,
    num_test: int,
    seed: int,
) -> ListOpsConfig:
    """Returns a config whose name encodes every parameter.

    The name is the dataset's directory, so different settings never share
    prepared files and equal settings reuse them.

    Args:
      max_depth: maximum nesting of operators (the root list is depth 1).
      max_args: maximum number of arguments of one operator (at least 2).
      min_length: minimum expression length in tokens.
      max_length: maximum expression length in tokens.
      num_train: number of train examples.
      num_validation: number of validation examples.
      num_test: number of test examples.
      seed: base seed; each split draws from its own stream.

    Returns:
      A ListOpsConfig.
    """
    name = (
        f"depth{max_depth}_args{max_args}_len{min_length}-{max_length}"
        f"_n{num_train}-{num_validation}-{num_test}_seed{seed}"
    )
    return ListOpsConfig(
        name=name,
        max_depth=max_depth,
        max_args=max_args,
        min_length=min_length,
        max_length=max_length,
        num_train=num_train,
        num_validation=num_validation,
        num_test=num_test,
        seed=seed,
    )


def max_tokens(max_depth: int, max_args: int) -> int:
    """Longest expression the depth and arity allow (to reject bad configs)."""
    length = 1
    for _ in range(max_depth):
        length = 2 + max_args * length
    return length


def apply_operator(op: str, args: list[int]) -> int:
    """Value of one operator on its digit arguments."""
    if op == "[MAX":
        return max(args)
    if op == "[MIN":
        return min(args)
    if op == "[MED":
        s = sorted(args)
        mid = len(s) // 2
        # LRA: int(np.median(args)), i.e. the mean of the middle pair, floored.
        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) // 2
    if op == "[SM":
        return sum(args) % 10
    raise ValueError(f"unknown ListOps operator {op!r}")


def _grow(rng: random.Random, budget: int, depth: int, max_depth: int, max_args: int, out: list[str]) -> int:
    """Appends a random subtree of at most `budget` tokens; returns its value."""
    is_leaf = depth > max_depth or budget < 4 or (depth > 1 and rng.random() < _LEAF_PROB)
    if is_leaf:
        digit = rng.randrange(10)
        out.append(str(digit))
        return digit
    num_args = rng.randint(2, min(max_args, budget - 2))
    op = rng.choice(OPERATORS)
    out.append(op)
    # Share the budget left after '[OP' and ']' among the arguments in turn;
    # what one argument leaves unused flows to the next, so little is wasted.
    remaining = budget - 2
    args = []
    for i in range(num_args):
        left = num_args - i
        if left == 1:
            share = remaining
        else:
            fair = remaining / left
            share = int(fair * rng.uniform(0.5, 1.5)) or 1
            share = min(share, remaining - (left - 1))
        start = len(out)
        args.append(_grow(rng, share, depth + 1, max_depth, max_args, out))
        remaining -= len(out) - start
    out.append(END)
    return apply_operator(op, args)


def sample_expression(rng: random.Random, config: ListOpsConfig) -> tuple[str, int]:
    """Draws one expression whose token length lies in the config's range.

    Args:
      rng: the split's random stream.
      config: generation parameters.

    Returns:
      (serialized expression, its value).
    """
    while True:
        budget = rng.randint(config.min_length, config.max_length)
        tokens: list[str] = []
        value = _grow(rng, budget, 1, config.max_depth, config.max_args, tokens)
        if config.min_length <= len(tokens) <= config.max_length:
            return " ".join(tokens), value


def split_rng(seed: int, split: str) -> random.Random:
    """An independent, reproducible random stream per (seed, split)."""
    state = np.random.SeedSequence([seed, SPLITS.index(split)]).generate_state(2)
    return random.Random(int(state[0]) << 32 | int(state[1]))


class Listops(builders.SyntheticBuilder, skip_registration=True):
    """LRA ListOps with configurable depth, arity, length and sizes."""

    name = "listops"
    BUILDER_CONFIGS = [listops_config(**DEFAULTS)]  # noqa: RUF012
    FEATURES = {"source": tfds.features.Text(), "label": tfds.features.ClassLabel(num_classes=10)}
    SUPERVISED_KEYS = ("source", "label")

    def _split_generators(self, dl_manager):
        del dl_manager  # Nothing to download.
        config = self.builder_config
        if max_tokens(config.max_depth, config.max_args) < config.min_length:
            raise ValueError(
                f"listops min_length={config.min_length} is unreachable with "
                f"max_depth={config.max_depth}, max_args={config.max_args}"
            )
        sizes = dict(zip(SPLITS, (config.num_train, config.num_validation, config.num_test)))
        examples = {}
        for split, size in sizes.items():
            rng = split_rng(config.seed, split)
            examples[split] = [sample_expression(rng, config) for _ in range(size)]
        builders.save_vocab(self, [src for src, _ in examples["train"]], level="word")
        return {split: self._generate_examples(exs) for split, exs in examples.items()}

    def _generate_examples(self, examples):
        for i, (source, label) in enumerate(examples):
            yield i, {"source": source, "label": label}


def check(opts: dict[str, Any]) -> None:
    """Arity, a length range that is not empty, and a shortest length the depth and arity can reach."""
    if opts["max_args"] < 2:
        raise ValueError(f"task.max_args must be >= 2, got {opts['max_args']!r}")
    if opts["min_length"] > opts["max_length"]:
        raise ValueError(f"task.min_length={opts['min_length']} exceeds max_length={opts['max_length']}")
    if opts["max_length"] < 4:
        raise ValueError(f"task.max_length must be >= 4, got {opts['max_length']}")
    reach = max_tokens(opts["max_depth"], opts["max_args"])
    if reach < opts["min_length"]:
        raise ValueError(f"task.min_length={opts['min_length']} is unreachable with max_depth={opts['max_depth']} "
                         f"and max_args={opts['max_args']} (at most {reach} tokens)")


def tfds_builder(opts: dict[str, Any]) -> tuple[type[Listops], ListOpsConfig]:
    return Listops, listops_config(**opts)


def load(opts: dict[str, Any], data_dir: str) -> Task:
    """Word-level tokens (operators, digits, ']'); ten classes, the expression's value."""
    prepared = builders.prepare(*tfds_builder(opts), data_dir)
    return Task("listops", "classification", builders.load_vocab(prepared, "word"), 10, opts["max_length"], None,
                builders.in_memory(prepared))


register(TaskSpec("listops", "classification", DEFAULTS, load, builder=tfds_builder, check=check,
                  train_size=lambda opts: opts["num_train"]))
