"""The head analysis' methods are a registry, one module each (attn_lab/analysis/methods/): a method a forker adds --
here registered by the test, with a flag of its own, writing through the context's shared output helper -- runs
beside the built-in ones, and ``--what`` accepts every registered name.

The analysis command runs in this process: its module is imported (absl flags are defined once per process) and its
flags parsed as :func:`attn_lab.cli.parse_flags` parses a command line; the fixture leaves no flag parsed, no test
flag defined and no test method registered behind it.
"""

import importlib
import json

import numpy as np
import pytest
from absl import flags

from attn_lab.analysis import methods
from attn_lab.analysis.importance import head_importance
from attn_lab.cli import parse_flags
from tests.helpers import tiny_numbers

BUILT_IN = ("importance", "ablate", "prune", "structural", "gates", "diagnose")  # their run order (a fork adds more)


@pytest.fixture
def analysis(monkeypatch):
    """``(command module, ran)``: the analysis command with a throwaway method registered (flag
    ``--throwaway-scale``); ``ran`` collects the context each call of it got."""
    command = importlib.import_module("attn_lab.analysis.__main__")
    monkeypatch.setattr(methods, "_REGISTRY", dict(methods._REGISTRY))  # what the test registers goes with it
    scale = flags.DEFINE_integer("throwaway-scale", 1, "throwaway: a number the method writes back.")
    ran = []

    @methods.register_method("throwaway", order=5)
    def throwaway(ctx):
        """A method registered at test time: writes its flag and the mask shapes through ctx.output."""
        ran.append(ctx)
        ctx.output("throwaway", {"scale": scale.value, "shapes": {k: list(v) for k, v in ctx.shapes.items()}})

    try:
        yield command, ran
    finally:
        flags.FLAGS.unparse_flags()
        delattr(flags.FLAGS, "throwaway-scale")


def test_what_lists_every_registered_method_once(analysis):
    registered = methods.names()
    assert len(set(registered)) == len(registered) and registered[0] == "throwaway"
    assert tuple(n for n in registered if n in BUILT_IN) == BUILT_IN  # one module each, in today's order
    what = flags.FLAGS["what"]
    assert what.default == [n for n in registered if n != "throwaway"]  # every method found in the package
    assert all(name in what.parser.flag_type() for name in registered)
    assert what.parser.parse("throwaway,diagnose,throwaway") == ["throwaway", "diagnose"]  # registered after --what
    with pytest.raises(ValueError, match="registered twice"):
        methods.register_method("importance", order=0)(lambda ctx: None)


def test_a_method_registered_at_test_time_runs_with_its_flag_beside_importance(analysis, tmp_path, data_dir):
    from attn_lab.train.trainer import train_and_evaluate

    command, ran = analysis
    config = tiny_numbers(data_dir, num_steps=2, eval_every=2, checkpoint_every=2)
    config.wandb.mode = "disabled"
    workdir = str(tmp_path / "run")
    train_and_evaluate(config, workdir)
    argv = parse_flags(["attn-analyze", "--workdir", workdir, "--what", "throwaway,importance", "--max-batches", "1",
                        "--throwaway-scale", "7"])
    assert command.main(argv) == 0
    out = tmp_path / "run" / "analysis"
    shapes = {"encoder_self": [1, 4], "decoder_self": [1, 4], "cross": [1, 4]}  # one layer, four heads
    assert json.loads((out / "throwaway.json").read_text()) == {"scale": 7, "shapes": shapes}
    (ctx,) = ran
    expected = head_importance(ctx.run.state, ctx.batches, ctx.shapes, ctx.importance_sums, False)
    written = json.loads((out / "importance.json").read_text())
    assert set(written) == set(shapes) and (out / "importance.png").exists()
    for kind, grid in expected.items():
        np.testing.assert_allclose(written[kind], grid, rtol=1e-6)
        assert np.all(np.asarray(written[kind]) >= 0)
    assert not (out / "ablate.json").exists()  # only what --what names
