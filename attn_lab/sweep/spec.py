"""Experiment files -> validated trials.

An experiment file declares ``PRESETS = {'quick': Preset(...), ...}`` (:mod:`attn_lab.experiment`): each preset's
sweep name, base config, fixed overrides, arms, seeds, pilot seeds and the findings it judges, as data; what its
pilot measured comes from its plan file (:mod:`attn_lab.sweep.plans`), never from the file. Beside ``PRESETS`` it may
define ``report(rows, sweep_dir, exp, out_dir, bench) -> [Table]`` (default:
:func:`attn_lab.reporting.default.default_report`), ``differences(rows, sweep_dir, exp)`` (default: each finding's
arm against the baseline) and ``pilot_measures(rows, sweep_dir, exp) -> dict`` (what else its plan records).

A file may instead define ``get_experiment(preset) -> dict`` with keys:

- ``name``: the sweep's name (also the W&B group of every trial);
- ``config``: the base config, ``'configs/<task>.py[:preset]'``; a relative path is looked up next to the experiment
  file first, then in the project root (the repository this package lives in), so an experiment file anywhere on
  disk can name the shipped configs or its own;
- ``overrides``: fixed ``{'dotted.key': value}`` applied to every trial;
- ``grid``: ``{'dotted.key': [values]}``, crossed as a product;
- ``zip``: a list of ``{'dotted.key': [values], ...}`` groups whose lists advance together (one axis each);
- ``variants``: ``{'name': {'dotted.key': value, ...}}``, one axis of named settings (``variant=<name>`` in the trial
  name). A variant's value ``'{trial:<variant>}'`` names the trial of that variant at the same point and seed (e.g.
  ``'train.init_from': '{trial:A-h8}'``: GQA uptrained from each seed's finished 8-head run); such a trial runs
  once the one it names has finished;
- ``seeds``: list of seeds (crossed with everything else);
- ``analyze``: ``{'what': 'ablate,prune', 'metric': 'bleu', ...}``: flags of ``python -m attn_lab.analysis`` (key
  ``max_batches`` -> ``--max-batches``; a list value is written comma-separated), run on every trial once it
  finishes (skipped when its ``analysis/<method>.json`` files exist);
- ``design``: an :class:`attn_lab.reporting.verdicts.Design` (findings, margins, pilot numbers).

Everything is checked against the base config before any trial starts: unknown keys, empty axes, zipped lists of
unequal length and duplicate trials each stop with one line.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
from typing import Any

import ml_collections

from attn_lab import plugins
from attn_lab.checks import call_user_function, check_seed, load_user_module
from attn_lab.experiment import Powered, Preset
from attn_lab.reporting.plan import MIN_PAIRS
from attn_lab.reporting.verdicts import Design
from attn_lab.sweep import plans

KEYS = ("name", "config", "overrides", "grid", "zip", "variants", "seeds", "analyze", "design")
# key -> (type, what it must be): the shape of what get_experiment returns
SHAPES: dict[str, tuple[type, str]] = {
    "name": (str, "a non-empty string"), "config": (str, "a string 'configs/<task>.py[:preset]'"),
    "overrides": (dict, "a dict {'dotted.key': value}"), "grid": (dict, "a dict {'dotted.key': [values]}"),
    "zip": ((list, tuple), "a list of dicts {'dotted.key': [values]}"),
    "variants": (dict, "a dict {'name': {overrides}}"),
    "seeds": ((list, tuple), "a list of seeds"), "analyze": (dict, "a dict of analysis flags"),
    "design": (Design, "an attn_lab.reporting.verdicts.Design (findings, margins, pilot sds)"),
}
REQUIRED = ("name", "config")
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # shipped configs/


TRIAL_REF = re.compile(r"^\{trial:([^{}]+)\}$")  # a variant's value naming another variant's trial
SWEEP_FIELD = "{sweep}"  # in a resolved reference: the sweep's folder, filled in by the runner


@dataclasses.dataclass(frozen=True)
class Trial:
    """One training run of a sweep: its folder name, the overrides that define it (seed included) and its swept
    values (``point``: what names it; a variant appears by name, its overrides are in ``overrides``). ``after``:
    the trials it starts from (``{trial:<variant>}`` references), which must finish first."""

    name: str
    overrides: dict[str, Any]
    point: dict[str, Any] = dataclasses.field(default_factory=dict)
    after: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    config: str  # '/abs/path/x.py[:preset]', resolved by :func:`resolve_config`
    root: str  # the project root, where relative config paths not next to the experiment file are looked up
    overrides: dict[str, Any]
    axes: list[list[dict[str, Any]]]  # each axis: its points, a point being {key: value} ('variant': a name)
    seeds: list[int]
    variants: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    analyze: dict[str, Any] = dataclasses.field(default_factory=dict)
    report_fn: Any = None  # the experiment file's ``report`` function, if it defines one
    design: Design | None = None  # what the preset promises before it runs (attn_lab.reporting.verdicts)
    judge: str = "registered"  # tables: judge the design registered in sweep.json, or 'current': the file's own
    preset: Preset | None = None  # the declaration (a PRESETS file), else None (a get_experiment file)
    plan: dict[str, Any] | None = None  # the preset's plan file, as read
    plan_path: str = ""
    plan_problem: str | None = None  # why the plan cannot plan a verdict run now (stale, missing for Powered seeds)
    differences_fn: Any = None  # the file's ``differences``; None: each finding's arm against the baseline
    measures_fn: Any = None  # the file's ``pilot_measures``; None: the plan records nothing more

    def trials(self) -> list[Trial]:
        """Every combination of the axes and seeds, named from its swept values; a ``{trial:<variant>}`` value
        becomes that trial's folder (``{sweep}/<name with seed={seed}>``, filled in per run) and its ``after``."""
        out = []
        for combo in itertools.product(*self.axes, [{"seed": s} for s in self.seeds]):
            point = {k: v for part in combo for k, v in part.items()}
            overrides = {**self.overrides, **self.variants.get(point.get("variant"), {}),
                         **{k: v for k, v in point.items() if k != "variant"}}
            refs = {k: _ref(v) for k, v in overrides.items() if _ref(v) is not None}
            after = tuple(dict.fromkeys(_trial_name({**point, "variant": r}) for r in refs.values()))
            seed_suffix = f"seed={point['seed']}"
            for key, ref in refs.items():  # the named trial's folder, its seed left to each run
                source = _trial_name({**point, "variant": ref})[:-len(seed_suffix)]
                overrides[key] = f"{SWEEP_FIELD}/{source}seed={{seed}}"
            out.append(Trial(name=_trial_name(point), overrides=overrides, point=point, after=after))
        return out

    def swept_keys(self) -> list[str]:
        return [k for axis in self.axes for k in axis[0]] + ["seed"]

    def varied_keys(self) -> dict[str, str]:
        """Every config key some trials set differently -> where it is varied (an axis, a variant, the seeds)."""
        varied = {k: "an axis" for axis in self.axes for k in axis[0] if k != "variant"}
        for name, overrides in self.variants.items():
            for key in overrides:
                varied.setdefault(key, f"variant '{name}'")
        return varied | {"seed": "the seeds; use --seeds"}

    def check_pass_through(self, overrides: dict[str, str]) -> None:
        """A ``--config.key=value`` passed to every trial must not set a key the sweep varies: it would change those
        trials while the results and tables name the swept values (a parent or child key collides too)."""
        for key, value in overrides.items():
            for varied, where in self.varied_keys().items():
                if key == varied or key.startswith(varied + ".") or varied.startswith(key + "."):
                    raise ValueError(f"--config.{key}={value}: '{varied}' is varied by this sweep ({where}); an "
                                     "override of it would change those trials while the tables show the swept "
                                     "values -- change the experiment file instead")


