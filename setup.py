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
    ],
    extras_require={"test": ["pytest>=8.0"]},
)
