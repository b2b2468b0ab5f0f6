"""Test setup: 8 fake CPU devices (so sharding runs on one machine), float32 matmuls, markers.

XLA_FLAGS must be set before jax is imported anywhere, hence here at conftest import time.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No persistent compilation cache in tests (jobs turn one on by default): each test compiles what it uses.
os.environ.setdefault("MEMSEARCHER_JAX_COMPILATION_CACHE", "")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~20 s; run in CI, skip with -m 'not slow'")
