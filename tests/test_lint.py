"""The repository passes ruff (rules in ruff.toml), so every CI run of the test command also lints."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_check_is_clean():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_decoding_does_not_import_the_train_steps():
    """Decoding, beam search and generation need a model from a state (attn_lab/train/state.py), not the optimizer
    and losses of the train steps: importing them must not pull attn_lab.train.steps in."""
    probe = ("import sys, attn_lab.train.decode, attn_lab.train.beam, attn_lab.train.generate\n"
             "print('attn_lab.train.steps' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.stdout.strip() == "False", proc.stderr[-1000:]
