"""The tasks the trainer knows, found by name in a registry (as the attention kernels are).

`load_task(cfg)` prepares a task's data on first use (or finds it prepared), loads the vocab stored with it, and
hands out batch datasets per split. Whatever else the code asks about a task (its kind, options and their
defaults, checks, sequence lengths, training-split size, whether it is prepared) is read from the task's
declaration, a :class:`TaskSpec` registered under its name; nothing here branches on task names.

How to add a task: write one file ``attn_lab/data/tasks/<name>.py`` holding its TFDS builder (a
:class:`~attn_lab.data.builders.SyntheticBuilder` subclass that generates the three splits) and, at its end,
``register(TaskSpec("<name>", "<kind>", DEFAULTS, load, builder=..., check=..., train_size=...))``: the options
and their defaults once, the task-specific checks (one-line ValueError), the builder and config the options
choose, and the loader that turns the prepared builder into a :class:`Task`. This package imports every module
in it, so nothing else changes: ``task.name=<name>`` works in any config, ``--config.task.<option>`` overrides a
default, and the registry tests check the new defaults. A config file ``configs/<name>.py`` starts from
``defaults("<name>")`` and sets only what differs. A family of names (the TFDS catalog's ``tfds:<name>``)
registers a factory with :func:`register_family` instead.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any, Literal

import grain

from attn_lab.data import builders, pipeline, spm
from attn_lab.data.tokenizers import Vocab

SPM = dict(vocab_size=8000, spm_model_type="unigram")  # subword options shared by the natural-language tasks
# Checks shared by every task that has an option of this name (task-specific checks live in the task's file).
_POSITIVE = ("max_input_length", "max_target_length", "max_depth", "min_length", "max_length", "num_train",
             "num_validation", "num_test", "vocab_size", "spm_max_texts", "seq_len", "num_kv_pairs")
_NON_NEGATIVE = ("split_seed", "seed", "limit")  # seeds of numpy's default_rng; limit 0 means all
_INTEGER = ("min_value", "max_value", "max_args")


@dataclasses.dataclass(frozen=True)
class Task:
    """A prepared task: its vocab, sizes, and batch datasets per split.

    Attributes:
      name: a registered task name (see TASKS), or 'tfds:<catalog name>'.
      kind: 'translation' (inputs/targets sequences), 'classification'
        (inputs sequence, int label, row mask) or 'lm' (next-token inputs and
        targets of one length; the pad id marks targets that are not scored).
      vocab: the vocab built from the train split (shared by both sides of a
        translation task): characters or words for the synthetic tasks, a
        SentencePiece model for natural language.
      num_classes: label count for classification, None for translation.
      max_input_length: longest input in tokens (eos included for translation;
        for a language model the number of positions of a row).
      max_target_length: longest target (eos included); None for
        classification.
      sources: split -> decoded TFDS records, in prepared order (held in
        memory for the bundled tasks, which are small; random access into the
        array_record files for catalog datasets).
    """

    name: str
    kind: Literal["translation", "classification", "lm"]
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
        encode, collate = _BATCHING[self.kind](self, rows)
        return pipeline.batched(self._source(split), encode, collate, batch_size, train=train, seed=seed,
                                shard=shard)

    def references(self, split: str) -> list[str] | list[int]:
        """What the eval pass should predict, in dataset order.

        Returns:
          Target strings (untruncated) for translation, to score BLEU or exact
          match against decoded outputs; int labels for classification.
        """
        source, reference = self._source(split), _REFERENCE[self.kind]
        return [reference(source[i]) for i in range(len(source))]

    def prompt_ids(self, split: str, tokens: int) -> list[int] | None:
        """The first ``tokens`` input ids (bos first) of ``split``'s first text of a language-model task -- what a
        run's summary continues; None for other tasks and for sequences without text (MQAR's)."""
        record = self._source(split)[0]
        if self.kind != "lm" or "text" not in record:
            return None
        return pipeline.encode_lm(self.vocab, self.max_input_length)(record)["inputs"][:tokens]

    def source_text(self, split: str, index: int) -> str:
        """The untokenized source of a translation example (what a run's summary shows beside its output)."""
        return pipeline.as_text(self._source(split)[index]["source"])

    def decode(self, ids) -> str:
        """Text of token ids (stops at eos, skips pad and bos)."""
        return self.vocab.decode(ids)

    def overlong(self, split: str, limit: int = 5000) -> dict[str, tuple[int, int, int]]:
        """What this task's lengths cut in ``split``: per side whose key sets a limit (``task.max_input_length``,
        ``task.max_target_length``), (examples cut, examples looked at -- the first ``limit`` --, longest in
        tokens, eos included). Translation and classification only: a language model's rows are cut by design."""
        sides = _SIDES.get(self.kind, {})
        source = self._source(split)
        seen = min(len(source), limit)
        out = {}
        for key, (field, extra) in sides.items():  # key: the Task attribute and the config key it comes from
            lengths = [len(self.vocab.encode(pipeline.as_text(source[i][field]))) + extra for i in range(seen)]
            out[key] = (sum(n > getattr(self, key) for n in lengths), seen, max(lengths, default=0))
        return out

    def _source(self, split: str):
        if split not in self.sources:
            raise ValueError(f"unknown split {split!r}; choose one of: {', '.join(self.sources)}")
        return self.sources[split]


def _translation_batching(task: Task, rows: int) -> tuple[Callable, Callable]:
    """Encode and collate of a translation task: source and target sequences, each padded to its own buckets."""
    return (pipeline.encode_translation(task.vocab, task.max_input_length, task.max_target_length),
            pipeline.collate_translation(rows, pipeline.bucket_lengths(task.max_input_length),
                                         pipeline.bucket_lengths(task.max_target_length)))


def _classification_batching(task: Task, rows: int) -> tuple[Callable, Callable]:
    """Encode and collate of a classification task: one sequence, its label and a row mask."""
    return (pipeline.encode_classification(task.vocab, task.max_input_length),
            pipeline.collate_classification(rows, pipeline.bucket_lengths(task.max_input_length)))


def _lm_batching(task: Task, rows: int) -> tuple[Callable, Callable]:
    """Encode and collate of a language-model task: next-token inputs and targets, padded to one bucket."""
    return (pipeline.encode_lm(task.vocab, task.max_input_length),
            pipeline.collate_lm(rows, pipeline.bucket_lengths(task.max_input_length)))


# What each task kind batches, and what its eval pass predicts from a record; KINDS follows from them.
_BATCHING: dict[str, Callable[[Task, int], tuple[Callable, Callable]]] = {
    "translation": _translation_batching, "classification": _classification_batching, "lm": _lm_batching}
_REFERENCE: dict[str, Callable[[dict], Any]] = {
    "translation": lambda record: pipeline.as_text(record["target"]),
    "classification": lambda record: int(record["label"]),
    "lm": lambda record: None}  # scored by loss and accuracy, nothing is decoded
KINDS: tuple[str, ...] = tuple(_BATCHING)
# Per kind, the sides a length limit cuts: limit (config key and Task attribute) -> (record field, tokens added: eos)
_SIDES: dict[str, dict[str, tuple[str, int]]] = {
    "translation": {"max_input_length": ("source", 1), "max_target_length": ("target", 1)},
    "classification": {"max_input_length": ("source", 0)}}


def _no_check(opts: dict[str, Any]) -> None:
    """Default task-specific check: the shared checks cover every option."""


def _size_unknown(opts: dict[str, Any]) -> None:
    """Default training-split size: only preparing tells."""


def _option_lengths(opts: dict[str, Any]) -> tuple[int, int | None]:
    """Default sequence lengths, read from the options: ``max_input_length`` and ``max_target_length``, or
    ``max_length`` for a task with a single sequence."""
    if "max_input_length" not in opts:
        return opts["max_length"], None
    return opts["max_input_length"], opts.get("max_target_length")


def _read_options(cfg: Any, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Default option reading: each default, overridden by what ``cfg`` sets (None included)."""
    return {k: _get(cfg, k, v) for k, v in defaults.items()}


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task's declaration: everything the trainer and the config checks ask about it.

    Attributes:
      name: the ``task.name`` that selects it.
      kind: 'translation', 'classification' or 'lm'; None where the options choose (``task.kind``: catalog
        datasets).
      defaults: every option and its default; a config sets these keys (and may override each).
      load: ``(options, data_dir) -> Task``: prepares the data once, then loads it.
      builder: ``options -> (TFDS builder class, builder config)``; the config's name is the prepared folder
        (unset only for a family, which says where its data is through ``is_prepared``).
      check: task-specific checks of the options, run after the shared ones; raises a one-line ValueError.
      train_size: an upper bound on the training split's size known from the options alone, or None.
      sequence_lengths: ``options -> (max input length, max target length or None)``, as the loaded Task
        reports them (a classification task's target length is dropped).
      read_options: ``(cfg, defaults) -> options`` where a config's unset keys need other treatment.
      is_prepared: ``(options, data_dir) -> bool`` for a task without ``builder``.
    """

    name: str
    kind: Literal["translation", "classification", "lm"] | None
    defaults: Mapping[str, Any]
    load: Callable[[dict[str, Any], str], Task]
    builder: Callable[[dict[str, Any]], tuple[type, Any]] | None = None
    check: Callable[[dict[str, Any]], None] = _no_check
    train_size: Callable[[dict[str, Any]], int | None] = _size_unknown
    sequence_lengths: Callable[[dict[str, Any]], tuple[int, int | None]] = _option_lengths
    read_options: Callable[[Any, Mapping[str, Any]], dict[str, Any]] = _read_options
    is_prepared: Callable[[dict[str, Any], str], bool] | None = None


_REGISTRY: dict[str, TaskSpec] = {}
_FAMILIES: dict[str, Callable[[str], TaskSpec]] = {}


def register(spec: TaskSpec) -> TaskSpec:
    """Registers a task under ``spec.name``; returns the spec, so a task file may keep it.

    Raises:
      ValueError: the name is taken (by a task or a family's prefix), or the kind is not one of KINDS.
    """
    if spec.name in _REGISTRY:
        raise ValueError(f"task '{spec.name}' registered twice")
    if _family(spec.name):
        raise ValueError(f"task name '{spec.name}' belongs to a registered family (prefixes: {', '.join(_FAMILIES)})")
    if spec.kind not in KINDS:
        raise ValueError(f"task '{spec.name}' has kind={spec.kind!r}; allowed: {', '.join(KINDS)}")
    _REGISTRY[spec.name] = spec
    return spec


def register_family(prefix: str, make: Callable[[str], TaskSpec]) -> None:
    """Registers every name ``<prefix><anything>`` (the TFDS catalog: 'tfds:'); ``make(name)`` declares each."""
    if prefix in _FAMILIES or any(name.startswith(prefix) for name in _REGISTRY):
        raise ValueError(f"task family '{prefix}' registered twice")
    _FAMILIES[prefix] = make


def _family(name: Any) -> Callable[[str], TaskSpec] | None:
    return next((make for prefix, make in _FAMILIES.items() if isinstance(name, str) and name.startswith(prefix)),
                None)


def task_names() -> tuple[str, ...]:
    """The registered task names, then each family as ``<prefix><name>`` (what an unknown name's error lists)."""
    return (*sorted(_REGISTRY), *(f"{prefix}<name>" for prefix in _FAMILIES))


def task_spec(name: Any) -> TaskSpec:
    """The declaration of the task called ``name``; an unknown name is a one-line ValueError listing the choices."""
    if isinstance(name, str) and name in _REGISTRY:
        return _REGISTRY[name]
    make = _family(name)
    if make is None:
        raise ValueError(f"unknown task.name {name!r}; choose one of: {', '.join(task_names())}")
    return make(name)


def defaults(name: str) -> dict[str, Any]:
    """A task's options and their defaults (a copy: config files start from it and set what differs)."""
    return dict(task_spec(name).defaults)


def __getattr__(attr: str) -> Any:
    """TASKS (names) and TASK_KINDS (name -> kind) are computed from the registry when asked, so a task
    registered after this package was imported is listed too."""
    if attr == "TASKS":
        return task_names()
    if attr == "TASK_KINDS":
        return {name: spec.kind for name, spec in _REGISTRY.items()}
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


@dataclasses.dataclass(frozen=True)
class ResolvedTask:
    """A task config resolved once: its declaration and options, and every question a config check asks of it
    (:func:`resolve`), so a validation reads the registry one time."""

    spec: TaskSpec
    options: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.spec.kind or self.options["kind"]  # a task without a fixed kind takes it from its options

    def check(self) -> None:
        """The shared checks of options by name, then the task's own; a one-line ValueError naming the key."""
        opts = self.options
        for keys, test, allowed in ((_POSITIVE, lambda v: v > 0, "a positive integer"),
                                    (_NON_NEGATIVE, lambda v: v >= 0, "an integer >= 0"),
                                    (_INTEGER, lambda v: True, "an integer")):
            for key in keys:
                if key in opts and not (is_int(opts[key]) and test(opts[key])):
                    raise ValueError(f"task.{key} must be {allowed}, got {opts[key]!r}")
        if "spm_model_type" in opts and opts["spm_model_type"] not in spm.MODEL_TYPES:
            raise ValueError(f"task.spm_model_type={opts['spm_model_type']!r} is not one of {spm.MODEL_TYPES}")
        self.spec.check(opts)

    def is_prepared(self, data_dir: str | None = None) -> bool:
        """Whether the task's data is already prepared in ``data_dir`` (nothing is written or downloaded)."""
        data_dir = builders.resolve_data_dir(data_dir)
        if self.spec.is_prepared is not None:
            return self.spec.is_prepared(self.options, data_dir)
        return builders.is_prepared(*self.spec.builder(self.options), data_dir)

    def sequence_lengths(self) -> tuple[int, int | None]:
        """``(max_input_length, max_target_length or None)`` exactly as the loaded :class:`Task` will report them,
        known from the config alone (no data is read)."""
        inputs, targets = self.spec.sequence_lengths(self.options)
        return inputs, targets if self.kind == "translation" else None

    def max_train_examples(self) -> int | None:
        """An upper bound on the training split's size known before preparation, or None where only preparing
        tells."""
        return self.spec.train_size(self.options)


def resolve(cfg: Any) -> ResolvedTask:
    """The task config ``cfg`` (a ConfigDict, object or mapping) resolved: its declaration and its options
    (defaults overridden by what ``cfg`` sets); an unknown name is a one-line ValueError."""
    spec = task_spec(_get(cfg, "name", None))
    return ResolvedTask(spec, spec.read_options(cfg, spec.defaults))


def task_kind(cfg: Any) -> str:
    """'translation', 'classification' or 'lm' for a task config (a catalog dataset says which in ``task.kind``)."""
    return resolve(cfg).kind


def task_options(cfg: Any) -> dict[str, Any]:
    """The task's options: defaults overridden by what ``cfg`` (a ConfigDict, object or mapping) sets."""
    return resolve(cfg).options


def validate_task_config(cfg: Any) -> None:
    """Checks a task config without preparing any data; raises a one-line ValueError naming the bad key."""
    resolve(cfg).check()


def is_prepared(cfg: Any, data_dir: str | None = None) -> bool:
    """Whether the task's data is already prepared in ``data_dir`` (nothing is written or downloaded)."""
    return resolve(cfg).is_prepared(data_dir)


def sequence_lengths(cfg: Any) -> tuple[int, int | None]:
    """See :meth:`ResolvedTask.sequence_lengths`."""
    return resolve(cfg).sequence_lengths()


def max_train_examples(cfg: Any) -> int | None:
    """See :meth:`ResolvedTask.max_train_examples`."""
    return resolve(cfg).max_train_examples()


def load_task(cfg: Any, data_dir: str | None = None) -> Task:
    """Prepares (first time only) and loads a task.

    Args:
      cfg: the task config (``cfg.name`` plus options, see :func:`defaults`).
      data_dir: where prepared data lives; defaults to $ATTN_LAB_DATA_DIR, then
        ~/.cache/attn_lab/tensorflow_datasets.

    Returns:
      The Task.
    """
    task = resolve(cfg)
    task.check()
    return task.spec.load(task.options, builders.resolve_data_dir(data_dir))


def is_int(value: Any) -> bool:
    """An integer option's test (bool is not one)."""
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


def _discover() -> None:
    """Imports every module of this package; each registers its task, so a new task file needs no edit elsewhere."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


_discover()
