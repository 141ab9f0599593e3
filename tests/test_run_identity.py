"""A run's identity (attn_lab/train/identity.py) and the files every command reads or writes, checked without training:
which keys make a run another run, file modes, user files with errors, damaged vocabularies and metrics lines, and
what a task's length limits cut."""

import json
import os
import pathlib

import pytest

from attn_lab.checks import load_user_module
from attn_lab.cli import check_config_overrides
from attn_lab.data.tokenizers import Vocab
from attn_lab.io import write_json_atomic, write_text_atomic
from attn_lab.train import identity
from attn_lab.train.config import unused_kernel_options
from attn_lab.train.logging import _truncate_jsonl
from tests.helpers import load_config, tiny_numbers, tiny_numbers_flags

# (key, another value, whether it makes another run)
CHANGES = [
    ("wandb.mode", "disabled", False), ("wandb.group", "g", False), ("task.data_dir", "/elsewhere", False),
    ("compile_cache", "", False), ("train.log_every", 7, False), ("train.checkpoint_every", 7, False),
    ("heads.track", True, False), ("parallel.coordinator_address", "h:1", False),
    ("model.attention.linformer.k", 3, False),  # the options of a kernel no attention uses do nothing
    ("train.eval_every", 7, True),  # decides which validation scores 'best' picks from
    ("train.learning_rate", 5e-3, True), ("train.num_steps", 9, True), ("seed", 3, True),
    ("model.num_heads", 2, True), ("model.attention.local.window", 3, False), ("task.max_value", 500, True),
    ("train.init_from", "/a/run", True), ("eval.beam_size", 4, True), ("train.max_eval_batches", 1, True),
]


def _set(config, key, value):
    *parents, leaf = key.split(".")
    node = config
    for name in parents:
        node = node[name]
    node[leaf] = value


@pytest.mark.parametrize("key,value,differs", CHANGES, ids=[c[0] for c in CHANGES])
def test_only_keys_that_can_change_results_make_another_run(key, value, differs):
    base = load_config("numbers", "quick")
    other = base.copy_and_resolve_references()
    _set(other, key, value)
    diffs = identity.differences(base.to_dict(), other.to_dict())
    assert (diffs != []) == differs
    assert (identity.fingerprint(base.to_dict()) != identity.fingerprint(other.to_dict())) == differs
    if differs:
        ((name, old, new),) = diffs
        assert name == key and new == value and old == base[key]


def test_a_used_kernel_s_options_are_part_of_the_identity():
    base = load_config("numbers", "quick")
    base.model.attention.name = "local"
    other = base.copy_and_resolve_references()
    other.model.attention.local.window = 3
    assert [d[0] for d in identity.differences(base.to_dict(), other.to_dict())] == ["model.attention.local.window"]
    assert unused_kernel_options(other) == []  # local is used: its window counts
    base.model.attention.name = "dense"
    assert unused_kernel_options(base) == []
    base.model.attention.local.window = 3
    assert unused_kernel_options(base) == ["model.attention.local.window=3"]
    base.model.kinds.cross.attention = "local"  # a kind's own kernel counts as used
    assert unused_kernel_options(base) == []


@pytest.mark.parametrize("kernel", ["local", "strided", "longformer", "bigbird"])
def test_a_record_from_before_the_fused_options_is_the_same_run(kernel):
    """A run recorded before ``implementation`` / ``fused_block_size`` existed for a kernel is the same run as
    today's config at their defaults (same fingerprint); another tile size is another run."""
    config = load_config("numbers", "quick")
    config.model.attention.name = kernel
    old = config.to_dict()
    for option in ("fused_block_size", "implementation") if kernel != "local" else ("fused_block_size",):
        del old["model"]["attention"][kernel][option]
    assert identity.differences(old, config.to_dict()) == []
    assert identity.fingerprint(old) == identity.fingerprint(config.to_dict())
    config.model.attention[kernel].fused_block_size = 32
    assert identity.differences(old, config.to_dict()) == [
        (f"model.attention.{kernel}.fused_block_size", identity.ABSENT, 32)]


def test_a_resume_with_another_kernel_names_the_kernel_key_first():
    """Another kernel changes model.attention.name and brings the new kernel's options into use: the line names
    the key the user changed, not an option only one run has."""
    base = load_config("numbers", "quick")
    other = base.copy_and_resolve_references()
    other.model.attention.name = "local"
    diffs = identity.differences(base.to_dict(), other.to_dict())
    assert diffs[0] == ("model.attention.name", "dense", "local")
    assert {d[0] for d in diffs[1:]} == ({f"model.attention.local.{k}" for k in other.model.attention.local}
                                         | {f"model.attention.dense.{k}" for k in base.model.attention.dense})
    line = identity.mismatch_text("runs/x", "runs/x/results.json", diffs, identity.FRESH)
    assert line.startswith("runs/x was trained with model.attention.name='dense' (runs/x/results.json), this config "
                           "has model.attention.name='local' (and ")


