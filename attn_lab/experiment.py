"""An experiment as a declaration: its arms, its findings and its presets, as data.

An experiment file (``experiments/<table>.py``, or any file of a researcher's own) declares

- ``PRESETS = {'quick': Preset(...), ...}``: each preset names its sweep, base config, budget overrides, the arms it
  trains (named variants: ``{'A-h8': {'model.num_heads': 8}}``), the seeds its verdict runs on (or
  :class:`Powered`: as many as its plan needs), the seeds its pilot runs on, and the findings it judges -- which arm
  is compared with which (``baseline``), in which metric (:class:`Metric`), with which margin;
- optionally ``report(rows, sweep_dir, exp, out_dir, bench) -> [Table]`` for the columns and plots that are its own
  (:func:`attn_lab.reporting.default.default_report` tables every arm and the verdicts), and
  ``differences(rows, sweep_dir, exp)`` where a finding is not one arm against the baseline (pruning curves).

What a pilot measured -- each finding's effect and paired sd -- is never typed into the file: ``attn-sweep
--experiment FILE:PRESET --pilot`` trains the pilot seeds and writes ``plans/<sweep name>.json`` beside the file
(:mod:`attn_lab.sweep.plans`), which the verdict run reads and registers. A plan records the :func:`fingerprint` of
the preset it was made for; a preset whose trials or findings changed since is refused until it is piloted again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

__all__ = ["Finding", "Metric", "Powered", "Preset", "budget", "fingerprint"]

Direction = Literal["up", "down", "same", "not_worse"]
DIRECTIONS = ("up", "down", "same", "not_worse")
MIN_PAIRS = 3  # the fewest seeds anything is decided on (attn_lab.reporting.plan reads it from here)


def budget(steps: int) -> dict[str, int]:
    """Overrides training ``steps`` steps, evaluated and checkpointed once, at the end (a fixed-budget arm)."""
    return {"train.num_steps": steps, "train.eval_every": steps, "train.checkpoint_every": steps}


def is_number(x: Any) -> bool:
    """An int or float, not a bool (``True`` is an int to Python, never a margin or an sd)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class Finding:
    """A published finding in one line, how it would show in our metric, and the paper's own number.

    Attributes:
      claim: the finding, e.g. 'one head is worse than eight (Table 3, rows A)'.
      paper: the paper's number as text, e.g. '-0.9 BLEU'.
      direction: 'up' / 'down' (the compared row's metric minus the baseline's should be > 0 / < 0 by at least
        ``margin``), 'same' (within ``margin`` either way) or 'not_worse' (loses less than ``margin``).
      margin: the smallest difference that counts as an effect, in the metric's units; fixed before a run.
      exploratory: a finding formed after looking at data of these seeds: shown, never in the Holm family.
    """

    claim: str
    paper: str
    direction: Direction
    margin: float
    exploratory: bool = False

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise ValueError(f"Finding({self.claim!r}): direction={self.direction!r}, allowed: {DIRECTIONS}")
        if not (is_number(self.margin) and self.margin > 0 and math.isfinite(self.margin)):
            raise ValueError(f"Finding({self.claim!r}): margin={self.margin!r} must be a positive number")


@dataclasses.dataclass(frozen=True)
class Metric:
    """The quantity a preset's findings are decided in.

    Attributes:
      key: the results.json field, e.g. ``'test_loss'`` (a trial's final test metric).
      label: how the verdict table names it, e.g. ``'minus the test loss (nats)'``.
      sign: -1 where lower is better (a loss): the difference is taken of ``sign * value``, so every finding
        reads 'higher is better'.
    """

    key: str
    label: str
    sign: float = 1.0

    def __post_init__(self):
        if not (isinstance(self.key, str) and self.key and isinstance(self.label, str)):
            raise ValueError(f"Metric(key={self.key!r}, label={self.label!r}): both must be strings, key non-empty "
                             "(a results.json field such as 'test_loss')")
        if self.sign not in (1.0, -1.0) or isinstance(self.sign, bool):
            raise ValueError(f"Metric({self.key!r}): sign={self.sign!r}; allowed: 1.0 (higher is better) or -1.0 "
                             "(lower is better, a loss)")


@dataclasses.dataclass(frozen=True)
class Powered:
    """Verdict seeds ``first, first + 1, ...``: as many as the preset's plan says give every finding with a pilot a
    chance of a verdict of 0.8 (:meth:`attn_lab.reporting.verdicts.Design.powered_seeds`), at most ``cap``."""

    first: int
    cap: int = 64

    def __post_init__(self):
        for field, low in (("first", 0), ("cap", MIN_PAIRS)):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < low or value >= 2**32:
                raise ValueError(f"Powered: {field}={value!r}; allowed: an integer seed count or seed >= {low}")


