"""Long Range Arena (Tay et al. 2020, arXiv 2011.04006): ListOps accuracy per efficient Transformer (Table 1) and
its speed and memory against the vanilla Transformer (Table 3), numbers copied from the paper."""

# Table 1, ListOps test accuracy (%), keyed by this lab's kernel names.
LRA_LISTOPS = {"dense": 36.37, "local": 15.82, "linformer": 35.70, "lsh": 37.27, "bigbird": 36.05, "linear": 16.13,
               "performer": 18.01, "longformer": 35.63, "strided": 17.07}
# Table 3: (steps per second at 1K, at 4K) relative to the Transformer (byte-level text, batch 32, TPU v3).
LRA_SPEED = {"dense": (1.0, 1.0), "local": (1.1, 5.3), "linformer": (1.2, 5.5), "lsh": (0.5, 0.8),
             "bigbird": (0.9, 1.1), "linear": (1.1, 5.6), "performer": (1.2, 5.7)}
