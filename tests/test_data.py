"""Tests of the offline data layer: builders, vocab, pipelines, tasks."""

from __future__ import annotations

import os
import sys
import time

import ml_collections
import numpy as np
import pytest

from attn_lab.data import TASKS, Vocab, load_task, pipeline, validate_task_config
from attn_lab.data.tasks import listops
from attn_lab.data.tokenizers import BOS_ID, EOS_ID, PAD_ID, UNK_ID

NUMBERS = dict(name="numbers", min_value=0, max_value=199)
LISTOPS = dict(name="listops", min_length=16, max_length=64, num_train=300, num_validation=40, num_test=50, seed=3)
SPLITS = ("train", "validation", "test")


def _cfg(**kw) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(kw)


def _records(task, split):
    source = task.sources[split]
    return [source[i] for i in range(len(source))]


def _files(root) -> dict[str, float]:
    return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns for d, _, fs in os.walk(root) for f in fs}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture(scope="module")
def numbers_task(data_dir):
    return load_task(_cfg(**NUMBERS), data_dir=data_dir)


@pytest.fixture(scope="module")
def listops_task(data_dir):
    return load_task(_cfg(**LISTOPS), data_dir=data_dir)


def evaluate_listops(expression: str) -> int:
    """Independent stack evaluator of an LRA-serialized ListOps expression."""
    stack: list[list] = []
    value = None
    for tok in expression.split():
        if tok.startswith("["):
            stack.append([tok[1:]])
        elif tok == "]":
            op, *args = stack.pop()
            if op == "MAX":
                value = max(args)
            elif op == "MIN":
                value = min(args)
            elif op == "MED":
                value = int(np.median(args))
            elif op == "SM":
                value = sum(args) % 10
            else:
                raise AssertionError(op)
            if stack:
                stack[-1].append(value)
        else:
            stack[-1].append(int(tok))
    assert not stack
    return value


def test_numbers_en_de_and_disjoint_splits(numbers_task):
    by_value = {}
    split_values = {}
    for split in SPLITS:
        recs = _records(numbers_task, split)
        split_values[split] = {int(r["value"]) for r in recs}
        assert len(split_values[split]) == len(recs)
        by_value.update({int(r["value"]): r for r in recs})
    assert by_value[42]["source"].decode() == "forty-two"
    assert by_value[42]["target"].decode() == "zweiundvierzig"
    assert [len(split_values[s]) for s in SPLITS] == [160, 20, 20]
    train, val, test = (split_values[s] for s in SPLITS)
    assert not (train & val or train & test or val & test)
    assert train | val | test == set(range(200))
    assert numbers_task.kind == "translation"
    assert numbers_task.num_classes is None
    assert "tensorflow" not in sys.modules  # TFDS data sources need no TF


def test_prepare_is_deterministic(tmp_path):
    for cfg in (NUMBERS, LISTOPS):
        a = load_task(_cfg(**cfg), data_dir=str(tmp_path / "a"))
        b = load_task(_cfg(**cfg), data_dir=str(tmp_path / "b"))
        for split in SPLITS:
            assert _records(a, split) == _records(b, split)
        assert a.vocab == b.vocab


def test_default_numbers_config(tmp_path):
    task = load_task(_cfg(name="numbers"), data_dir=str(tmp_path))
    assert [task.num_examples(s) for s in SPLITS] == [8000, 1000, 1000]
    assert (task.max_input_length, task.max_target_length) == (64, 64)
    refs = task.references("test")
    assert max(map(len, refs)) <= 63  # fits max_target_length with eos
    assert "ß" in task.vocab.tokens  # dreißig: German chars are in the vocab


def test_second_load_reuses_prepared_data(tmp_path):
    first = load_task(_cfg(**NUMBERS), data_dir=str(tmp_path))
    before = _files(tmp_path)
    assert any(p.endswith("vocab.json") for p in before)
    time.sleep(0.01)
    second = load_task(_cfg(**NUMBERS), data_dir=str(tmp_path))
    assert _files(tmp_path) == before
    assert second.vocab == first.vocab


