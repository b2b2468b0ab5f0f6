"""Multi-host start-up: one Python process per host, all running the same program.

`initialize_from_env()` calls `jax.distributed.initialize` from whatever the launcher set:
    MEMSEARCHER_COORDINATOR / MEMSEARCHER_NUM_PROCESSES / MEMSEARCHER_PROCESS_ID  (explicit; wins)
    SLURM_NTASKS / SLURM_PROCID / SLURM_STEP_NODELIST                        (srun, one task per node)
    TPU VM pod metadata                                                      (no arguments needed)
and does nothing for a single process. After it, `jax.devices()` lists every chip of the pod
and `global_mesh` lays the ("data", "fsdp", "tp") mesh over all of them.

Rollout host-side work (retrieval calls, tool-call parsing, rewards) is NOT sharded by JAX:
each host runs it for its own rows only, the questions `host_shard` gives it, against its own
retriever (an in-process index or a shared server URL). The rollout's sampler runs on a
host-local mesh (`local_mesh`) with a host-local copy of the weights (`to_local_arrays`);
`allgather_rows` then hands every host the same global batch of packed rows, in process
order, for the learner's jitted programs, which see the global mesh.
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
DEFAULT_PORT = 8476  # coordinator port when SLURM gives only the node list


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """How this process joins the job; `kind` is "single", "explicit", "slurm" or "tpu"."""

    kind: str
    coordinator: str | None = None
    num_processes: int = 1
    process_id: int = 0


def first_slurm_host(nodelist: str) -> str:
    """First host of a SLURM node list: "gpu-[003-005,9],cpu1" -> "gpu-003"."""
    first = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if not first or not first.group(1):
        raise ValueError(f"cannot parse SLURM node list {nodelist!r}")
    prefix, ranges = first.group(1), first.group(3)
    if ranges is None:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise ValueError(f"environment variable {key}={env[key]!r} is not an integer") from None


def detect_cluster(env: Mapping[str, str] | None = None) -> ClusterSpec:
    """Read the environment (no jax import): which launcher started us and where to connect."""
    env = os.environ if env is None else env
    explicit = [k for k in ("MEMSEARCHER_COORDINATOR", "MEMSEARCHER_NUM_PROCESSES", "MEMSEARCHER_PROCESS_ID")
                if k in env]
    if explicit:
        missing = sorted({"MEMSEARCHER_COORDINATOR", "MEMSEARCHER_NUM_PROCESSES", "MEMSEARCHER_PROCESS_ID"}
                         - set(explicit))
        if missing:
            raise ValueError(f"multi-host env is incomplete: {explicit} set but {missing} missing")
        n, pid = _int(env, "MEMSEARCHER_NUM_PROCESSES"), _int(env, "MEMSEARCHER_PROCESS_ID")
        if not 0 <= pid < n:
            raise ValueError(f"MEMSEARCHER_PROCESS_ID={pid} is outside [0, MEMSEARCHER_NUM_PROCESSES={n})")
        if ":" not in env["MEMSEARCHER_COORDINATOR"]:
            raise ValueError(f"MEMSEARCHER_COORDINATOR={env['MEMSEARCHER_COORDINATOR']!r} must be host:port")
        return ClusterSpec("explicit" if n > 1 else "single", env["MEMSEARCHER_COORDINATOR"], n, pid)
    if "SLURM_NTASKS" in env and "SLURM_PROCID" in env:
        n = _int(env, "SLURM_NTASKS")
        if n > 1:
            nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
            if not nodes:
                raise ValueError("SLURM_NTASKS > 1 but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set")
            port = env.get("MEMSEARCHER_COORDINATOR_PORT", str(DEFAULT_PORT))
            return ClusterSpec("slurm", f"{first_slurm_host(nodes)}:{port}", n, _int(env, "SLURM_PROCID"))
    if env.get("TPU_WORKER_HOSTNAMES") and "," in env["TPU_WORKER_HOSTNAMES"]:
        # A multi-host TPU VM: jax reads the pod metadata itself.
        return ClusterSpec("tpu", None, len(env["TPU_WORKER_HOSTNAMES"].split(",")), _int(env, "TPU_WORKER_ID")
                           if "TPU_WORKER_ID" in env else 0)
    return ClusterSpec("single")


def initialize_from_env(env: Mapping[str, str] | None = None, timeout_s: int = 300) -> ClusterSpec:
    """Join the multi-host job described by the environment; a no-op for one process."""
    spec = detect_cluster(env)
    if spec.kind == "single":
        return spec
    import jax

    if jax.distributed.is_initialized():
        return spec
    if spec.kind == "tpu":
        jax.distributed.initialize(initialization_timeout=timeout_s)
    else:
        _cpu_collectives_if_needed(env)
        jax.distributed.initialize(coordinator_address=spec.coordinator, num_processes=spec.num_processes,
                                   process_id=spec.process_id, initialization_timeout=timeout_s)
    return spec


def _cpu_collectives_if_needed(env: Mapping[str, str] | None) -> None:
    # CPU processes need a cross-process collectives library (gloo); GPUs use NCCL anyway.
    env = os.environ if env is None else env
    if env.get("JAX_PLATFORMS", "").startswith("cpu") or env.get("MEMSEARCHER_CPU_COLLECTIVES"):
        import jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")


def batch_split_problems(batch_questions: int, hosts: int) -> list[str]:
    """rl.batch_questions over `hosts` (the live process count, or the planned hardware.hosts):
    each host rolls out an equal slice (host_shard), so it must divide."""
    if hosts > 1 and batch_questions % hosts:
        return [f"rl.batch_questions={batch_questions} must be a multiple of the {hosts} hosts "
                "(each rolls out an equal slice)"]
    return []


def staleness_host_problems(max_staleness: int, hosts: int) -> list[str]:
    """rl.max_staleness > 0 on several hosts: not built (the rollout thread would refresh the
    sampler's host-local weights, a collective, beside the learner's own collectives)."""
    if hosts > 1 and max_staleness > 0:
        return [f"rl.max_staleness={max_staleness} (rollouts ahead of the learner) is built for one host; this job "
                f"has {hosts}: set rl.max_staleness=0"]
    return []


def host_shard(items: Sequence[T], process_index: int, process_count: int) -> list[T]:
    """This host's contiguous slice of a global batch (equal sizes; the batch must divide).

    Contiguous slices keep a question's G samples on one host, so group statistics need no
    cross-host exchange before the rows are gathered.
    """
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} is outside [0, process_count={process_count})")
    if len(items) % process_count:
        raise ValueError(f"a batch of {len(items)} cannot be split evenly over {process_count} hosts; "
                         f"make rl.batch_questions a multiple of the host count")
    per = len(items) // process_count
    return list(items[process_index * per:(process_index + 1) * per])


def global_mesh(data: int, fsdp: int, tp: int):
    """The ("data", "fsdp", "tp") mesh over every device of every process.

    jax.devices() is ordered by process, so `tp` (the innermost axis) stays inside a host and
    its all-reduces never cross the slower inter-host links.
    """
    import jax

    from memsearcher_jax.models import make_mesh

    n_local = jax.local_device_count()
    if jax.process_count() > 1 and n_local % tp:
        raise ValueError(f"mesh.tp={tp} does not divide the {n_local} devices of one host; "
                         "tensor parallelism across hosts is not supported")
    return make_mesh(data, fsdp, tp, devices=jax.devices())


def local_mesh(tp: int):
    """A ("data", "fsdp", "tp") mesh over this process's devices only: (1, n_local // tp, tp).

    The rollout sampler runs on it, so each host samples its own rows without collectives
    across hosts; `tp` keeps the learner's value, so the weights split as in the sampling
    layout on the global mesh (see `to_local_arrays`)."""
    import jax

    from memsearcher_jax.models import make_mesh

    devices = jax.local_devices()
    if len(devices) % tp:
        raise ValueError(f"mesh.tp={tp} does not divide the {len(devices)} devices of one host")
    return make_mesh(1, len(devices) // tp, tp, devices=devices)


def learner_and_sampler_meshes(data: int, fsdp: int, tp: int, sampler_devices: int = 0):
    """(learner mesh, sampler mesh) for a data x fsdp x tp mesh. One process: that mesh for both
    (None on one device). Several: the learner spans every device of every host (global_mesh),
    each host samples on its own (local_mesh). sampler_devices > 0 (one process): the learner on
    the first data x fsdp x tp devices, the sampler on the last sampler_devices (tp of them split
    each layer, the rest the rows), so neither waits for the other's devices (rl/async_rollout.py)."""
    import jax

    from memsearcher_jax.errors import UserInputError
    from memsearcher_jax.models import make_mesh

    n_dev, devices = data * fsdp * tp, jax.devices()
    if sampler_devices and jax.process_count() > 1:
        raise UserInputError(f"sampler.devices={sampler_devices}: a sampler on devices of its own is built for one "
                             "host; on several hosts each samples on its own devices already: set sampler.devices=0")
    if sampler_devices and n_dev + sampler_devices > len(devices):
        raise UserInputError(f"sampler.devices={sampler_devices} beside mesh.data x mesh.fsdp x mesh.tp = {n_dev} "
                             f"learner devices needs {n_dev + sampler_devices} devices; this process has "
                             f"{len(devices)}: lower one of them")
    if jax.process_count() > 1:
        return global_mesh(data, fsdp, tp), local_mesh(tp)
    mesh = make_mesh(data, fsdp, tp, devices=devices[:n_dev]) if n_dev > 1 else None
    if sampler_devices:
        return mesh, make_mesh(sampler_devices // tp, 1, tp, devices=devices[-sampler_devices:])
    return mesh, mesh


def to_local_arrays(tree: Any, mesh) -> Any:
    """Host-local copies, on `mesh` (a `local_mesh`), of a tree of (global) arrays.

    Each leaf keeps its PartitionSpec (fitted to `mesh`). A shard this host already holds is
    reused with `jax.make_array_from_single_device_arrays` (no transfer when it sits on the
    same device); when the host lacks one (the spec splits over an axis that crosses hosts),
    the leaf is gathered with `process_allgather`, which every process must then reach too:
    the specs and meshes are the same on every host, so they all do. Leaves that are not
    jax arrays, or live on `mesh` already, pass through.
    """
    import jax
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec

    from memsearcher_jax.models.sharding import named_sharding

    def key(index, shape):
        return tuple(sl.indices(n)[:2] for sl, n in zip(index, shape))

    def convert(x):
        if not isinstance(x, jax.Array) or (isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh):
            return x
        spec = x.sharding.spec if isinstance(x.sharding, NamedSharding) else PartitionSpec()
        target = named_sharding(mesh, x.shape, spec)
        held = {key(s.index, x.shape): s.data for s in x.addressable_shards}
        wanted = target.addressable_devices_indices_map(x.shape)
        if all(key(idx, x.shape) in held for idx in wanted.values()):
            pieces = [jax.device_put(held[key(idx, x.shape)], d) for d, idx in wanted.items()]
            return jax.make_array_from_single_device_arrays(x.shape, target, pieces)
        full = x if x.is_fully_addressable else multihost_utils.process_allgather(x, tiled=True)
        return jax.device_put(np.asarray(full), target)

    return jax.tree.map(convert, tree)


def allgather_rows(fields: Mapping[str, Any], pad_values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every host's rows, concatenated in process order (host 0's rows, then host 1's, ...),
    on every host.

    fields: numpy arrays with rows on axis 0, the same names, dtypes and ranks on every host;
    the row counts may differ, and so may the length of axis 1 (a sequence): the longest
    wins, shorter ones are right-padded with pad_values[name] (default 0). Integer fields
    travel as int32 (JAX without x64), so their values must fit it; dtypes are restored.
    A collective: every process must call it, with the same field names.
    """
    import numpy as np
    from jax.experimental import multihost_utils

    pad_values = dict(pad_values or {})
    names = sorted(fields)
    local = {k: np.asarray(fields[k]) for k in names}
    rows = {local[k].shape[0] for k in names}
    if len(rows) != 1:
        raise ValueError(f"fields disagree on the number of rows: {sorted(rows)}")
    (n_rows,) = rows
    seq = max([local[k].shape[1] for k in names if local[k].ndim >= 2], default=0)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([n_rows, seq], np.int32)))  # [P, 2]
    max_rows, max_seq = int(sizes[:, 0].max()), int(sizes[:, 1].max())
    padded = {}
    for k in names:
        a = local[k]
        if a.dtype == np.int64 or a.dtype == np.uint64:
            if a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
                raise ValueError(f"field {k!r} has values outside int32; they cannot be gathered without x64")
            a = a.astype(np.int32)
        width = [(0, max_rows - a.shape[0])] + [(0, 0)] * (a.ndim - 1)
        if a.ndim >= 2:
            width[1] = (0, max_seq - a.shape[1])
        padded[k] = np.pad(a, width, constant_values=pad_values.get(k, 0))
    gathered = multihost_utils.process_allgather(padded)  # leaves [P, max_rows, ...]
    return {k: np.concatenate([np.asarray(gathered[k][p])[:int(sizes[p, 0])]
                               for p in range(sizes.shape[0])]).astype(local[k].dtype) for k in names}



def allgather_ints_and_text(ints: Sequence[int], text: str, text_bytes: int = 512) -> tuple[Any, list[str]]:
    """Every host's few integers ([hosts, len(ints)] int array) and short text (its UTF-8 cut to
    text_bytes), in process order, on every host. A collective: every process calls it with as
    many integers (each within int32)."""
    import numpy as np
    from jax.experimental import multihost_utils

    raw = text.encode("utf-8")[:text_bytes]
    row = np.zeros(len(ints) + 1 + text_bytes, np.int32)
    row[:len(ints)], row[len(ints)] = ints, len(raw)
    row[len(ints) + 1:len(ints) + 1 + len(raw)] = np.frombuffer(raw, np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(row)).reshape(-1, row.size)
    texts = [bytes(r[len(ints) + 1:len(ints) + 1 + r[len(ints)]].astype(np.uint8)).decode("utf-8", errors="ignore")
             for r in rows]
    return rows[:, :len(ints)], texts
