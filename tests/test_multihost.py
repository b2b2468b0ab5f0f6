"""Multi-host on one CPU machine: 2 processes x 4 fake devices == 1 x 8 == 1 x 1, and checkpoints
written in one layout restore in the other.

Each run is a subprocess executing this file as a worker (`python tests/test_multihost.py ...`),
with its own XLA_FLAGS device count; the 2-process run joins through
`distributed.initialize_from_env` on 127.0.0.1 (gloo CPU collectives).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESH = (1, 2, 4)  # fsdp crosses the two processes, tp stays inside each


# ----------------------------------------------------------------------------- worker

def _flat(tree) -> dict[str, np.ndarray]:
    import jax

    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def worker(out_dir: str, tag: str, restore_from: str | None) -> None:
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    from memsearcher_jax.distributed import global_mesh, initialize_from_env

    spec = initialize_from_env(timeout_s=120)
    import orbax.checkpoint as ocp
    from flax import nnx
    from jax.experimental import multihost_utils

    from memsearcher_jax.models import ModelConfig, Qwen2, ShardingConfig, shard_model
    from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner, OptimConfig
    from tests.test_grpo import _toy_rows

    def build():
        model = Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(1))
        mesh = None
        if jax.device_count() > 1:
            mesh = global_mesh(*MESH)
            model = shard_model(model, mesh, ShardingConfig.training())
        # 3 rows per micro-batch / log-prob chunk: not divisible by data*fsdp=2, so the batch is
        # replicated and only the parameters are split across processes.
        cfg = GRPOConfig(optimizer_steps=2, micro_batch_size=3, logprob_batch_size=3,
                         optim=OptimConfig(learning_rate=1e-3))
        return GRPOLearner(model, cfg, mesh=mesh)

    def gathered(tree):
        return _flat(multihost_utils.process_allgather(tree, tiled=True)) if spec.num_processes > 1 else _flat(tree)

    learner = build()
    initial = gathered(learner.params)
    metrics = learner.train_on_rows(_toy_rows(), np.random.default_rng(0))
    trained = gathered(learner.params)
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(os.path.join(out_dir, f"ckpt_{tag}"), learner.params)
    ckpt.wait_until_finished()
    restored = None
    if restore_from:
        target = build().params
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        restored = gathered(ckpt.restore(os.path.join(out_dir, f"ckpt_{restore_from}"), abstract))
    if jax.process_index() == 0:
        np.savez(os.path.join(out_dir, f"trained_{tag}.npz"), **trained)
        np.savez(os.path.join(out_dir, f"initial_{tag}.npz"), **initial)
        if restored is not None:
            np.savez(os.path.join(out_dir, f"restored_{tag}.npz"), **restored)
        with open(os.path.join(out_dir, f"info_{tag}.txt"), "w") as f:
            f.write(f"{jax.process_count()} {jax.device_count()} {metrics['loss']}\n")


# ----------------------------------------------------------------------------- test

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(out_dir, tag, devices, num_processes=1, restore_from=None):
    port = _free_port()
    procs = []
    for pid in range(num_processes):
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                   JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
        for k in ("MEMSEARCHER_COORDINATOR", "MEMSEARCHER_NUM_PROCESSES", "MEMSEARCHER_PROCESS_ID"):
            env.pop(k, None)
        if num_processes > 1:
            env.update(MEMSEARCHER_COORDINATOR=f"127.0.0.1:{port}", MEMSEARCHER_NUM_PROCESSES=str(num_processes),
                       MEMSEARCHER_PROCESS_ID=str(pid))
        cmd = [sys.executable, os.path.abspath(__file__), out_dir, tag] + ([restore_from] if restore_from else [])
        procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, f"worker {tag} exited {p.returncode}:\n{out[-4000:]}"


def _load(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)


@pytest.mark.slow
def test_two_processes_match_one_process_and_checkpoints_cross_layouts(tmp_path):
    out = str(tmp_path)
    _spawn(out, "single", devices=1)
    _spawn(out, "multi", devices=4, num_processes=2, restore_from="single")
    _spawn(out, "eight", devices=8, restore_from="multi")
    info = {t: open(os.path.join(out, f"info_{t}.txt")).read().split() for t in ("single", "multi", "eight")}
    assert info["single"][:2] == ["1", "1"] and info["multi"][:2] == ["2", "8"] and info["eight"][:2] == ["1", "8"]
    single, multi, eight = (_load(os.path.join(out, f"trained_{t}.npz")) for t in ("single", "multi", "eight"))
    initial_gap = _max_diff(single, _load(os.path.join(out, "restored_multi.npz")))
    assert initial_gap == 0.0  # the 1-process checkpoint restores bit-exactly on 2 processes
    assert _max_diff(multi, single) < 1e-5
    assert _max_diff(eight, single) < 1e-5
    assert _max_diff(eight, multi) < 1e-5
    # The 2-process checkpoint restores on 1 process x 8 devices to what the 2 processes held.
    assert _max_diff(_load(os.path.join(out, "restored_eight.npz")), multi) == 0.0
    # The step moved the weights (else equality would be vacuous), from the same start everywhere.
    assert _max_diff(single, _load(os.path.join(out, "initial_single.npz"))) > 1e-4
    assert _max_diff(_load(os.path.join(out, "initial_multi.npz")), _load(os.path.join(out, "initial_single.npz"))) == 0
    assert abs(float(info["single"][2]) - float(info["multi"][2])) < 1e-5


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    worker(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
