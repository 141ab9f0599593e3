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
    trains = [m.name for m in methods.methods() if m.trains]
    assert trains == ["gates"]  # L0 gates train derived runs: opt-in, never in the default
    assert what.default == [n for n in registered if n not in ("throwaway", "gates")]  # every method found that
    # trains nothing
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


def test_the_default_analysis_trains_nothing_announces_each_method_and_ends_each_with_a_labelled_line(
        analysis, tmp_path, data_dir, capsys):
    """The default --what: importance, ablate, prune, structural, diagnose -- each announced as it starts and each
    ending with one line that names what it measured (no raw Python reprs); no gates runs are trained."""
    from attn_lab.train.trainer import train_and_evaluate

    command, _ = analysis
    config = tiny_numbers(data_dir, num_steps=2, eval_every=2, checkpoint_every=2)
    config.wandb.mode = "disabled"
    workdir = str(tmp_path / "run")
    train_and_evaluate(config, workdir)
    capsys.readouterr()
    argv = parse_flags(["attn-analyze", "--workdir", workdir, "--max-batches", "1", "--prune-fraction", "0.5",
                        "--random-orders", "1"])
    assert command.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    default = [n for n in BUILT_IN if n != "gates"]
    announced = [line for line in lines if line.startswith("[")]
    assert [a.split("] ")[1].split(":")[0] for a in announced] == default
    assert announced[0].startswith("[1/5] importance: Head importance")
    labels = {"importance": "importance (E|dL/dxi| per head", "ablate": "ablate (accuracy change with one head",
              "prune": "prune (accuracy with the share of heads pruned", "structural": "structural: ",
              "diagnose": "diagnose (heads flagged"}
    for label in labels.values():
        (line,) = [x for x in lines if x.startswith(label)]
        assert "[(" not in line and "{'" not in line and "array(" not in line, line
    importance = json.loads((tmp_path / "run" / "analysis" / "importance.json").read_text())
    top = max(range(4), key=lambda h: importance["cross"][0][h])
    assert f"cross: top L0h{top} {importance['cross'][0][top]:.3g}" in [x for x in lines if x.startswith("imp")][0]
    assert not (tmp_path / "run" / "analysis" / "gates.json").exists()


@pytest.mark.parametrize("values,zoomed", [([99.85, 99.9, 100.0], True), ([0.2, 0.6, 0.9], False)])
def test_a_plot_whose_y_axis_is_a_zoom_says_so(monkeypatch, tmp_path, values, zoomed):
    """A 0.15-point spread at 99.9 (the gates' BLEU) fills the panel like a cliff: the plot writes that its axis is
    zoomed and what the spread is; a range that is not a zoom gets no note."""
    from attn_lab.analysis import plots

    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig))
    plots.line_plot(str(tmp_path / "p.png"), {"gates": ([24, 12, 6], values)}, xlabel="heads kept", ylabel="BLEU",
                    title="t")
    texts = [t.get_text() for t in figures[0].axes[0].texts]
    assert texts == (["y axis zoomed: all values within 0.15 (99.85 to 100)"] if zoomed else [])
