"""scripts/resolve_presets.py, the identity check of a refactor: it resolves every config and trial preset the way
their runs do, and ``--compare`` tells a change of value from a change of what a run is (the identity rule)."""

import gzip
import json
import os
import subprocess
import sys

from attn_lab.train.config import SECTIONS
from attn_lab.train.identity import flat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "resolve_presets.py")
DEFAULT_WEIGHT_DECAY = SECTIONS["train"]["weight_decay"][0]


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_every_preset_resolves_and_a_changed_key_is_found_by_value_and_by_identity(tmp_path):
    out = tmp_path / "now.json"
    proc = _run("--out", str(out))
    assert proc.returncode == 0, proc.stderr
    written = json.loads(out.read_text())
    resolved, designs = written["configs"], written["designs"]
    names = list(resolved)
    assert any(n.startswith("configs/numbers.py:quick") for n in names)
    assert any(n.startswith("experiments/head_count.py:quick/") for n in names)  # trials, one per seed
    assert all(isinstance(c["model"]["num_heads"], int) for c in resolved.values())
    assert designs["experiments/head_count.py:lm"]["name"] == "head_count_lm"
    assert designs["experiments/head_count.py:lm"]["design"]["findings"]["A-h1"]["sd"] > 0  # from its plan file

    same = _run("--out", str(tmp_path / "again.json"), "--compare", str(out))
    assert same.returncode == 0 and f"{len(names)} resolved configs in both" in same.stdout
    assert "0 differ in some value, 0 under the identity rule" in same.stdout
    assert f"{len(designs)} experiment presets in both (0 only before, 0 only after); 0 with another" in same.stdout

    before = json.loads(out.read_text())  # "before": one trial trained another head count, one lacked a key,
    first = names[0]  # and one preset planned with another sd
    second = next(n for n in names[1:] if flat(resolved[n])["train.weight_decay"] == DEFAULT_WEIGHT_DECAY)
    before["configs"][first]["model"]["num_heads"] += 1
    del before["configs"][second]["train"]["weight_decay"]  # absent: compares at today's default, the value it has
    before["designs"]["experiments/head_count.py:lm"]["design"]["findings"]["A-h1"]["sd"] = 0.5
    (tmp_path / "before.json").write_text(json.dumps(before))
    changed = _run("--out", str(tmp_path / "after.json"), "--compare", str(tmp_path / "before.json"))
    assert changed.returncode == 1
    assert "2 differ in some value, 1 under the identity rule" in changed.stdout
    assert f"identity: {first}: model.num_heads:" in changed.stdout
    assert "1 with another name, seeds or design" in changed.stdout
    assert "design: experiments/head_count.py:lm: design:" in changed.stdout


# Presets given a new design on purpose since 72bccb1: each is compared as a new preset (its old design stays, under
# the name given here, at the same trials and configs).
CHANGED_ON_PURPOSE = {  # issue 59: the core tables' quick presets judge translation; the language model is ':lm'
    "experiments/head_count.py:quick": "experiments/head_count.py:lm",
    "experiments/pruning.py:quick": "experiments/pruning.py:lm",
    "experiments/diversity.py:quick": "experiments/diversity.py:lm",
}


def _of(key: str, presets) -> bool:
    return any(key == p or key.startswith(p + "/") for p in presets)


def test_the_declared_experiments_resolve_to_the_trials_and_designs_of_the_files_they_replaced(tmp_path):
    """Issue 58's refactor changed no preset that stays: against every preset resolved at 72bccb1 (before experiments
    were declared; their pilot numbers then typed into the files, now in experiments/plans/), each kept preset has the
    same trials, configs, sweep name, seeds and design; only the retired presets are gone, and each preset changed on
    purpose (``CHANGED_ON_PURPOSE``) keeps its old design, trials and configs under the preset name given there."""
    from attn_lab.sweep.spec import RETIRED

    with gzip.open(os.path.join(ROOT, "tests", "data", "resolved_presets_72bccb1.json.gz"), "rt") as f:
        before = json.load(f)
    kept = {part: {k: v for k, v in before[part].items() if not _of(k, CHANGED_ON_PURPOSE)} for part in before}
    (tmp_path / "kept.json").write_text(json.dumps(kept))  # the changed ones come back as presets 'only after'
    proc = _run("--out", str(tmp_path / "now.json"), "--compare", str(tmp_path / "kept.json"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ", 0 under the identity rule" in proc.stdout
    assert "); 0 with another name, seeds or design" in proc.stdout  # presets added since are 'only after'
    now = json.loads((tmp_path / "now.json").read_text())
    assert {before["designs"][k]["name"] for k in set(before["designs"]) - set(now["designs"])} <= set(RETIRED)
    for name, moved in CHANGED_ON_PURPOSE.items():  # the old design is still there, under its own name
        assert before["designs"][name] == now["designs"][moved], name
        old = {k[len(name):]: v for k, v in before["configs"].items() if _of(k, [name])}
        assert old and old == {k[len(moved):]: v for k, v in now["configs"].items() if _of(k, [moved])}, name
        assert now["designs"][name]["name"] != before["designs"][name]["name"], name  # a new sweep name
