"""Test setup: 8 fake CPU devices (so sharding runs on one machine), float32 matmuls, markers.

XLA_FLAGS must be set before jax is imported anywhere, hence here at conftest import time.
"""
import atexit
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402

from memsearcher_jax.runtime import compile_stats  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# One persistent compilation cache for the whole session, in a temporary directory of its own
# (removed at exit): the many tests that build the same tiny models, samplers and jobs, in this
# process or in subprocesses, load a program another test compiled instead of compiling it again.
# Compile counts are unchanged (a program loaded from the cache still counts, see compile_stats).
# A cache set in the environment (a path, or "" for none) is used as it is.
# Under pytest-xdist (-n 2) the controller runs this first and its workers inherit the variable:
# they share one cache, and only the controller removes it.
if compile_stats.CACHE_DIR_ENV not in os.environ:
    _session_cache = tempfile.mkdtemp(prefix="memsearcher-jax-test-xla-")
    atexit.register(shutil.rmtree, _session_cache, True)
    os.environ[compile_stats.CACHE_DIR_ENV] = _session_cache
compile_stats.enable_persistent_cache()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~20 s on the slower of our 2-core machines "
                            "(docs/lab/2026-11-30-suite-time-and-fast-compiles.md); run in CI, skip with -m 'not slow'")
