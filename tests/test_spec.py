"""The run spec: a config is validated once and resolved into a frozen :class:`RunSpec`; after that nothing reads
the raw config. The proof: a config whose every node raises on any read once resolved still trains to the end, and
the run it records is the run the config describes."""

import json
import os

import ml_collections
import pytest

from attn_lab.attention.registry import default_options
from attn_lab.train import config as config_lib
from attn_lab.train import identity
from attn_lab.train.spec import RunSpec, _with_seed, as_spec, resolve_run
from attn_lab.train.trainer import train_seeds
from tests.helpers import tiny_numbers

READS = ("__getattr__", "__getitem__", "__contains__", "__iter__", "get", "items", "keys", "values", "to_dict",
         "to_json", "copy_and_resolve_references", "as_configdict", "lock", "unlock")


def _nodes(config: ml_collections.ConfigDict) -> set[int]:
    """The ids of ``config`` and every ConfigDict below it."""
    ids = {id(config)}
    for value in config._fields.values():  # the raw storage: reading it here must not count as a read
        if isinstance(value, ml_collections.ConfigDict):
            ids |= _nodes(value)
    return ids


def poison(config: ml_collections.ConfigDict, monkeypatch) -> None:
    """From now on, any read of ``config`` or one of its sections raises (other ConfigDicts are unaffected)."""
    poisoned = _nodes(config)
    for name in READS:
        real = getattr(ml_collections.ConfigDict, name, None)
        if real is None:  # not in this ml_collections release
            continue

        def guarded(self, *args, _real=real, _name=name, **kwargs):
            if id(self) in poisoned:
                raise AssertionError(f"the raw config was read after resolution ({_name}{args[:1]})")
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(ml_collections.ConfigDict, name, guarded)


def test_the_poison_works(data_dir, monkeypatch):
    """The check below would pass vacuously if a poisoned config could still be read."""
    config = tiny_numbers(data_dir)
    section = config.train
    poison(config, monkeypatch)
    for read in (lambda: config.train, lambda: section.num_steps, lambda: config.get("seed"),
                 lambda: config.to_dict(), lambda: section["batch_size"], lambda: "seed" in config):
        with pytest.raises(AssertionError, match="the raw config was read"):
            read()
    assert tiny_numbers(data_dir).train.num_steps == 12  # another config reads as usual


def test_nothing_reads_the_raw_config_after_it_is_resolved(data_dir, tmp_path, monkeypatch):
    config = tiny_numbers(data_dir)
    config.wandb.mode = "disabled"
    expected = identity.fingerprint(config.to_dict())
    calls = []
    real = config_lib.validated
    monkeypatch.setattr(config_lib, "validated", lambda c: calls.append(1) or real(c))
    spec = resolve_run(config, [0, 1])
    poison(config, monkeypatch)
    dirs = [str(tmp_path / "s0"), str(tmp_path / "s1")]
    records = train_seeds(spec, dirs)
    assert calls == [1]  # validated once, at resolution
    assert [r["steps"] for r in records] == [12, 12]
    for seed, d in enumerate(dirs):
        recorded = json.load(open(os.path.join(d, "results.json")))["config"]
        assert recorded["seed"] == seed and recorded["train"]["num_steps"] == 12
    first = json.load(open(os.path.join(dirs[0], "results.json")))
    assert first["config_fingerprint"] == expected  # seed 0's record is exactly the config's run


def test_the_spec_resolves_what_the_run_uses_and_is_frozen(data_dir):
    config = tiny_numbers(data_dir)
    config.model.attention.name = "local"
    config.model.attention.local.window = 5
    config.model.kinds.cross.attention = "dense"  # local attends within one sequence only
    config.loss.diversity.output.weight = 0.1
    spec = resolve_run(config, [3, 4])
    assert spec.seeds == (3, 4) and [c.seed for c in spec.per_seed] == [3, 4]
    assert spec.model == "seq2seq" and spec.task.spec.name == "numbers" and spec.task.kind == "translation"
    assert dict(spec.kernels) == {"encoder_self": "local", "decoder_self": "local", "cross": "dense"}
    assert spec.kernel_options["decoder_self"]["local"] == {**default_options("local"), "window": 5}
    assert [(term.name, section.output.weight) for term, section in spec.objectives] == [("diversity", 0.1)]
    config.model.num_heads = 8  # a later change to the raw config does not reach the spec
    assert spec.config.model.num_heads == 4 and spec.per_seed[0].model.num_heads == 4
    with pytest.raises(AttributeError):
        spec.config.model.num_heads = 8
    with pytest.raises(AttributeError):
        spec.seeds = (5,)
    assert as_spec(spec) is spec and as_spec(spec, [3, 4]) is spec
    with pytest.raises(ValueError, match=r"^seeds \[3\] differ from the spec's \[3, 4\]$"):
        as_spec(spec, [3])
    only = spec.only([1])
    assert isinstance(only, RunSpec) and only.seeds == (4,) and only.per_seed[0].seed == 4


def test_a_bad_config_is_refused_at_resolution_in_one_line(data_dir):
    config = tiny_numbers(data_dir)
    config.model.num_heads = 5
    with pytest.raises(ValueError, match=r"^model.num_heads=5 does not divide model.d_model=32; "):
        resolve_run(config)


def test_a_seed_template_in_init_from_is_filled_per_seed_and_the_spec_keeps_it(data_dir):
    config = tiny_numbers(data_dir, init_from="runs/src/seed={seed}")
    spec = ml_collections.FrozenConfigDict(config)
    firsts = [_with_seed(spec, s, 2).train.init_from for s in (0, 1)]
    assert firsts == ["runs/src/seed=0", "runs/src/seed=1"]
    assert spec.train.init_from == "runs/src/seed={seed}"  # filling one seed's copy left the shared config alone