def test_settings_change_prepared_location(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_DATA_DIR", str(tmp_path))
    load_task(_cfg(**NUMBERS))
    load_task(_cfg(**{**NUMBERS, "max_value": 99}))
    configs = sorted(os.listdir(tmp_path / "numbers"))
    configs = [c for c in configs if not c.startswith(".")]
    assert len(configs) == 2, configs


def test_vocab_roundtrip_and_saved_file(numbers_task, listops_task, data_dir):
    vocab = numbers_task.vocab
    assert vocab.tokens[:4] == ("<pad>", "<bos>", "<eos>", "<unk>")
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    for text in ("forty-two", "zweiundvierzig", "one hundred and five"):
        ids = vocab.encode(text)
        assert min(ids) > UNK_ID
        assert vocab.decode([BOS_ID] + ids + [EOS_ID, 7, 8, PAD_ID]) == text
    assert vocab.encode("§") == [UNK_ID]
    # One shared char vocab holds both languages' characters.
    assert "ü" in vocab.tokens and "y" in vocab.tokens

    saved = [os.path.join(d, "vocab.json") for d, _, fs in os.walk(data_dir) if "vocab.json" in fs]
    assert len(saved) == 2
    loaded = {Vocab.load(p).level: Vocab.load(p) for p in saved}
    assert loaded["char"] == numbers_task.vocab
    assert loaded["word"] == listops_task.vocab
    expr = "[MAX 4 3 [MIN 2 3 ] 1 0 ]"
    assert listops_task.decode(listops_task.vocab.encode(expr)) == expr
    assert listops_task.vocab.size == 4 + 10 + 4 + 1


def test_listops_labels_and_lengths(listops_task):
    sources = {}
    for split in SPLITS:
        recs = _records(listops_task, split)
        assert len(recs) == listops_task.num_examples(split)
        sources[split] = [r["source"].decode() for r in recs]
        for r, text in zip(recs, sources[split]):
            assert 16 <= len(text.split()) <= 64, text
            assert int(r["label"]) == evaluate_listops(text), text
        labels = {int(r["label"]) for r in recs}
        assert labels <= set(range(10)) and len(labels) >= 5
    assert [len(sources[s]) for s in SPLITS] == [300, 40, 50]
    assert not set(sources["test"]) & set(sources["validation"])
    assert listops_task.references("test") == [evaluate_listops(t) for t in sources["test"]]


def test_listops_generation_is_fast():
    config = listops.listops_config(**{**listops.DEFAULTS, "min_length": 256, "max_length": 512})
    rng = listops.split_rng(0, "train")
    start = time.perf_counter()
    lengths = [len(listops.sample_expression(rng, config)[0].split()) for _ in range(300)]
    assert time.perf_counter() - start < 5.0
    assert min(lengths) >= 256 and max(lengths) <= 512


def test_train_batches_bucketed_and_random_access(numbers_task, listops_task):
    ds = numbers_task.dataset("train", 8, train=True, seed=1)
    widths = set()
    for step in range(60):  # 480 rows: three epochs of the 160 train examples
        batch = ds[step]
        assert batch["inputs"].shape[0] == batch["targets"].shape[0] == 8
        assert batch["inputs"].dtype == batch["targets"].dtype == np.int32
        widths.add(batch["inputs"].shape[1])
        widths.add(batch["targets"].shape[1])
        # Every row ends with eos and the rest is padding.
        assert ((batch["targets"] == EOS_ID).sum(axis=1) == 1).all()
    assert widths <= {8, 16, 32, 64} and len(widths) <= 3
    a, b = ds[17], ds[17]
    assert all(np.array_equal(a[k], b[k]) for k in a)
    other = numbers_task.dataset("train", 8, train=True, seed=2)[17]
    assert not np.array_equal(a["inputs"], other["inputs"])

    ds = listops_task.dataset("train", 16, train=True, seed=0)
    shapes = {ds[s]["inputs"].shape for s in range(40)}
    assert shapes <= {(16, 16), (16, 32), (16, 64)}
    assert ds[3]["mask"].tolist() == [1.0] * 16


def test_truncation_keeps_eos(data_dir):
    task = load_task(_cfg(**NUMBERS, max_input_length=6, max_target_length=10), data_dir=data_dir)
    batch = task.dataset("train", 32, train=True)[0]
    assert batch["inputs"].shape == (32, 8)
    eos_at = np.argmax(batch["inputs"] == EOS_ID, axis=1)
    assert ((batch["inputs"] == EOS_ID).sum(axis=1) == 1).all()
    assert eos_at.max() == 5  # long sources were cut, keeping the eos
    assert batch["targets"].shape[1] == 12  # max_target_length 10 -> bucket 12 (8, 12, 16)
    assert ((batch["targets"] == EOS_ID).sum(axis=1) == 1).all()


def test_eval_pass_covers_every_example_once(numbers_task, listops_task):
    ds = numbers_task.dataset("test", 7, train=False)
    batches = [ds[i] for i in range(len(ds))]
    assert len(batches) == 3  # 20 examples: 7 + 7 + 6 and one fill row
    decoded = [numbers_task.decode(row) for b in batches for row in b["targets"]]
    assert decoded[:20] == numbers_task.references("test")
    last = batches[-1]
    assert last["inputs"].shape[0] == 7
    assert not last["inputs"][-1].any() and not last["targets"][-1].any()

    ds = listops_task.dataset("validation", 16, train=False)
    batches = [ds[i] for i in range(len(ds))]
    mask = np.concatenate([b["mask"] for b in batches])
    labels = np.concatenate([b["targets"] for b in batches])
    assert mask.dtype == np.float32 and mask.sum() == 40 and len(mask) == 48
    assert labels[mask > 0].tolist() == listops_task.references("validation")
    assert not batches[-1]["inputs"][mask[32:] == 0].any()


class _Recording(list):
    """A random-access source that remembers which records were read."""

    def __init__(self, items):
        super().__init__(items)
        self.read = set()

    def __getitem__(self, i):
        self.read.add(i)
        return list.__getitem__(self, i)


def _pad_stack(pieces: list[np.ndarray]) -> np.ndarray:
    """What DataParallel.batch makes of the hosts' pieces: each padded to the largest, stacked along rows."""
    shape = np.max([p.shape for p in pieces], axis=0)
    return np.concatenate([np.pad(p, [(0, n - m) for n, m in zip(shape, p.shape)]) for p in pieces])


@pytest.mark.parametrize("hosts", [2, 4])
def test_each_host_reads_only_its_rows_and_together_they_make_the_batch(numbers_task, listops_task, hosts):
    cases = [(numbers_task, "train", True, 8), (numbers_task, "test", False, 8),  # 20 rows: the last batch has 4
             (listops_task, "train", True, 16), (listops_task, "validation", False, 16)]
    for task, split, train, size in cases:
        whole = task.dataset(split, size, train=train, seed=3)
        parts = [task.dataset(split, size, train=train, seed=3, shard=(p, hosts)) for p in range(hosts)]
        steps = range(6) if train else range(len(whole))
        assert train or all(len(part) == len(whole) for part in parts)
        for s in steps:
            pieces = [part[s] for part in parts]
            for key, value in whole[s].items():
                assert all(len(piece[key]) == size // hosts for piece in pieces)
                np.testing.assert_array_equal(_pad_stack([piece[key] for piece in pieces]), value, err_msg=key)

    # Host p reads exactly rows [p * b, (p + 1) * b) of each batch (and the other hosts read the rest).
    source = _Recording(range(20))
    encode, collate = (lambda r: {"x": r}), (lambda rows: [r["x"] for r in rows])
    ds = pipeline.batched(source, encode, collate, 8, train=False, shard=(1, hosts))
    rows = [r for i in range(len(ds)) for r in ds[i]]
    b = 8 // hosts
    assert rows == [i for i in range(20) if (i % 8) // b == 1]
    assert source.read == set(rows)


def test_unknown_task_name_one_line_error(tmp_path):
    assert TASKS[-1] == "tfds:<name>" and list(TASKS[:-1]) == sorted(TASKS[:-1])  # the registry, sorted
    with pytest.raises(ValueError) as err:
        load_task(_cfg(name="foo"), data_dir=str(tmp_path))
    assert str(err.value) == f"unknown task.name 'foo'; choose one of: {', '.join(TASKS)}"
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
    "override, key",
    [
        (dict(name="listops", num_train=0), "num_train"),
        (dict(name="numbers", max_target_length=-1), "max_target_length"),
        (dict(name="numbers", tgt_lang="xx"), "tgt_lang"),
        (dict(name="listops", min_length=100, max_length=50), "min_length"),
    ],
)
def test_validate_task_config_names_bad_key(override, key):
    with pytest.raises(ValueError, match=key) as err:
        validate_task_config(_cfg(**override))
    assert "\n" not in str(err.value)
    validate_task_config(_cfg(name=override["name"]))  # defaults are valid