@dataclasses.dataclass(frozen=True)
class Preset:
    """One sweep of an experiment, as data (see the module docstring).

    Attributes:
      name: the sweep's name (W&B group, ``tables/``; names the plan file ``plans/<name>.json``).
      config: the base config, ``'configs/<task>.py[:preset]'``.
      arms: ``{arm: {'dotted.key': value}}``, one trial per arm and seed (a ``'{trial:<arm>}'`` value starts from
        that arm's finished trial of the same seed).
      seeds: the verdict run's seeds, or :class:`Powered`.
      findings: ``{key: Finding}``; a key names the compared arm (or what ``differences`` returns).
      baseline: the arm every finding is compared with (the default differences).
      metric: what decides (the default differences, the pilot's effects and sds).
      pilot_seeds: the seeds ``--pilot`` trains; never the verdict's.
      overrides: fixed ``{'dotted.key': value}`` of every trial (budgets).
      grid: ``{'dotted.key': [values]}`` crossed with the arms.
      analyze: flags of ``python -m attn_lab.analysis`` run on every finished trial.
      options: the experiment's own report parameters (e.g. which lengths are judged); part of the fingerprint.
    """

    name: str
    config: str
    arms: Mapping[str, Mapping[str, Any]]
    seeds: Sequence[int] | Powered = (0, 1, 2)
    findings: Mapping[str, Finding] = dataclasses.field(default_factory=dict)
    baseline: str | None = None
    metric: Metric | None = None
    pilot_seeds: Sequence[int] = (0, 1, 2, 3, 4)
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    grid: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)
    analyze: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        """One line naming the field, the value and what is allowed: a preset is checked when its file loads."""
        where = f"Preset({self.name!r})"
        for field in ("name", "config"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field).strip():
                raise ValueError(f"{where}: {field}={getattr(self, field)!r}; allowed: a non-empty string")
        for field in ("arms", "overrides", "grid", "analyze", "options", "findings"):
            if not isinstance(getattr(self, field), Mapping):
                raise ValueError(f"{where}: {field}={getattr(self, field)!r}; allowed: a dict")
        if not self.arms or not all(isinstance(k, str) and isinstance(v, Mapping) for k, v in self.arms.items()):
            raise ValueError(f"{where}: arms={self.arms!r}; allowed: a non-empty dict {{arm name: {{'dotted.key': "
                             "value}}")
        bad = next((k for k, f in self.findings.items() if not isinstance(f, Finding)), None)
        if bad is not None:
            raise ValueError(f"{where}: findings['{bad}']={self.findings[bad]!r}; allowed: an "
                             "attn_lab.experiment.Finding")
        if self.baseline is not None and self.baseline not in self.arms:
            raise ValueError(f"{where}: baseline={self.baseline!r} is not an arm; arms: {', '.join(self.arms)}")
        if self.metric is not None and not isinstance(self.metric, Metric):
            raise ValueError(f"{where}: metric={self.metric!r}; allowed: an attn_lab.experiment.Metric")
        seeds = [] if isinstance(self.seeds, Powered) else self.seeds
        for field, values in (("seeds", seeds), ("pilot_seeds", self.pilot_seeds)):
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not all(
                    isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**32 for s in values):
                raise ValueError(f"{where}: {field}={values!r}; allowed: a list of integer seeds in [0, 2**32 - 1]"
                                 + (" or Powered(first)" if field == "seeds" else ""))
            if len(set(values)) != len(values) or (field == "seeds" and not values and
                                                   not isinstance(self.seeds, Powered)):
                raise ValueError(f"{where}: {field}={list(values)!r}; give each seed once, at least one")

    def replace(self, **changes: Any) -> "Preset":
        """A copy with ``changes`` (presets built from presets: ``LM.replace(name=..., findings=...)``)."""
        return dataclasses.replace(self, **changes)


def fingerprint(preset: Preset) -> str:
    """The first 16 hex digits of the sha256 of what a pilot's numbers depend on: the config, overrides, arms, grid,
    analysis and options (what is trained and measured) and each finding's comparison (key, direction, margin), the
    baseline and the metric (what is judged). Seeds, claims' wording and published numbers are left out: a plan
    stays valid when they change."""
    judged = {k: [f.direction, f.margin, f.exploratory] for k, f in preset.findings.items()}
    metric = None if preset.metric is None else [preset.metric.key, preset.metric.sign]
    body = {"config": preset.config, "overrides": preset.overrides, "arms": preset.arms, "grid": preset.grid,
            "analyze": preset.analyze, "options": preset.options, "findings": judged, "baseline": preset.baseline,
            "metric": metric}
    text = json.dumps(body, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
