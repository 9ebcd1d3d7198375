"""Lab: a JAX/Flax research framework for nineteen NeurIPS 2026 methods."""

from setuptools import find_packages, setup

setup(
    name="lab",
    version="0.1.0",
    description="JAX/Flax research framework: one core, nineteen methods.",
    license="Apache-2.0",
    python_requires=">=3.11",
    # experiments/ and configs/ are not installed: they run from the checkout
    # (``python -m experiments.reproduce`` from the repository root).
    packages=find_packages(include=["lab", "lab.*", "kernels_pallas", "kernels_pallas.*"]),
    # The zoo's shipped weights (lab/zoo/weights/<name>-<digest>/), read by lab.zoo.load, and
    # the methods' shipped bundles (lab/zoo/assets/<name>-<digest>/, lab.zoo.bundle).
    package_data={"lab.zoo": ["weights/*/*.json", "weights/*/*.safetensors",
                              "assets/*/*.json", "assets/*/*.safetensors"]},
    # What lab/ and kernels_pallas/ import, and nothing else.
    install_requires=[
        "jax",
        "flax",
        "optax",
        "orbax-checkpoint",
        "absl-py",
        "ml_collections",
        "datasets",
        "safetensors",
        "tokenizers",
        "tqdm",
        "matplotlib",
        "numpy",
        "scipy",
        "ml_dtypes",
        # lab.methods.geosym: exact answers.
        "sympy>=1.12",
    ],
    extras_require={
        # torch is pinned to the CPU wheel on disk; any other spec pulls a multi-GB CUDA build.
        # kvpress (the KV-policy parity test) pins transformers<5.3, so the README installs
        # it with --no-deps; requests, cachetools and fire are what its import needs.
        "test": ["pytest", "pytest-xdist", "torch==2.13.0", "transformers", "networkx",
                 "blackjax", "scikit-learn", "nbclient", "ipykernel",
                 "requests", "cachetools", "fire", "mpmath",
                 "tensorflow-datasets>=4.9.7", "array_record>=0.8",
                 # lab.methods.tar.bertscore's parity test against the reference package
                 "bert-score==0.3.13",
                 # TCR's intervention engine is cross-checked against DoWhy's gcm
                 "dowhy==0.14"],
        # benchmarks/: the references they time Lab against (trl for benchmarks/rl.py).
        "bench": ["torch==2.13.0", "transformers", "trl==1.16.0", "networkx", "blackjax"],
        # lab.data.tfds (imported on use): prepares and reads array_record datasets without
        # TensorFlow.
        "tfds": ["tensorflow-datasets>=4.9.7", "array_record>=0.8", "importlib_resources"],
        "notebooks": ["nbclient", "ipykernel"],
    },
)
