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


def _by_pair_reference(inputs, targets, predicted, n):
    """Recall per listed pair, written out one sequence and one pair at a time."""
    hits = np.zeros(n)
    for x, y, p in zip(inputs, targets, predicted):
        for j in range(n):
            at = [i for i in range(len(x)) if x[i] == x[2 * j] and y[i] != PAD_ID]  # the query of the j-th key
            assert len(at) == 1
            hits[j] += p[at[0]] == y[at[0]]
    return hits / len(inputs)


def test_recall_by_pair_scores_each_listed_pair_at_its_own_query_only():
    """Filler that repeats a key (random_non_queries) and guesses off the query positions do not count; a
    model that confuses pairs 1 and 2 on every other sequence shows 0.5 on both and 1.0 on the rest."""
    rng = np.random.default_rng(3)
    opts = {**OPTS, "random_non_queries": True}
    inputs, targets = map(np.stack, zip(*(mqar.mqar_example(rng, **opts) for _ in range(64))))
    n = OPTS["num_kv_pairs"]
    predicted = targets.copy()  # right everywhere: the pad "answer" at filler that repeats a key must not count
    for b in range(0, 64, 2):  # swap the answers of the pairs listed second and third
        q1, q2 = (np.flatnonzero((inputs[b] == inputs[b, 2 * j]) & (targets[b] != PAD_ID))[0] for j in (1, 2))
        predicted[b, q1], predicted[b, q2] = targets[b, q2], targets[b, q1]
    got = mqar.recall_by_pair(inputs, targets, predicted, n)
    np.testing.assert_array_equal(got, [1.0, 0.5, 0.5, 1.0])
    predicted[5:9] = rng.integers(0, 64, predicted[5:9].shape)  # some random guesses too
    np.testing.assert_array_equal(mqar.recall_by_pair(inputs, targets, predicted, n),
                                  _by_pair_reference(inputs, targets, predicted, n))


@pytest.mark.slow
def test_recall_by_pair_script_reads_a_finished_run_and_refuses_others_in_one_line(tmp_path):
    """Its recall is the trainer's test accuracy (each sequence queries every key once, so the pairs' mean is the
    overall recall too); a folder that is no run is one line and exit 1."""
    import json
    import subprocess
    import sys

    from tests.helpers import ROOT
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "attn_lab.train", "--config", "configs/mqar.py:quick", "--workdir", str(run),
                    "--config.train.num_steps=30", "--config.train.eval_every=30", "--config.train.checkpoint_every=30",
                    "--config.task.num_train=512", "--config.task.num_test=200", "--config.task.vocab_size=64",
                    f"--config.task.data_dir={tmp_path / 'data'}"], cwd=ROOT, check=True, capture_output=True)
    out = subprocess.run([sys.executable, "scripts/mqar_by_pair.py", "--workdir", str(run)], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()
    recall, pairs = out[-1].split("recall ")[1].split("; by pair listed 1..4: ")
    accuracy = json.loads((run / "results.json").read_text())["final"]["test"]["accuracy"]
    assert abs(float(recall) - accuracy) < 1e-3
    assert abs(np.mean([float(p) for p in pairs.split()]) - float(recall)) < 2e-3
    bad = subprocess.run([sys.executable, "scripts/mqar_by_pair.py", "--workdir", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1].endswith("is not a run folder (no config.json)")
