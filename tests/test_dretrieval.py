"""D-retrieval (one answer from D argmax lookups): the generator against its definition written out here,
determinism, the bad options that stop in one line; and a batch padded past the model's position table (a task of
17 tokens pads to 24), which must not change what the real positions compute."""

import jax.numpy as jnp
import numpy as np
import pytest

from attn_lab.data.tasks import dretrieval, load_task, validate_task_config
from attn_lab.data.tokenizers import PAD_ID
from attn_lab.models import build_model
from attn_lab.train.config import base_config
from tests.helpers import load_config

OPTS = dict(num_keys=20, seq_keys=6, num_values=3)


def test_the_answer_names_each_features_top_key_value_in_feature_order():
    ranks = dretrieval.feature_ranks(0, 20, 3)  # (D, keys)
    assert sorted(ranks[0]) == list(range(20)) and not np.array_equal(ranks[0], ranks[1])  # unrelated orders
    readout, first_answer, size = dretrieval.id_offsets(20, 3, 3)
    rng = np.random.default_rng(0)
    for _ in range(300):
        inputs, targets = dretrieval.example(rng, ranks, **OPTS)
        pairs = inputs[:-1] - dretrieval.FIRST_PAIR
        keys, values = pairs // 3, pairs % 3
        assert len(set(keys)) == 6 and inputs[-1] == readout
        assert np.all(targets[:-1] == PAD_ID) and first_answer <= targets[-1] < size
        expected = []
        for d in range(3):  # the value of the present key that feature d ranks highest
            best = max(range(6), key=lambda i: ranks[d][keys[i]])
            expected.append(values[best])
        answer = targets[-1] - first_answer
        assert answer == expected[0] * 9 + expected[1] * 3 + expected[2]
        assert dretrieval.vocab(20, 3, 3).decode([targets[-1]]) == "=" + ",".join(f"v{v}" for v in expected)


def test_the_sum_answer_is_the_looked_up_values_sum_mod_the_value_count():
    """'sum' (a combination no per-lookup score adds up to, as the paper's outer function F0): the same lookups as
    'tuple' from the same stream, the answer their sum mod num_values among num_values answer tokens."""
    ranks = dretrieval.feature_ranks(0, 20, 3)
    readout, first_answer, size = dretrieval.id_offsets(20, 3, 3, "sum")
    assert size == first_answer + 3
    named, summed = np.random.default_rng(1), np.random.default_rng(1)
    for _ in range(300):
        inputs, targets = dretrieval.example(named, ranks, **OPTS)
        again, sums = dretrieval.example(summed, ranks, **OPTS, combine="sum")
        np.testing.assert_array_equal(inputs, again)
        looked_up = np.unravel_index(targets[-1] - first_answer, (3, 3, 3))  # the tuple answer's values
        assert sums[-1] - first_answer == sum(int(v) for v in looked_up) % 3 and np.all(sums[:-1] == PAD_ID)
        assert dretrieval.vocab(20, 3, 3, "sum").decode([sums[-1]]) == f"=s{sum(int(v) for v in looked_up) % 3}"


def test_the_default_tuple_task_keeps_the_prepared_folder_name_of_runs_made_before_combine():
    c = load_config("dretrieval", "quick").task.to_dict()
    opts = {k: c[k] for k in dretrieval.DEFAULTS}
    assert dretrieval.dretrieval_config(**opts).name == "R64_K16_V4_D2_n20000-1000-1000_seed0"
    assert dretrieval.dretrieval_config(**{**opts, "combine": "sum"}).name == "R64_K16_V4_D2_sum_n20000-1000-1000_seed0"


def test_prepared_splits_are_deterministic_disjoint_streams(tmp_path):
    c = load_config("dretrieval", "quick").task
    c.update(num_train=32, num_validation=8, num_test=8)
    task, again = load_task(c, str(tmp_path)), load_task(c, str(tmp_path / "other"))
    first = lambda t, split: np.asarray(t.sources[split][0]["inputs"])
    assert task.kind == "lm" and task.max_input_length == c.seq_keys + 1
    np.testing.assert_array_equal(first(task, "train"), first(again, "train"))
    assert not np.array_equal(first(task, "train"), first(task, "test"))


@pytest.mark.parametrize("change, message", [
    ({"seq_keys": 30}, "task.seq_keys=30 exceeds task.num_keys=20"),
    ({"num_lookups": 0}, "task.num_lookups must be a positive integer, got 0"),
    ({"num_values": 40, "num_lookups": 4}, "task.num_lookups=4 with num_values=40"),
    ({"combine": "max"}, "task.combine='max' is not a way to combine the lookups; use one of tuple, sum"),
])
def test_bad_options_stop_in_one_line(change, message):
    c = load_config("dretrieval", "quick").task
    c.update(num_keys=20, **change)
    with pytest.raises(ValueError) as err:
        validate_task_config(c)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_a_batch_padded_past_the_position_table_computes_the_same_real_positions(positions):
    """The length bucket rounds 17 tokens up to 24 while the model's table has 18 rows: the padded rows get no
    position, and causal positions 0..16 equal those of the unpadded batch (float32, 'highest' matmuls)."""
    c = base_config()
    c.model.update(num_layers=1, d_model=16, mlp_dim=0, num_heads=2, dropout=0.0, positions=positions)
    model = build_model(c.model, kind="lm", vocab_size=30, max_len=18, seed=0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(4, 30, (2, 17)))
    padded = jnp.pad(tokens, ((0, 0), (0, 7)), constant_values=PAD_ID)
    np.testing.assert_allclose(model(padded)[:, :17], model(tokens), rtol=1e-5, atol=1e-5)