def _trial_name(point: dict[str, Any]) -> str:
    """A trial's folder name from its swept values (the seed last)."""
    return re.sub(r"[^\w=,.+-]", "_", ",".join(f"{k.split('.')[-1]}={_text(v)}" for k, v in point.items()))


def _ref(value: Any) -> str | None:
    """The variant a ``'{trial:<variant>}'`` value names; None for any other value."""
    match = TRIAL_REF.match(value) if isinstance(value, str) else None
    return match.group(1) if match else None


def _check_refs(path: str, variants: dict[str, dict[str, Any]]) -> None:
    """Each ``{trial:<variant>}`` names another variant, one that starts from no trial itself (no chains, no
    cycles), in one line otherwise."""
    starts = {name for name, ov in variants.items() if any(_ref(v) is not None for v in ov.values())}
    for name, ov in variants.items():
        for key, value in ov.items():
            ref = _ref(value)
            if ref is not None and (ref not in variants or ref in starts):
                why = "no such variant" if ref not in variants else "it starts from a trial itself"
                raise ValueError(f"{path}: variant '{name}': {key}={value!r}: {why}; name a variant that trains "
                                 f"from scratch ({', '.join(v for v in variants if v not in starts)})")


def _check_ref_places(path: str, overrides: dict[str, Any], axes: list, variants: dict[str, dict[str, Any]]) -> None:
    """``{trial:...}`` is a whole value of a variant's override and nothing else: in the fixed overrides, an axis,
    or inside a longer string it would reach the trials as a literal path that does not exist (one line instead)."""
    places = [("overrides", k, v) for k, v in overrides.items()]
    places += [("grid", k, v) for axis in axes for point in axis for k, v in point.items() if k != "variant"]
    places += [(f"variant '{n}'", k, v) for n, ov in variants.items() for k, v in ov.items() if _ref(v) is None]
    for where, key, value in places:
        if "{trial:" in str(value):
            raise ValueError(f"{path}: {where}: {key}={value!r}: '{{trial:<variant>}}' can only be the whole value "
                             "of a variant's override (that variant then starts from the named variant's trial)")


