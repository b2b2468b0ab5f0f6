"""How many XLA programs this process has built, counted from JAX's own monitoring events,
and JAX's persistent compilation cache.

    compile_stats.install()            # idempotent; registers the listeners
    before = compile_stats.snapshot()
    ...                                # anything that may jit
    new = compile_stats.snapshot() - before
    new.programs, new.from_cache, new.seconds

A "program" is one executable JAX had to obtain because no compiled one matched in memory:
`jax.jit` of a new function or new shapes, an eager op on new shapes. JAX reports each as a
backend-compile event, whether XLA compiled it or the persistent cache supplied it (then a
cache-hit event follows), so `programs - from_cache` is what XLA really compiled. Counting
the events (not hand-kept counters) sees every program, including ones a library builds.

Imports nothing of ours: any layer may use it.
"""
from __future__ import annotations

import os
import threading
from typing import NamedTuple

import jax
from jax.experimental.compilation_cache import compilation_cache

# jax._src.dispatch.BACKEND_COMPILE_EVENT and jax._src.compiler's cache-hit event.
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"

DEFAULT_CACHE_DIR = "~/.cache/memsearcher-jax/xla-cache"
CACHE_DIR_ENV = "MEMSEARCHER_JAX_COMPILATION_CACHE"  # overrides the config key; "" disables


class CompileCount(NamedTuple):
    programs: int = 0      # new programs (compiled by XLA or loaded from the persistent cache)
    from_cache: int = 0    # of those, loaded from the persistent cache
    seconds: float = 0.0   # time spent obtaining them

    def __sub__(self, other: CompileCount) -> CompileCount:
        return CompileCount(self.programs - other.programs, self.from_cache - other.from_cache,
                            self.seconds - other.seconds)

    @property
    def compiled(self) -> int:
        """Programs XLA compiled (not found in the persistent cache)."""
        return self.programs - self.from_cache


_lock = threading.Lock()
_totals = {"programs": 0, "from_cache": 0, "seconds": 0.0}
_installed = False


def _on_duration(event: str, duration_secs: float, **kwargs) -> None:
    if event == _COMPILE_EVENT:
        with _lock:
            _totals["programs"] += 1
            _totals["seconds"] += float(duration_secs)


def _on_event(event: str, **kwargs) -> None:
    if event == _CACHE_HIT_EVENT:
        with _lock:
            _totals["from_cache"] += 1


def install() -> None:
    """Start counting (once per process; later calls do nothing)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    jax.monitoring.register_event_listener(_on_event)


def snapshot() -> CompileCount:
    """Totals since `install()` (which this calls, so the first snapshot is the zero point)."""
    install()
    with _lock:
        return CompileCount(**_totals)


def resolve_cache_dir(configured: str | None) -> str:
    """The persistent cache directory: $MEMSEARCHER_JAX_COMPILATION_CACHE if set, else
    `configured` (None: the default); "" (either way) means no persistent cache."""
    path = os.environ.get(CACHE_DIR_ENV, DEFAULT_CACHE_DIR if configured is None else configured)
    if path and not path.strip():  # " " would become a directory named " " in the working directory
        where = f"${CACHE_DIR_ENV}" if CACHE_DIR_ENV in os.environ else "train.compilation_cache_dir"
        raise ValueError(f"{where}={path!r} is blank: give a directory for the compilation cache, or the empty "
                             "string to turn it off")
    return os.path.abspath(os.path.expanduser(path)) if path else ""


def enable_persistent_cache(configured: str | None = None) -> str:
    """Turn on JAX's persistent compilation cache (every program, however quick to compile, so
    a second run of the same job compiles nothing). Returns the directory, "" when disabled.
    Call before the first compile: JAX reads the setting when it first compiles."""
    path = resolve_cache_dir(configured)
    if not path:
        return ""
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()  # JAX settles on a cache at its first compile: re-read the settings
    return path


def step_compiles(total, logprobs: int, update: int) -> dict:
    """New programs of one step per phase: `total` (a compile_stats count over the whole step)
    less the learner's log-prob pass and update is the sampler's (rollout and weight refresh)."""
    return {"compiles": total.programs, "compiles_sampler": total.programs - logprobs - update,
            "compiles_logprobs": logprobs, "compiles_update": update, "compiles_from_cache": total.from_cache,
            "compile_seconds": total.seconds}