def test_the_command_line_form_of_the_tiny_run_is_the_same_run(tmp_path):
    config = load_config("numbers", "quick")
    check_config_overrides(config, tiny_numbers_flags(str(tmp_path)))
    assert identity.differences(tiny_numbers(str(tmp_path)).to_dict(), config.to_dict()) == []


def test_the_mismatch_line_names_the_first_key_both_values_and_how_many_more():
    old = {"train": {"learning_rate": 1e-3, "num_steps": 10, "batch_size": 8}, "seed": 0}
    new = {"train": {"learning_rate": 2e-3, "num_steps": 20, "batch_size": 8}, "seed": 0, "extra": 1}
    line = identity.mismatch_text("runs/x", "runs/x/config.json", identity.differences(old, new), "do this")
    assert line == ("runs/x was trained with train.learning_rate=0.001 (runs/x/config.json), this config has "
                    "train.learning_rate=0.002 (and 2 more: train.num_steps, extra); do this")  # both-sided keys first


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_atomic_writes_keep_the_umask_s_mode_and_an_existing_file_s_own(tmp_path, umask):
    """As open() would: a new file 0o666 less the umask (not mkstemp's owner-only 0o600); a rewritten file keeps
    the mode it had."""
    old = os.umask(umask)
    try:
        write_json_atomic(tmp_path / "results.json", {"a": 1})
        write_text_atomic(pathlib.Path(tmp_path / "table.md"), "x")
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    mode = lambda name: os.stat(tmp_path / name).st_mode & 0o777  # noqa: E731
    assert mode("results.json") == mode("table.md") == mode("plain.txt") == 0o666 & ~umask
    os.chmod(tmp_path / "results.json", 0o640)
    write_json_atomic(tmp_path / "results.json", {"a": 2})
    assert mode("results.json") == 0o640 and json.load(open(tmp_path / "results.json")) == {"a": 2}


USER_FILES = [
    ("def get_config():\n    x = (\n", "x.py:2: SyntaxError: '(' was never closed"),
    ("import os\n\ndef get_config():\n    return foo\nfoo_ = get_config()\n",
     "x.py:4: NameError: name 'foo' is not defined"),
    ("raise RuntimeError('bad file')\n", "x.py:1: RuntimeError: bad file"),
]


@pytest.mark.parametrize("text,line", USER_FILES, ids=["syntax", "name", "raise"])
def test_a_user_file_that_fails_is_one_line_with_its_file_and_line(tmp_path, text, line):
    path = tmp_path / "x.py"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_user_module(str(path), "_x")
    assert str(info.value) == f"{tmp_path}/{line}"
    with pytest.raises(ValueError, match=f"^{tmp_path} is a folder, not a Python file$"):
        load_user_module(str(tmp_path), "_x")


@pytest.mark.parametrize("text", ['{"tokens": ["a"', '[1, 2]', '{"level": "char"}', ""])
def test_a_damaged_vocabulary_is_one_line_naming_the_file(tmp_path, text):
    path = tmp_path / "vocab.json"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        Vocab.load(path)
    message = str(info.value)
    assert message.startswith(f"vocabulary {path} cannot be read (") and "\n" not in message
    assert message.endswith("delete it and it is built again from the prepared training split")


def test_metrics_lines_that_are_not_a_step_s_record_are_dropped_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = ['{"step": 1, "a": 1}', "[1, 2]", "3", '"text"', '{"step": "x"}', '{"step": 2', '{"step": 2, "a": 2}',
             '{"step": 3, "a": 3}']
    path.write_text("\n".join(lines) + "\n")
    _truncate_jsonl(path, resume_step=2)
    assert path.read_text() == '{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n'


def test_the_examples_a_length_limit_cuts_are_counted_as_the_encoder_cuts_them(data_dir):
    from attn_lab.data import load_task
    from attn_lab.data.pipeline import as_text

    config = tiny_numbers(data_dir).task
    config.max_target_length = 20
    task = load_task(config, data_dir)
    cut = task.overlong("validation")
    records = [task.sources["validation"][i] for i in range(task.num_examples("validation"))]
    targets = [len(task.vocab.encode(as_text(r["target"]))) + 1 for r in records]  # + eos
    sources = [len(task.vocab.encode(as_text(r["source"]))) + 1 for r in records]
    assert cut["max_target_length"] == (sum(n > 20 for n in targets), len(records), max(targets))
    assert cut["max_input_length"] == (sum(n > task.max_input_length for n in sources), len(records), max(sources))
    assert cut["max_target_length"][0] > 0
    encoded = task.dataset("validation", 8, train=False)[0]["targets"]  # what the model sees: cut, eos kept
    assert (encoded != 0).sum(axis=1).max() == 20