def _text(value: Any) -> str:
    return "-".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def load_config_file(path: str) -> ml_collections.ConfigDict:
    """``'configs/x.py[:arg]'`` -> ``get_config(arg)``, as ml_collections' config flags load it; a file that does
    not load or run is one line naming the file and line (:func:`attn_lab.checks.load_user_module`)."""
    file, _, arg = path.partition(":")
    if not os.path.exists(file):
        raise ValueError(f"config file not found: {file}")
    module = load_user_module(file, "_attn_lab_config")
    return call_user_function(file, module, "get_config", *([arg] if arg else []))


def _check_key(config: ml_collections.ConfigDict, key: str, where: str) -> None:
    """``key`` names a field of ``config``: ConfigDict resolves the dotted path itself (a KeyError for a missing
    field, a TypeError for a sub-key of a plain value)."""
    try:
        config[key]
    except (KeyError, TypeError):
        hint = plugins.unregistered(key)
        raise ValueError(f"{where}: unknown config key '{key}'" + (f": {hint}" if hint else "")) from None


def resolve_config(config: str, experiment: str, root: str) -> str:
    """An experiment's ``config`` (``'path.py[:preset]'``) with an absolute path: as given when absolute, else
    next to the experiment file, else in ``root``; a one-line ValueError naming both places when neither has it."""
    file, sep, preset = config.partition(":")
    file = os.path.expanduser(file)
    folders = [""] if os.path.isabs(file) else [os.path.dirname(os.path.abspath(experiment)), os.path.abspath(root)]
    found = next((os.path.join(f, file) for f in folders if os.path.isfile(os.path.join(f, file))), None)
    if found is None:
        where = f" in {' or '.join(dict.fromkeys(folders))}" if folders != [""] else ""
        raise ValueError(f"{experiment}: config={config!r}: config file not found{where}")
    return os.path.normpath(found) + sep + preset


