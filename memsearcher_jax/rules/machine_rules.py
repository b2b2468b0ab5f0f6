"""What a config asks of this machine, asked with the config's other rules (config_rules.config_problems,
check_config): the paths the job reads exist and can be read, the directories it writes can be made
and written, and, on CPU, the memory plan is not far past the host's memory.

    input_path_problems(cfg, training)   # the files and directories the job reads; the world's cache
    writable_dir_problem(path, named, fix)   # why a directory cannot be made and written (None: it can)
    host_plan_problem(plan, backend, host_bytes)   # a plan refused against the host's memory
"""
from __future__ import annotations

import math
import os

from memsearcher_jax.plan import planner
from memsearcher_jax.settings import Settings


def input_path_problems(cfg: Settings, training: bool = True) -> list[str]:
    """The local files and directories the job reads exist and can be read (unreadable_under): the
    model's source (unless 'init'), the tokenizer, the data, the index; and the synthetic world's
    cache can be made and written (world_cache_problems). Evaluation (training=False) never reads
    data.train_path, so it is not asked for."""
    wanted = [("data.tokenizer_dir", cfg.data.tokenizer_dir, os.path.isdir)]
    if not cfg.world.enabled:
        wanted += [("data.train_path", cfg.data.train_path, os.path.exists)] if training else []
        wanted += [("data.eval_path", cfg.data.eval_path, os.path.exists)]
    if cfg.retrieval.kind == "index":
        wanted += [("retrieval.index_dir", cfg.retrieval.index_dir, os.path.isdir)]
    problems = []
    if cfg.model.source != "init" and not os.path.isdir(os.path.expanduser(cfg.model.source)):
        problems.append(f"model.source {cfg.model.source!r} is neither 'init' nor a local model directory")
    elif cfg.model.source != "init":
        wanted += [("model.source", cfg.model.source, os.path.isdir)]
    for key, value, exists in wanted:
        if not value or "://" in value:
            continue
        path = os.path.expanduser(value)
        if not exists(path):
            problems.append(f"{key}={value}: no such {'directory' if exists is os.path.isdir else 'file or directory'}")
        elif bad := unreadable_under(path):
            problems.append(f"{key}={value}: {bad} is not readable (permission denied); give this process read access "
                            "or point the key elsewhere")
    return problems + (world_cache_problems(cfg.world.cache_dir) if cfg.world.enabled else [])


# What the readers open inside a directory the config names: QA sets (.jsonl, .parquet), a model's
# or an index's files. A file of another kind there (a README) is none of the job's business.
READ_SUFFIXES = (".jsonl", ".parquet", ".json", ".safetensors", ".npy", ".txt", ".faiss", ".model")


def unreadable_under(path: str, depth: int = 2) -> str | None:
    """The first of `path` and, for a directory, the directories and READ_SUFFIXES files `depth`
    levels under it that this process cannot read (a directory: list and enter); None when none.
    A PermissionError in the job's readers was a traceback, after the world or the model was built."""
    if not os.path.isdir(path):
        return None if os.access(path, os.R_OK) else path
    if not os.access(path, os.R_OK | os.X_OK):
        return path
    for entry in sorted(os.listdir(path))[:1000] if depth else ():
        inner = os.path.join(path, entry)
        if (os.path.isdir(inner) or inner.endswith(READ_SUFFIXES)) and (bad := unreadable_under(inner, depth - 1)):
            return bad
    return None


def writable_dir_problem(path: str, named: str, fix: str) -> str | None:
    """Why the job cannot make and write the directory `path` (named `named` in the message, `fix`
    what to do): a file there or above it, or the nearest existing directory not writable; None when it can."""
    parent = path
    while not os.path.exists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        where = "is a file" if parent == path else f"lies under the file {parent}"
        return f"{named}: {path} {where}, not a directory; {fix}"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{named}: {parent} is not writable; {fix}"
    return None


def world_cache_problems(cache_dir: str) -> list[str]:
    """world.cache_dir: a directory the job can make and write (a file there, or under it, was a
    FileExistsError / NotADirectoryError traceback). One already holding worlds may be read-only (a
    shared cache of built worlds is only read; a world it lacks still fails as it is built)."""
    path = os.path.abspath(os.path.expanduser(cache_dir))
    if os.path.isdir(path) and any(not e.startswith(".") for e in os.listdir(path)):
        return [] if os.access(path, os.R_OK | os.X_OK) else [f"world.cache_dir={cache_dir}: {path} is not readable"]
    problem = writable_dir_problem(path, f"world.cache_dir={cache_dir}", "point world.cache_dir at a directory "
                                   "this process can write (the synthetic world is built and cached there)")
    return [problem] if problem else []



# On CPU the plan is held against the host's memory, which every CPU device shares: over 90% of it
# a warning (planner.host_memory_warning), over this many times it a refusal before any work. The
# plan is the worst case, every conversation as long as agent.max_context_tokens, and runs whose
# conversations stay short peak far below it: bench/paper_tables.py's 4096-token room plans 90 GiB
# and its runs peaked at 19.6 GB at most (docs/lab/2026-11-30-react-seed2-out-of-memory.md). 8x
# leaves such a run room on a 12 GiB host, while a plan 500,000x the host (rl.group_size=100000000)
# ran the warm start and the evaluation, then GRPO allocated until the kernel's OOM killer ended it.
HOST_REFUSAL_FACTOR = 8


def host_plan_problem(plan, backend: str, host_bytes: int | None) -> str | None:
    """The refusal of a plan over HOST_REFUSAL_FACTOR times this host's memory (`host_bytes`), on
    CPU with no device memory configured (a configured capacity is check_fits' to hold it against);
    None otherwise."""
    if plan.capacity_bytes is not None or backend != "cpu" or not host_bytes:
        return None
    need = plan.total_bytes * math.prod(plan.mesh)  # the mesh's CPU devices share the host
    if need <= HOST_REFUSAL_FACTOR * host_bytes:
        return None
    return (f"the memory plan's peak ({plan.peak_phase}) is {need / planner.GIB:,.1f} GiB, {need / host_bytes:,.0f}x "
            f"this host's {host_bytes / planner.GIB:.1f} GiB (refused past {HOST_REFUSAL_FACTOR}x; nothing was "
            "started). Sample fewer trajectories a step (rl.batch_questions x rl.group_size). "
            + planner.why_not_settings(plan) + " `memsearcher-jax plan` shows the table.")
