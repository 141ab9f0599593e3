"""Per-head attention statistics, re-exported from :mod:`attn_lab.train.diagnostics`.

They live in ``train`` because the trainer logs them (``config.heads.track``) and training must not import
analysis. This name stays for callers outside the package that import ``attn_lab.analysis.diagnostics``
(tests/test_dynamic.py); new code imports ``attn_lab.train.diagnostics``.
"""

from attn_lab.train.diagnostics import (layer_report, map_similarity, mean_distance, normalized_entropy,
                                        pairwise_divergences, position_bias, zero_share)

__all__ = ["layer_report", "map_similarity", "mean_distance", "normalized_entropy", "pairwise_divergences",
           "position_bias", "zero_share"]