def load_experiment(spec: str, root: str | None = None) -> Experiment:
    """``'experiments/x.py:preset'`` -> a validated :class:`Experiment` (raises a one-line ValueError).

    Args:
      spec: the experiment file, anywhere on disk, with an optional ``:preset`` (default ``quick``).
      root: the project root (default: the repository of this package), where relative config paths not found
        next to the experiment file are looked up (the shipped ``configs/``). Nothing is launched from it: trials
        and the analysis run the package's entry points (``python -m attn_lab.train`` / ``attn_lab.analysis``).
    """
    path, _, preset = spec.partition(":")
    if not os.path.exists(path):
        raise ValueError(f"experiment file not found: {path}")
    if not os.path.isfile(path):
        raise ValueError(f"--experiment={spec}: {path} is a folder, not an experiment file")
    raw, module, declared = _raw_experiment(path, preset or "quick")
    root = root or PROJECT_ROOT
    config_path = resolve_config(raw["config"], path, root)
    try:
        base = load_config_file(config_path)
    except ValueError as e:
        raise ValueError(f"{path}: config={raw['config']!r}: {e}") from None
    axes = [[{k: v} for v in _values(path, k, vs)] for k, vs in raw.get("grid", {}).items()]
    for group in raw.get("zip", []):
        lengths = {k: len(_values(path, k, vs)) for k, vs in group.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"{path}: zipped axes have unequal lengths {lengths}")
        axes.append([dict(zip(group, point)) for point in zip(*group.values())])
    variants = raw.get("variants", {})
    if "variants" in raw:
        if not variants:
            _empty(path, "variants")
        axes.append([{"variant": name} for name in variants])
    _check_refs(path, variants)
    _check_ref_places(path, raw.get("overrides", {}), axes, variants)
    variant_keys = [k for ov in variants.values() for k in ov]
    for key in [*raw.get("overrides", {}), *(k for axis in axes for k in axis[0] if k != "variant"), *variant_keys]:
        _check_key(base, key, path)
    seeds = _values(path, "seeds", raw.get("seeds", [0]))
    for seed in seeds:
        check_seed(seed, f"{path}: seeds")
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        raise ValueError(f"{path}: seeds: seed {twice[0]} is given twice; give each seed once")
    exp = Experiment(name=raw["name"], config=config_path, root=root, overrides=dict(raw.get("overrides", {})),
                     axes=axes, seeds=seeds, variants=dict(variants), analyze=dict(raw.get("analyze", {})),
                     report_fn=getattr(module, "report", None), design=raw.get("design"),
                     differences_fn=getattr(module, "differences", None),
                     measures_fn=getattr(module, "pilot_measures", None), **declared)
    names = [t.name for t in exp.trials()]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise ValueError(f"{path}: duplicate trial '{duplicate}'")
    return exp


# Presets retired from the shipped experiments (their story is on each experiment's docs page): sweep name -> the
# last commit whose experiment files build it. A folder recorded under one is refused in one line naming that commit.
RETIRED_AT = "72bccb1"
RETIRED = dict.fromkeys(("head_count_powered", "head_count_sharp", "head_count_sharp_curve", "head_count_bible",
                         "head_count_bible_all", "dynamic_listops_quick", "dynamic_listops_full", "dynamic_lm_full",
                         "recall_state_sinusoidal", "variants_long"), RETIRED_AT)


def recorded_preset(path: str, preset: str, name: str) -> str:
    """The preset of ``path`` that builds the sweep a folder recorded as ``preset`` under ``name``: ``preset`` while
    it still builds ``name``, else the declared preset whose sweep is ``name`` (a preset renamed since: a sweep is
    known by its name). A one-line ValueError when none does -- its trials would be tabulated or resumed as another
    experiment's -- naming the last commit that builds it where the preset was retired."""
    module = load_user_module(path, "_attn_lab_experiment")
    presets = getattr(module, "PRESETS", None)
    if isinstance(presets, dict):
        builds = {p: getattr(v, "name", None) for p, v in presets.items()}
    else:
        try:  # a get_experiment file: only the recorded preset itself can build it
            now = call_user_function(path, module, "get_experiment", preset)
        except ValueError:
            now = None
        builds = {preset: now.get("name") if isinstance(now, dict) else None}
    if builds.get(preset) == name:
        return preset
    found = [p for p, n in builds.items() if n == name]
    if found:
        return found[0]
    said = f"'{preset}' builds '{builds[preset]}'" if builds.get(preset) else f"it has no preset '{preset}'"
    retired = (f"; that preset was retired after commit {RETIRED[name]}: tabulate or resume this folder from a "
               f"checkout of {RETIRED[name]}" if name in RETIRED else "")
    raise ValueError(f"the sweep '{name}' was recorded from {path}:{preset}, and no preset of that file builds it "
                     f"now ({said}){retired}")


