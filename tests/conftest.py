"""Test setup: 8 fake CPU devices (so sharding runs on one machine), float32 matmuls, markers.

XLA_FLAGS must be set before jax is imported anywhere, hence here at conftest import time.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One persistent compilation cache for the whole session, in a temporary directory of its own
# (removed at exit): the many tests that build the same tiny models, samplers and jobs, in this
# process or in subprocesses, load a program another test compiled instead of compiling it again.
# Compile counts are unchanged (a program loaded from the cache still counts, see compile_stats).
# A cache set in the environment (a path, or "" for none) is used as it is.
if "MEMSEARCHER_JAX_COMPILATION_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _session_cache = tempfile.mkdtemp(prefix="memsearcher-jax-test-xla-")
    atexit.register(shutil.rmtree, _session_cache, True)
    os.environ["MEMSEARCHER_JAX_COMPILATION_CACHE"] = _session_cache

import jax  # noqa: E402

from memsearcher_jax import compile_stats  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
compile_stats.enable_persistent_cache()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~20 s; run in CI, skip with -m 'not slow'")
