"""MQAR (Zoology's multi-query associative recall): the generator against its definition, determinism, the batches
a language model trains on, and the configs that cannot hold their pairs in one line."""

import numpy as np
import pytest

from attn_lab.data.tasks import load_task, mqar, validate_task_config
from attn_lab.data.tokenizers import PAD_ID
from tests.helpers import load_config

OPTS = dict(vocab_size=64, seq_len=32, num_kv_pairs=4, power_a=0.01, random_non_queries=False)


def test_each_sequence_lists_its_pairs_then_queries_every_key_once_answered_by_its_value():
    rng = np.random.default_rng(0)
    keys_range, values_range = mqar.id_ranges(64)
    for _ in range(200):
        inputs, targets = mqar.mqar_example(rng, **OPTS)
        n = OPTS["num_kv_pairs"]
        keys, values = inputs[: 2 * n : 2], inputs[1 : 2 * n : 2]
        assert len(set(keys)) == n and len(set(values)) == n  # drawn without replacement
        assert all(k in keys_range for k in keys) and all(v in values_range for v in values)
        scored = np.flatnonzero(targets != PAD_ID)
        assert len(scored) == n and np.all(scored >= 2 * n) and np.all((scored - 2 * n) % 2 == 0)
        pairs = dict(zip(keys, values))
        assert sorted(inputs[scored]) == sorted(keys)  # every key queried once
        assert all(targets[i] == pairs[inputs[i]] for i in scored)  # answered by its own value
        rest = np.setdiff1d(np.arange(2 * n, OPTS["seq_len"]), scored)
        assert np.all(inputs[rest] == mqar.BLANK)  # filler everywhere else


def test_query_gaps_follow_the_power_law():
    """Slot g (after the context) is drawn with probability ~ (g + 1)^(a - 1), without replacement within a
    sequence: with one query per sequence the slot frequencies are exactly the law's."""
    rng = np.random.default_rng(1)
    opts = {**OPTS, "num_kv_pairs": 1, "power_a": 0.3, "seq_len": 20}
    slots = [(np.flatnonzero(mqar.mqar_example(rng, **opts)[1])[0] - 2) // 2 for _ in range(20000)]
    law = mqar.gap_probabilities(9, 0.3)
    np.testing.assert_allclose(np.bincount(slots, minlength=9) / 20000, law, atol=0.012)
    assert law[0] > 3 * law[-1]  # near queries are the common ones


def test_random_filler_uses_the_non_special_tokens():
    rng = np.random.default_rng(2)
    inputs, targets = mqar.mqar_example(rng, **{**OPTS, "random_non_queries": True})
    rest = np.setdiff1d(np.arange(8, 32), np.flatnonzero(targets))
    assert np.all(inputs[rest] >= mqar.BLANK) and np.all(inputs[rest] < 64) and len(set(inputs[rest])) > 3


def test_prepared_splits_are_deterministic_disjoint_streams_and_batch_for_a_language_model(tmp_path):
    c = load_config("mqar", "quick").task
    c.update(num_train=64, num_validation=16, num_test=16, vocab_size=40, seq_len=24, num_kv_pairs=3)
    task = load_task(c, str(tmp_path))
    again = load_task(c, str(tmp_path / "other"))
    first = lambda t, split: np.asarray(t.sources[split][0]["inputs"])
    assert task.kind == "lm" and task.vocab.size == 40 and task.max_input_length == 24
    np.testing.assert_array_equal(first(task, "train"), first(again, "train"))  # same seed: same data
    assert not np.array_equal(first(task, "train"), first(task, "test"))  # each split its own stream
    batch = task.dataset("train", 8, train=True, seed=0)[0]
    assert batch["inputs"].shape == batch["targets"].shape == (8, 24)
    assert ((batch["targets"] != PAD_ID).sum(1) == 3).all()  # three scored positions per row
    assert task.vocab.decode(first(task, "train")[:2]).startswith("k")


@pytest.mark.parametrize("change, message", [
    ({"seq_len": 15, "num_kv_pairs": 4}, "task.seq_len=15 cannot hold num_kv_pairs=4"),
    ({"vocab_size": 10, "num_kv_pairs": 4}, "task.vocab_size=10 is too small for num_kv_pairs=4"),
    ({"power_a": 0.0}, "task.power_a must be a positive number"),
    ({"num_kv_pairs": 0}, "task.num_kv_pairs must be a positive integer"),
    ({"random_non_queries": 1}, "task.random_non_queries must be True or False"),
])
def test_bad_mqar_options_are_one_line(change, message):
    c = {**load_config("mqar", "quick").task.to_dict(), **change}  # a mapping: ConfigDict would refuse a type change
    with pytest.raises(ValueError) as e:
        validate_task_config(c)
    assert message in str(e.value) and "\n" not in str(e.value)