def _raw_experiment(path: str, preset: str) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """(``get_experiment(preset)`` of the file or its declared preset with its plan, checked for its keys and their
    types (one line each), the module, the declaration's own fields of :class:`Experiment`)."""
    module = load_user_module(path, "_attn_lab_experiment")
    if hasattr(module, "PRESETS"):
        return _declared(path, module, preset)
    if not callable(getattr(module, "get_experiment", None)):
        raise ValueError(f"{path}: no get_experiment(preset) function")
    raw = call_user_function(path, module, "get_experiment", preset)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: get_experiment({preset!r}) must return a dict, got {type(raw).__name__}")
    unknown = set(raw) - set(KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown experiment key '{sorted(unknown)[0]}'; allowed: {', '.join(KEYS)}")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise ValueError(f"{path}: experiment key '{missing[0]}' is missing; it needs {', '.join(REQUIRED)}")
    for key, value in raw.items():
        kind, what = SHAPES[key]
        if not isinstance(value, kind) or (key == "name" and not value.strip()):
            raise ValueError(f"{path}: experiment key '{key}' must be {what}, got {value!r}")
    for key, items in (("zip", raw.get("zip", [])), ("variants", raw.get("variants", {}).values())):
        if not all(isinstance(item, dict) for item in items):
            raise ValueError(f"{path}: experiment key '{key}' must be {SHAPES[key][1]}, got {raw[key]!r}")
    return raw, module, {}


def preset_names(path: str, presets: Any) -> str:
    """``'a, b or c'``: the presets a file declares, as its unknown-preset line lists them."""
    names = list(presets)
    return ", ".join(names[:-1]) + (" or " if len(names) > 1 else "") + names[-1]


def declared_preset(path: str, module: Any, preset: str) -> Preset:
    """The :class:`Preset` ``preset`` of a file's ``PRESETS``, in one line when it has none or it is not one."""
    presets = module.PRESETS
    shown = os.path.join(os.path.basename(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
    if not isinstance(presets, dict) or not presets or not all(isinstance(p, Preset) for p in presets.values()):
        raise ValueError(f"{path}: PRESETS must be a non-empty dict {{name: attn_lab.experiment.Preset}}")
    if preset not in presets:
        raise ValueError(f"unknown preset '{preset}' for {shown}; use {preset_names(path, presets)}")
    owner: dict[str, str] = {}
    for key, value in presets.items():  # a sweep is known by its name: two presets building one are one preset
        first = owner.setdefault(value.name, key)
        if presets[first] is not value:
            raise ValueError(f"{path}: presets '{first}' and '{key}' both build the sweep '{value.name}'; give each "
                             "its own name (an alias is the same Preset object)")
    return presets[preset]


def _declared(path: str, module: Any, name: str) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """A declared preset as ``get_experiment`` would return it, its design read from its plan file (Powered seeds:
    as many as that plan needs), and the fields :class:`Experiment` keeps of the declaration."""
    preset = declared_preset(path, module, name)
    path_of_plan = plans.plan_path(path, preset.name)
    plan = plans.read_plan(path_of_plan)
    problem = plans.plan_problem(plan, preset, path_of_plan, f"{path}:{name}")
    try:
        design = plans.design_of(preset, plan, path_of_plan)
    except (ValueError, TypeError) as e:  # a plan edited by hand: its numbers are not a design's
        raise ValueError(f"{path_of_plan}: {e}; re-pilot: {plans.pilot_command(f'{path}:{name}')}") from None
    seeds = list(preset.seeds) if not isinstance(preset.seeds, Powered) else None
    if seeds is None:
        first, cap = preset.seeds.first, preset.seeds.cap
        if plan is None or problem:
            seeds = list(range(first, first + MIN_PAIRS))
            problem = problem or (f"{path}:{name} takes as many seeds as its plan needs, and {path_of_plan} does not "
                                  f"exist; pilot it first: {plans.pilot_command(f'{path}:{name}')}")
        else:
            try:
                seeds = design.powered_seeds(first)[:cap]
            except ValueError:  # no finding can be powered: each is exploratory, the cap decides (as --max-seeds)
                seeds = list(range(first, first + cap))
    for key in [*preset.findings, *([preset.baseline] if preset.baseline else [])]:
        if getattr(module, "differences", None) is None and key not in preset.arms:
            raise ValueError(f"{path}:{name}: finding or baseline '{key}' is not an arm; arms: "
                             f"{', '.join(preset.arms)}")
    raw = {"name": preset.name, "config": preset.config, "overrides": dict(preset.overrides),
           "grid": {k: list(v) for k, v in preset.grid.items()},
           "variants": {k: dict(v) for k, v in preset.arms.items()}, "seeds": seeds, "analyze": dict(preset.analyze),
           "design": design}
    raw = {k: v for k, v in raw.items() if v or k in ("variants", "seeds")}
    return raw, module, {"preset": preset, "plan": plan, "plan_path": path_of_plan, "plan_problem": problem}


def _values(path: str, key: str, values: Any) -> list:
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{path}: axis '{key}' must be a list of values, got {values!r}")
    if not values:
        _empty(path, key)
    return list(values)


def _empty(path: str, key: str):
    raise ValueError(f"{path}: axis '{key}' is empty (give a non-empty list)")
