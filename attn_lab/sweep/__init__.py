"""Ablation sweeps from one experiment file: trial specs, a local runner and results collection."""

from attn_lab.sweep.spec import Experiment, Trial, load_experiment

__all__ = ["Experiment", "Trial", "load_experiment"]
