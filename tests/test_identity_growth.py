"""The lab grows under a recorded run: a model kind (with an attention kind of its own), a training objective, a
kernel and a task registered after a run was trained leave it the same run (attn_lab/train/identity.py, ``used``): the
finished run says there is nothing to do and writes nothing, an interrupted one resumes to the uninterrupted
numbers, and a real change is still refused in one line. Before identity compared what a run uses, each of these
made every recorded run refuse to resume (``loss.<new>.weight='(absent)'``, a longer ``loss.diversity.kinds``)."""

import json
import os
import shutil

import ml_collections
import pytest
from flax import nnx

from attn_lab import objectives
from attn_lab.attention import registry as kernels
from attn_lab.attention.dense import DenseAttention
from attn_lab.checks import RunError
from attn_lab.cli import check_config_overrides
from attn_lab.data import tasks
from attn_lab.models import sites
from attn_lab.train import identity
from attn_lab.train.trainer import train_and_evaluate
from tests.helpers import tiny_numbers


class _Toy(nnx.Module):
    TASK_KINDS = ("classification",)
    ATTENTION = {"growth_self": sites.KindSpec(mask="key_padding")}  # a kind no shipped model has
    GENERATES = False


class _Term(objectives.LossTerm):
    name = "growth_test"

    def default_config(self):
        return ml_collections.ConfigDict({"weight": 0.0, "floor": 0.5})


class _Kernel(DenseAttention):
    name = "growth_kernel"

    def __init__(self, *, temperature: float = 1.0, scale: float | None = None, mode: str | None = None,
                 bins: int | None = None, **kw):
        super().__init__(**kw)


@pytest.fixture
def grown(monkeypatch):
    """Registers, for one test, a model kind with its own attention kind, an objective, a kernel and a task."""
    monkeypatch.setattr(sites, "_MODELS", dict(sites._MODELS))
    sites.register_model("growth_toy")(_Toy)
    objectives.register_term(_Term)
    monkeypatch.setitem(kernels.KERNELS, "growth_kernel", _Kernel)  # the shared dict: removed after the test
    monkeypatch.setattr(tasks, "_REGISTRY", dict(tasks._REGISTRY))
    numbers = tasks.task_spec("numbers")
    tasks.register(tasks.TaskSpec("growth_task", "translation", {"size": 3}, numbers.load))
    try:
        yield
    finally:
        objectives.unregister_term("growth_test")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, data_dir):
    """A tiny run trained to the end before anything was registered, and its config as it was then."""
    workdir = str(tmp_path_factory.mktemp("grown") / "run")
    config = tiny_numbers(data_dir)
    config.compile_cache, config.wandb.mode = "", "disabled"
    results = train_and_evaluate(config, workdir)
    return {"workdir": workdir, "config": config.to_dict(), "results": results}


def _today(data_dir):
    config = tiny_numbers(data_dir)  # built now: every registered kind, objective and kernel has its keys
    config.compile_cache, config.wandb.mode = "", "disabled"
    return config


def test_the_grown_config_has_the_new_keys_and_is_the_same_run(grown, recorded, data_dir):
    today = _today(data_dir)
    assert "growth_self" in today.model.kinds and today.loss.growth_test.weight == 0.0
    assert "growth_kernel" in today.model.attention and "growth_self" in today.loss.diversity.kinds
    assert "growth_self" not in recorded["config"]["loss"]["diversity"]["kinds"]
    assert identity.differences(recorded["config"], today.to_dict()) == []
    assert identity.fingerprint(recorded["config"]) == identity.fingerprint(today.to_dict())


def test_an_objective_switched_on_or_a_real_change_is_another_run(grown, recorded, data_dir):
    today = _today(data_dir)
    today.loss.growth_test.weight = 0.1
    assert identity.differences(recorded["config"], today.to_dict()) == [
        ("loss.growth_test.floor", identity.ABSENT, 0.5), ("loss.growth_test.weight", identity.ABSENT, 0.1)]
    today = _today(data_dir)
    today.loss.diversity.output.weight = 0.1  # on: its kinds compare as the model's (not the registry's) kinds
    old = json.loads(json.dumps(recorded["config"]))
    old["loss"]["diversity"]["output"]["weight"] = 0.1
    assert identity.differences(old, today.to_dict()) == []
    today.loss.diversity.kinds = "encoder_self"
    assert [d[0] for d in identity.differences(old, today.to_dict())] == ["loss.diversity.kinds"]


def test_the_finished_run_has_nothing_to_do_and_the_interrupted_one_resumes_exactly(grown, recorded, data_dir,
                                                                                    tmp_path, capsys):
    done = str(tmp_path / "done")
    shutil.copytree(recorded["workdir"], done)
    before = sorted(os.listdir(done))
    again = train_and_evaluate(_today(data_dir), done)
    assert capsys.readouterr().out == f"{done}: finished at step 12 (results.json); nothing to do\n"
    assert again == json.load(open(os.path.join(done, "results.json"))) and sorted(os.listdir(done)) == before

    cut = str(tmp_path / "cut")  # interrupted after its step-6 checkpoint
    shutil.copytree(recorded["workdir"], cut)
    os.remove(os.path.join(cut, "results.json"))
    shutil.rmtree(os.path.join(cut, "checkpoints", "12"))
    with open(os.path.join(cut, "metrics.jsonl")) as f:
        kept = [line for line in f if json.loads(line).get("step", 0) <= 6]
    with open(os.path.join(cut, "metrics.jsonl"), "w") as f:
        f.writelines(kept)
    resumed = train_and_evaluate(_today(data_dir), cut)
    assert resumed["steps"] == 12
    for key, value in recorded["results"]["final"]["test"].items():
        assert resumed["final"]["test"][key] == pytest.approx(value, rel=1e-6, abs=1e-9), key

    changed = _today(data_dir)
    changed.model.num_heads = 2
    with pytest.raises(RunError) as info:
        train_and_evaluate(changed, done)
    assert str(info.value).startswith(f"{done} was trained with model.num_heads=4 ({done}/results.json), this "
                                      "config has model.num_heads=2;")


def test_a_kernel_option_defaulting_to_none_takes_its_annotated_type_from_the_command_line(grown, data_dir):
    """``scale: float | None = None`` takes 0.5 and ``mode: str | None = None`` takes 'fast' from flags (an int
    placeholder refused both); ``bins: int | None`` still refuses a string in one line."""
    today = _today(data_dir)
    check_config_overrides(today, ["--config.model.attention.growth_kernel.scale=0.5",
                                   "--config.model.attention.growth_kernel.mode=fast",
                                   "--config.model.attention.growth_kernel.bins=3"])
    options = today.model.attention.growth_kernel
    assert (options.scale, options.mode, options.bins) == (0.5, "fast", 3)
    with pytest.raises(SystemExit, match="bins"):
        check_config_overrides(_today(data_dir), ["--config.model.attention.growth_kernel.bins=many"])
