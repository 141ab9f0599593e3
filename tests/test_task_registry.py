"""The task registry: tasks are found by name, and a new task is one new file (declared here in a module written
at test time) that the options, checks, loading, lengths and sizes all follow from."""

from __future__ import annotations

import importlib
import importlib.util
import os

import ml_collections
import pytest

from attn_lab.data import tasks
from attn_lab.data.tasks import TaskSpec, defaults, load_task, task_options, validate_task_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One task per file of attn_lab/data/tasks/, named after it (the catalog family, tfds:<name>, has its own module):
# read from the folder, so a new task file is tested here without editing this file.
BUNDLED = tuple(sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "attn_lab", "data", "tasks"))
                       if f.endswith(".py") and not f.startswith("_") and f != "tfds_catalog.py"))

# A whole task in one file, as a contributor would write it: reverse three-letter words, character-level.
REVERSE_TASK = '''
import dataclasses

import tensorflow_datasets as tfds

from attn_lab.data import builders
from attn_lab.data.tasks import Task, TaskSpec, register

DEFAULTS = dict(size=40, max_input_length=12, max_target_length=12)


@dataclasses.dataclass(eq=False)
class ReverseConfig(tfds.core.BuilderConfig):
    size: int = DEFAULTS["size"]


def reverse_config(size):
    return ReverseConfig(name=f"size{size}", size=size)


class Reverse(builders.SyntheticBuilder, skip_registration=True):
    name = "toy_reverse"
    BUILDER_CONFIGS = [reverse_config(DEFAULTS["size"])]
    FEATURES = {"source": tfds.features.Text(), "target": tfds.features.Text()}

    def _split_generators(self, dl_manager):
        words = ["".join("abcde"[i // 5 ** k % 5] for k in range(3)) for i in range(self.builder_config.size)]
        builders.save_vocab(self, words, level="char")
        return {split: self._generate_examples(words) for split in ("train", "validation", "test")}

    def _generate_examples(self, words):
        for i, word in enumerate(words):
            yield i, {"source": word, "target": word[::-1]}


def check(opts):
    if opts["size"] > 125:
        raise ValueError(f"task.size={opts['size']!r} must be at most 125 (the distinct three-letter words)")


def tfds_builder(opts):
    return Reverse, reverse_config(opts["size"])


def load(opts, data_dir):
    prepared = builders.prepare(*tfds_builder(opts), data_dir)
    return Task("toy_reverse", "translation", builders.load_vocab(prepared, "char"), None, opts["max_input_length"],
                opts["max_target_length"], builders.in_memory(prepared))


register(TaskSpec("toy_reverse", "translation", DEFAULTS, load, builder=tfds_builder, check=check,
                  train_size=lambda opts: opts["size"]))
'''


@pytest.fixture
def registry(monkeypatch):
    """A copy of the registry for one test, so a task registered here is gone afterwards."""
    monkeypatch.setattr(tasks, "_REGISTRY", dict(tasks._REGISTRY))
    monkeypatch.setattr(tasks, "_FAMILIES", dict(tasks._FAMILIES))


