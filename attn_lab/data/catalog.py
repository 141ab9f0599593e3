"""Any TFDS catalog dataset as a task: ``task.name='tfds:<name>[/<config>][:<version>]'``.

The dataset is prepared as array_record (no TensorFlow at training time) into ``task.data_dir`` and read with
random access; ``task.input_key`` and ``task.target_key`` name its text and target features (a text feature for
translation, a ClassLabel for classification; ``a/b`` reaches into nested features), ``task.splits`` maps its split
names (TFDS slicing allowed, e.g. ``train[:95%],train[95%:],test``) to train, validation and test, and a
SentencePiece model is trained on the first ``spm_max_texts`` training texts. Preparing needs the network once: when
the machine is offline, or the builder needs TensorFlow, one line says so.
"""

from __future__ import annotations

import importlib.util
import socket
from typing import Any

import tensorflow_datasets as tfds

from attn_lab.data import pipeline, spm
from attn_lab.data.builders import prepare_lock

PREFIX = "tfds:"
KINDS = ("translation", "classification")
DEFAULTS: dict[str, Any] = dict(kind="classification", input_key="text", target_key="label",
                                splits="train,validation,test", max_input_length=128, max_target_length=128,
                                vocab_size=8000, spm_model_type="unigram", spm_max_texts=100_000)
TENSORFLOW = 'pip install -e ".[tensorflow]"'


def is_catalog(name: Any) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def options(cfg: Any) -> dict[str, Any]:
    """The catalog task's options: DEFAULTS overridden by what the config sets."""
    def get(key, default):
        value = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
        return default if value is None else value
    return {k: get(k, v) for k, v in DEFAULTS.items()}


def check(name: str, opts: dict[str, Any]) -> None:
    """Options and the dataset's presence in the TFDS catalog, checked without network or data."""
    try:
        tfds.builder_cls(name[len(PREFIX):].split("/")[0].split(":")[0])
    except tfds.core.registered.DatasetNotFoundError:
        hint = "" if importlib.util.find_spec("tensorflow") else f" (or its builder needs TensorFlow: {TENSORFLOW})"
        raise ValueError(f"task.name={name!r}: no such dataset in the TFDS catalog{hint}") from None
    if opts["kind"] not in KINDS:
        raise ValueError(f"task.kind={opts['kind']!r} must be one of {KINDS} for a tfds: task")
    if len(opts["splits"].split(",")) != 3:
        raise ValueError(f"task.splits={opts['splits']!r}: give three TFDS splits for train,validation,test")


def builder_for(name: str, data_dir: str) -> tfds.core.DatasetBuilder:
    """The catalog builder (one line if the name is not in the catalog)."""
    try:
        return tfds.builder(name[len(PREFIX):], data_dir=data_dir)
    except (tfds.core.registered.DatasetNotFoundError, ValueError) as e:  # unknown dataset, config or version
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"task.name={name!r}: {first}") from None


def prepare(name: str, data_dir: str) -> tfds.core.DatasetBuilder:
    """Downloads and prepares once as array_record; a prepared copy in ``data_dir`` needs no network."""
    builder = builder_for(name, data_dir)
    if builder.is_prepared():  # reading needs no lock, so a prepared dataset on a read-only path works
        return builder
    if not _online():
        raise ValueError(f"task.name={name!r} is not prepared in {data_dir} and this machine is offline; prepare it "
                         "once on a machine with network into the same task.data_dir")
    try:
        with prepare_lock(data_dir, name.replace("/", "_")):
            builder.download_and_prepare(file_format="array_record")
    except ModuleNotFoundError as e:
        if "tensorflow" not in str(e):
            raise
        raise ValueError(f"task.name={name!r}: this TFDS builder needs TensorFlow to prepare: {TENSORFLOW}") from None
    except Exception as e:  # noqa: BLE001 (network and download errors come in many types; report one line)
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"task.name={name!r}: could not download or prepare it ({type(e).__name__}: {first}); "
                         "offline? prepare it once on a machine with network into the same task.data_dir") from None
    return builder


def _online(host: str = "storage.googleapis.com") -> bool:
    """Whether DNS resolves (TFDS would otherwise spend minutes retrying downloads before failing)."""
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


class Renamed:
    """A random-access split whose records carry the pipeline's keys: 'source' and 'target' or 'label'."""

    def __init__(self, source: Any, keys: dict[str, str]):
        self.source, self.keys = source, keys

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> dict[str, Any]:
        record = self.source[index]
        return {ours: _pick(record, theirs) for ours, theirs in self.keys.items()}


def _pick(record: dict, path: str) -> Any:
    for part in path.split("/"):
        record = record[part]
    return record


def load(name: str, opts: dict[str, Any], data_dir: str) -> dict[str, Any]:
    """The :class:`~attn_lab.data.tasks.Task` fields of a prepared catalog dataset."""
    builder = prepare(name, data_dir)
    features = builder.info.features
    target_name = "target" if opts["kind"] == "translation" else "label"
    keys = {"source": opts["input_key"], target_name: opts["target_key"]}
    for key in keys.values():
        try:
            _pick(features, key)
        except (KeyError, TypeError):
            raise ValueError(f"task {name!r} has no feature {key!r}; it has: {', '.join(features)}") from None
    splits = dict(zip(("train", "validation", "test"), opts["splits"].split(",")))
    sources = {ours: Renamed(builder.as_data_source(split=theirs), keys) for ours, theirs in splits.items()}
    train = sources["train"]
    count = min(len(train), opts["spm_max_texts"])
    texts = [pipeline.as_text(train[i][k]) for i in range(count) for k in keys if k != "label"]
    vocab = spm.load_or_train(builder.data_dir, texts, opts["vocab_size"], opts["spm_model_type"])
    num_classes = _pick(features, opts["target_key"]).num_classes if opts["kind"] == "classification" else None
    translation = opts["kind"] == "translation"
    return dict(name=name, kind=opts["kind"], vocab=vocab, num_classes=num_classes,
                max_input_length=opts["max_input_length"],
                max_target_length=opts["max_target_length"] if translation else None, sources=sources)
