"""Head diversity: Li et al. 2018 ("Multi-Head Attention with Disagreement Regularization"), and the map-cosine
hinge's source. Checked where a copy was found: docs/published.md."""

# Li et al. 2018, BLEU without -> with the disagreement regularizer (lambda = 1). From a secondary write-up of the
# paper (no copy of its body found; docs/published.md).
LI_DIVERSITY = {"zh-en base": (24.13, 24.85), "en-de base": (27.64, 28.51), "en-de big": (28.58, 29.28)}
# Source article 002 (the map-cosine hinge sum_{i<j} relu(cos(A_i, A_j) - 0.5)): its claimed gain, not checked.
MAP_COSINE_GAIN = "+0.3 GLUE average (unverified)"