@pytest.fixture
def reverse_task(registry, tmp_path):
    """The one-file task above, written to disk and imported like a task module of the package."""
    path = tmp_path / "toy_reverse.py"
    path.write_text(REVERSE_TASK)
    spec = importlib.util.spec_from_file_location("toy_reverse", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_registry_lists_the_bundled_tasks_and_the_catalog_family():
    assert tasks.TASKS == (*BUNDLED, "tfds:<name>")  # every task file registers the task it is named after
    assert set(tasks.TASK_KINDS) == set(BUNDLED) and set(tasks.TASK_KINDS.values()) <= set(tasks.KINDS)
    assert {k: tasks.TASK_KINDS[k] for k in ("bible", "bible_lm", "listops", "numbers")} == {
        "bible": "translation", "bible_lm": "lm", "listops": "classification", "numbers": "translation"}
    assert tasks.task_kind({"name": "tfds:anything", "kind": "translation"}) == "translation"


@pytest.mark.parametrize("name", BUNDLED)
def test_defaults_live_once_in_the_task_file_and_pass_validation(name):
    module = importlib.import_module(f"attn_lab.data.tasks.{name}")
    assert defaults(name) == module.DEFAULTS
    validate_task_config({"name": name})
    validate_task_config({"name": name, **defaults(name)})
    spec = tasks.task_spec(name)
    builder_cls, config = spec.builder(defaults(name))  # the builder's declared config is the defaults' config
    assert builder_cls.BUILDER_CONFIGS[0].name == config.name


def test_catalog_family_defaults_pass_validation():
    validate_task_config({"name": "tfds:mnist", **defaults("tfds:mnist")})


@pytest.mark.parametrize("name", (*BUNDLED, "tfds"))
def test_each_config_file_sets_every_option_of_its_task(name):
    """Every option is in the config (so a flag can override it); values differ from the defaults only where the
    config file says why."""
    spec = importlib.util.spec_from_file_location(f"config_{name}", os.path.join(ROOT, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    task = module.get_config("").task
    assert set(defaults(task.name)) <= set(task.keys())
    differ = {k for k, v in defaults(task.name).items() if task[k] != v}
    why = {"listops": {"max_length"},  # ListOps' full run: 512 tokens, not 128
           "mqar": {"vocab_size", "num_train", "num_test"}}  # Zoology's data sizes; the task's defaults are CPU-sized
    assert differ == why.get(name, set())


def test_unknown_name_lists_the_choices():
    with pytest.raises(ValueError) as err:
        task_options({"name": "nope"})
    assert str(err.value) == f"unknown task.name 'nope'; choose one of: {', '.join(BUNDLED)}, tfds:<name>"


def test_a_task_in_one_new_file_is_found_by_name(reverse_task):
    assert "toy_reverse" in tasks.TASKS and tasks.TASK_KINDS["toy_reverse"] == "translation"
    with pytest.raises(ValueError, match="choose one of: .*toy_reverse"):
        task_options({"name": "nope"})
    assert tasks.task_kind({"name": "toy_reverse"}) == "translation"
    assert task_options({"name": "toy_reverse"}) == reverse_task.DEFAULTS
    cfg = ml_collections.ConfigDict({"name": "toy_reverse", "size": 30, "max_target_length": 5})
    assert task_options(cfg) == {"size": 30, "max_input_length": 12, "max_target_length": 5}
    assert tasks.sequence_lengths(cfg) == (12, 5)
    assert tasks.max_train_examples(cfg) == 30


@pytest.mark.parametrize("override, message", [
    ({"size": 200}, "task.size=200 must be at most 125 (the distinct three-letter words)"),  # the task's check
    ({"max_input_length": 0}, "task.max_input_length must be a positive integer, got 0"),  # a shared check
])
def test_a_new_tasks_checks_give_one_line(reverse_task, override, message):
    with pytest.raises(ValueError) as err:
        validate_task_config({"name": "toy_reverse", **override})
    assert str(err.value) == message


def test_load_task_uses_the_new_tasks_loader(reverse_task, tmp_path):
    cfg = {"name": "toy_reverse", "size": 25}
    assert not tasks.is_prepared(cfg, str(tmp_path))
    task = load_task(cfg, str(tmp_path))
    assert tasks.is_prepared(cfg, str(tmp_path))
    assert (task.name, task.kind, task.num_examples("train")) == ("toy_reverse", "translation", 25)
    first = task.sources["test"][0]
    assert task.references("test")[0] == first["source"].decode()[::-1]
    batch = task.dataset("train", 5, train=True)[0]
    assert batch["inputs"].shape == (5, 8) and batch["targets"].shape == (5, 8)  # 3 letters + eos -> bucket 8


def test_a_name_registers_once(registry):
    spec = TaskSpec("numbers", "translation", {}, load=lambda opts, data_dir: None)
    with pytest.raises(ValueError, match="^task 'numbers' registered twice$"):
        tasks.register(spec)
    with pytest.raises(ValueError, match="^task name 'tfds:x' belongs to a registered family .prefixes: tfds:.$"):
        tasks.register(TaskSpec("tfds:x", "translation", {}, load=spec.load))
    with pytest.raises(ValueError, match="^task 'odd' has kind='regression'; allowed: translation, classification, "
                                         "lm$"):
        tasks.register(TaskSpec("odd", "regression", {}, load=spec.load))
