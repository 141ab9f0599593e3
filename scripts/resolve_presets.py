"""Every config preset and every trial of every experiment preset, resolved: the identity check of a refactor.

  python scripts/resolve_presets.py --out /tmp/after.json                      # resolve all, write them
  python scripts/resolve_presets.py --out /tmp/after.json --compare /tmp/before.json

Run it on the commit before a refactor (``PYTHONPATH=<old checkout>`` keeps this script but imports the old package)
and after: ``--compare`` prints how many resolved configs differ in any value and how many under the run-identity
rule (:func:`attn_lab.train.identity.differences`: what a run uses, keys absent at their default), and exits 1 when
one differs under the identity rule -- a refactor that changes what a recorded run or a finished sweep trial is.
Each config is resolved as its run resolves it: the config file's preset, then a trial's overrides, as
``python -m attn_lab.train`` does (:func:`attn_lab.sweep.runner.trial_config`).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import importlib.util
import json
import os
import re
import sys


def _root() -> str:
    """The checkout whose package is imported (with ``PYTHONPATH=<old checkout>``, the old one's configs too)."""
    import attn_lab

    return os.path.dirname(os.path.dirname(os.path.abspath(attn_lab.__file__)))


def _presets(path: str, function: str) -> list[str]:
    """A config or experiment file's presets, read from the error its ``function`` raises for an unknown one
    (``...; use 'a', 'b' or 'c'``), so a new file or preset is covered without editing this script."""
    spec = importlib.util.spec_from_file_location(f"_presets_{os.path.basename(path)[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if isinstance(getattr(module, "PRESETS", None), dict):  # a declared experiment (attn_lab.experiment)
        return list(module.PRESETS)
    try:
        getattr(module, function)("__no_such_preset__")
    except ValueError as e:
        return [name.strip("'") for name in re.split(r", | or ", str(e).split("; use ", 1)[1])]
    raise SystemExit(f"error: {path}: {function}('__no_such_preset__') did not refuse the preset")


def resolve_all() -> dict[str, dict]:
    """``{'configs': {'configs/x.py:preset': config dict, 'experiments/y.py:preset/<trial>': config dict},
    'designs': {'experiments/y.py:preset': {'name', 'seeds', 'design'}}}``: every config as its run resolves it, and
    every experiment preset's sweep name, seeds and design (what its verdict run registers; the pilot's description
    left out: it names where the numbers came from, not what they are)."""
    from attn_lab.sweep.runner import trial_config
    from attn_lab.sweep.spec import load_config_file, load_experiment

    out: dict[str, dict] = {}
    designs: dict[str, dict] = {}
    root = _root()
    for path in sorted(glob.glob(os.path.join(root, "configs", "*.py"))):
        for preset in _presets(path, "get_config"):
            name = f"configs/{os.path.basename(path)}:{preset}"
            out[name] = load_config_file(f"{path}:{preset}" if preset else path).to_dict()
    for path in sorted(glob.glob(os.path.join(root, "experiments", "*.py"))):
        for preset in _presets(path, "get_experiment"):
            exp = load_experiment(f"{path}:{preset}")
            record = exp.design.record() if exp.design else None
            if record:
                record.pop("pilot", None)
            designs[f"experiments/{os.path.basename(path)}:{preset}"] = {"name": exp.name, "seeds": list(exp.seeds),
                                                                         "design": record}
            for trial in exp.trials():
                name = f"experiments/{os.path.basename(path)}:{preset}/{trial.name}"
                out[name] = trial_config(exp, trial, [], "/identity-check")  # absolute: the same on both checkouts
    return json.loads(json.dumps({"configs": out, "designs": designs}))  # as a record holds it (tuples as lists)


def compare(before: dict[str, dict], after: dict[str, dict]) -> int:
    """Prints the counts and the first differences; returns the number of configs that differ under the identity
    rule plus the number of presets (in both) whose sweep name, seeds or design changed."""
    designs_before, designs_after = before.get("designs", {}), after.get("designs", {})
    changed = _compare_configs(before.get("configs", before), after.get("configs", after))
    common = sorted(set(designs_before) & set(designs_after))
    moved = [n for n in common if designs_before[n] != designs_after[n]]
    print(f"{len(common)} experiment presets in both ({len(set(designs_before) - set(designs_after))} only before, "
          f"{len(set(designs_after) - set(designs_before))} only after); {len(moved)} with another name, seeds or "
          "design")
    for name in moved[:10]:
        old, new = designs_before[name], designs_after[name]
        keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        print(f"  design: {name}: " + "; ".join(f"{k}: {json.dumps(old.get(k))[:150]} -> {json.dumps(new.get(k))[:150]}"
                                               for k in keys))
    return changed + len(moved)


def _compare_configs(before: dict[str, dict], after: dict[str, dict]) -> int:
    """The resolved configs' counts and first differences; the number that differ under the identity rule."""
    from attn_lab.train.identity import differences, flat

    common = sorted(set(before) & set(after))
    valued = [n for n in common if flat(before[n]) != flat(after[n])]
    identity = [(n, differences(before[n], after[n])) for n in common]
    identity = [(n, d) for n, d in identity if d]
    print(f"{len(common)} resolved configs in both ({len(set(before) - set(after))} only before, "
          f"{len(set(after) - set(before))} only after); {len(valued)} differ in some value, "
          f"{len(identity)} under the identity rule")
    for name in valued[:5]:
        old, new = flat(before[name]), flat(after[name])
        keys = sorted(k for k in old.keys() | new.keys() if old.get(k, "(absent)") != new.get(k, "(absent)"))
        print(f"  value: {name}: " + ", ".join(f"{k}: {old.get(k, '(absent)')!r} -> {new.get(k, '(absent)')!r}"
                                            for k in keys[:4]))
    for name, diffs in identity[:10]:
        print(f"  identity: {name}: " + ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diffs[:4]))
    return len(identity)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write the resolved configs to")
    parser.add_argument("--compare", help="a --out file of another commit to compare with (.json or .json.gz; "
                        "tests/data/resolved_presets_72bccb1.json.gz: every preset before experiments were declared)")
    args = parser.parse_args()
    resolved = resolve_all()
    with open(args.out, "w") as f:
        json.dump(resolved, f, indent=1, sort_keys=True)
    print(f"wrote {len(resolved['configs'])} resolved configs and {len(resolved['designs'])} experiment presets to "
          f"{args.out}")
    if args.compare:
        opener = gzip.open if args.compare.endswith(".gz") else open
        with opener(args.compare, "rt") as f:
            return 1 if compare(json.load(f), resolved) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
