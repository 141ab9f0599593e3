"""The shipped experiments are declarations a forker can read: each file declares PRESETS (no get_experiment, no
if-chain over presets), stays within 150 lines, holds no pilot number (its decimal literals are margins, weights and
rates that define arms); each plan file in experiments/plans belongs to a preset, was written by the pilot command or
migrated once (and says so), and is current -- its fingerprint is its preset's, so no shipped preset is refused."""

import glob
import io
import json
import os
import re
import tokenize

import pytest

from attn_lab.checks import load_user_module
from attn_lab.experiment import Preset, fingerprint
from attn_lab.sweep import plans
from attn_lab.sweep.spec import load_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py")))
MAX_LINES, MAX_DECIMALS = 150, 80  # issue 58: from 1,766 lines and 559 decimal literals


def _decimals(path: str) -> list[str]:
    """Every decimal literal in the file's code and text (numbers in strings and comments count too)."""
    with open(path) as f:
        source = f.read()
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.NUMBER, tokenize.STRING, tokenize.COMMENT):
            found += re.findall(r"(?<![\w.])\d+\.\d+|\d+e-\d+", token.string)
    return found


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_each_experiment_file_is_a_short_declaration(path):
    module = load_user_module(path, f"_declaration_{os.path.basename(path)[:-3]}")
    assert isinstance(module.PRESETS, dict) and all(isinstance(p, Preset) for p in module.PRESETS.values())
    assert not hasattr(module, "get_experiment") and not hasattr(module, "RENAMED_PRESETS")
    with open(path) as f:
        lines = f.read().splitlines()
    assert len(lines) <= MAX_LINES, f"{path}: {len(lines)} lines"
    assert not any(re.search(r"\bif preset\b|preset ==|preset in \(", line) for line in lines), path


def test_the_experiments_hold_few_decimal_literals_and_no_pilot_numbers():
    counts = {os.path.basename(p): len(_decimals(p)) for p in FILES}
    assert sum(counts.values()) < MAX_DECIMALS, counts
    for path in FILES:
        text = open(path).read()
        assert not re.search(r"\b(QUICK|LM|DEMO|SHARP|SPAN|TUNED|STATE)_(SD|EFFECT)\b", text), path


def test_every_plan_file_is_current_belongs_to_a_preset_and_says_where_it_came_from():
    owners = {}
    for path in FILES:
        module = load_user_module(path, f"_plans_{os.path.basename(path)[:-3]}")
        for name, preset in module.PRESETS.items():
            owners.setdefault(preset.name, (path, name, preset))
    found = sorted(glob.glob(os.path.join(ROOT, "experiments", plans.PLANS, "*.json")))
    assert found
    for file in found:
        plan = json.load(open(file))
        name = os.path.basename(file)[:-len(".json")]
        assert name in owners, f"{file}: no preset builds the sweep '{name}'"
        path, preset_name, preset = owners[name]
        assert plan["experiment_hash"] == fingerprint(preset), file
        assert set(plan["findings"]) >= set(preset.findings), file
        assert plan["pilot"].get("migrated") or plan["pilot"].get("commit"), file
        assert plan["pilot"]["seeds"] and all(f["sd"] is None or f["sd"] > 0 for f in plan["findings"].values())
        exp = load_experiment(f"{path}:{preset_name}")
        assert exp.plan_problem is None and exp.design.pilot.startswith(f"{plans.PLANS}/{name}.json"), file
        assert not set(exp.seeds) & set(plan["pilot"]["seeds"]), file  # verdict seeds are never the pilot's
