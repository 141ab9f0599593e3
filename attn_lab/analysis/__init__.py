"""Head analysis of trained models: importance and masking ablations, per-head diagnostics."""
