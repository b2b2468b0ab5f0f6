"""Launchers (dry runs print exactly the commands) and the environment side of multi-host start-up."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

import pytest

from launch import slurm_gpu, tpu_pod
from memsearcher_jax.runtime.distributed import ClusterSpec, detect_cluster, first_slurm_host, host_shard
from memsearcher_jax.settings.config_utils import load_config_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "configs", "recipe.py")
PAIRS = sorted(load_config_module(RECIPE).RECIPES)  # (model, pod): `configs/recipe.py:model,pod`
RECIPES = [f"{RECIPE}:{model},{pod}" for model, pod in PAIRS]
TPU = [f"{RECIPE}:{model},{pod}" for model, pod in PAIRS if pod != "h100_8"]
GPU = [f"{RECIPE}:{model},{pod}" for model, pod in PAIRS if pod == "h100_8"]
ACCEL = {"v4_32": ("v4-32", "tpu-ubuntu2204-base"), "v5e_64": ("v5litepod-64", "v2-alpha-tpuv5-lite"),
         "v5p_128": ("v5p-128", "v2-alpha-tpuv5")}


def _name(path):
    return path.rsplit(":", 1)[1]  # "qwen2_5_3b,v5e_64"


def _relative(path):
    """The --config the workers get: the recipe file relative to the repo, its MODEL,POD kept."""
    file, arg = path.rsplit(":", 1)
    return f"{os.path.relpath(file, ROOT)}:{arg}"


def _lines(capsys):
    return [line for line in capsys.readouterr().out.splitlines() if line.strip()]


@pytest.mark.parametrize("path", TPU, ids=_name)
def test_tpu_dry_run_prints_create_install_and_one_train_command_for_all_workers(path, capsys):
    rc = tpu_pod.main(["--config", path, "--name", "ms", "--zone", "us-west4-a", "--project", "p1",
                       "--retrieval", "shared", "--retrieval-url", "http://10.0.0.2:8000", "--dry-run",
                       "--config.train.steps=7"])
    assert rc == 0
    cmds = [shlex.split(line) for line in _lines(capsys)]
    pod = next(k for k in ACCEL if k in _name(path))
    accel, version = ACCEL[pod]
    assert cmds[0] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "ms", "--zone", "us-west4-a", "--project",
                       "p1", f"--accelerator-type={accel}", f"--version={version}"]
    assert cmds[1][:2] == ["git", "-C"] and cmds[1][-1] == "HEAD"
    assert cmds[2][4] == "scp" and "--worker=all" in cmds[2]
    assert cmds[3][4] == "ssh" and "--worker=all" in cmds[3] and "pip install" in cmds[3][-1]
    train = cmds[4]
    assert train[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "ms"] and "--worker=all" in train
    remote = train[-1].removeprefix("--command=")
    inner = shlex.split(remote.split("&&", 1)[1].split("2>&1")[0])
    assert inner == ["python", "-m", "memsearcher_jax.cli", "--multihost", "train", "--config",
                     _relative(path), "--config.retrieval.kind=http",
                     "--config.retrieval.url=http://10.0.0.2:8000", "--config.train.steps=7"]
    assert remote.endswith("| tee ~/train.log")
    assert len(cmds) == 5


def test_tpu_reuse_skips_create_and_in_process_retrieval_uses_the_index(capsys):
    rc = tpu_pod.main(["--config", TPU[0], "--name", "ms", "--zone", "z", "--reuse", "--no-install",
                       "--retrieval", "in-process", "--index-dir", "/mnt/idx", "--dry-run"])
    assert rc == 0
    cmds = _lines(capsys)
    assert len(cmds) == 1 and "create" not in cmds[0]
    assert "--config.retrieval.kind=index --config.retrieval.index_dir=/mnt/idx" in cmds[0]


def test_tpu_launcher_errors_name_the_problem(capsys):
    assert tpu_pod.main(["--config", GPU[0], "--name", "x", "--zone", "z", "--retrieval-url", "u", "--dry-run"]) == 2
    assert "launch/slurm_gpu.py" in capsys.readouterr().err
    assert tpu_pod.main(["--config", TPU[0], "--name", "x", "--zone", "z", "--dry-run"]) == 2
    assert "--retrieval-url" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tpu_pod.main(["--config", TPU[0], "--name", "x", "--zone", "z", "--retrieval-url", "u", "--bogus"])


@pytest.mark.parametrize("path", GPU, ids=_name)
def test_slurm_dry_run_prints_the_script_and_sbatch(path, capsys, tmp_path):
    script = str(tmp_path / "job.sbatch")
    rc = slurm_gpu.main(["--config", path, "--partition", "h100", "--retrieval", "in-process",
                         "--index-dir", "/shared/e5", "--script", script, "--dry-run", "--config.train.steps=3"])
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"# {script}" and out[1] == "#!/bin/bash" and out[-1] == f"sbatch {script}"
    body = "\n".join(out)
    for line in ("#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=h100", "export MEMSEARCHER_NUM_PROCESSES=1"):
        assert line in out, line
    assert 'MEMSEARCHER_COORDINATOR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1):8476"' in body
    srun = next(line for line in out if line.startswith("srun "))
    task = shlex.split(srun)[-1]
    assert task.startswith("export MEMSEARCHER_PROCESS_ID=$SLURM_PROCID; "
                           "exec python -m memsearcher_jax.cli --multihost")
    assert shlex.split(task.split("exec ", 1)[1]) == [
        "python", "-m", "memsearcher_jax.cli", "--multihost", "train", "--config", _relative(path),
        "--config.retrieval.kind=index", "--config.retrieval.index_dir=/shared/e5", "--config.train.steps=3"]
    assert not os.path.exists(script)  # a dry run writes nothing


def test_slurm_writes_the_script_when_not_dry(tmp_path, monkeypatch, capsys):
    # A fake sbatch on PATH: the script is written, then submitted.
    monkeypatch.setenv("PATH", str(tmp_path))
    (tmp_path / "sbatch").write_text("#!/bin/sh\necho submitted \"$1\"\n")
    (tmp_path / "sbatch").chmod(0o755)
    script = str(tmp_path / "s" / "job.sbatch")
    rc = slurm_gpu.main(["--config", GPU[0], "--retrieval", "shared", "--retrieval-url", "http://h:8000",
                         "--script", script])
    assert rc == 0 and open(script).read().startswith("#!/bin/bash\n")
    assert "--config.retrieval.url=http://h:8000" in open(script).read()


def test_slurm_node_count_must_match_the_recipe(capsys):
    rc = slurm_gpu.main(["--config", GPU[0], "--nodes", "2", "--index-dir", "/x", "--dry-run"])
    assert rc == 2 and "hardware.num_devices=8" in capsys.readouterr().err
    assert slurm_gpu.main(["--config", TPU[0], "--index-dir", "/x", "--dry-run"]) == 2
    assert "launch/tpu_pod.py" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["launch/tpu_pod.py", "launch/slurm_gpu.py"])
def test_help_is_instant_and_imports_no_jax(script):
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--dry-run" in out.stdout and "--retrieval" in out.stdout
    assert time.perf_counter() - t0 < 10
    mod = os.path.splitext(os.path.basename(script))[0]
    probe = subprocess.run([sys.executable, "-c", f"import sys, launch.{mod}; print('jax' in sys.modules)"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "False", probe.stderr


@pytest.mark.parametrize("mod, args", [
    ("tpu_pod", ["--config", "configs/recipe.py:qwen2_5_3b,v5e_64", "--name", "ms", "--zone", "z", "--retrieval-url",
                 "http://10.0.0.2:8000", "--dry-run"]),
    ("slurm_gpu", ["--config", "configs/recipe.py:qwen2_5_3b,h100_8", "--partition", "h100", "--index-dir",
                   "/shared/e5_flat", "--dry-run"])])
def test_dry_run_in_a_fresh_process_loads_the_recipe_without_jax(mod, args):
    # A fresh interpreter, as a user runs it: `configs/recipe.py:MODEL,POD` and the base recipe it
    # loads beside it must resolve on their own (in-process tests may have loaded them already).
    code = (f"import sys; from launch import {mod}; rc = {mod}.main({args!r}); "
            "print('JAX', 'jax' in sys.modules); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "memsearcher_jax.cli --multihost train" in out.stdout and "JAX False" in out.stdout


# ----------------------------------------------------------------------------- distributed env

def test_detect_cluster_from_each_launcher():
    assert detect_cluster({}) == ClusterSpec("single")
    env = {"MEMSEARCHER_COORDINATOR": "10.0.0.1:1234", "MEMSEARCHER_NUM_PROCESSES": "4", "MEMSEARCHER_PROCESS_ID": "3",
           "SLURM_NTASKS": "9", "SLURM_PROCID": "0"}
    assert detect_cluster(env) == ClusterSpec("explicit", "10.0.0.1:1234", 4, 3)  # explicit wins over SLURM
    slurm = {"SLURM_NTASKS": "4", "SLURM_PROCID": "2", "SLURM_STEP_NODELIST": "gpu-[007-010]"}
    assert detect_cluster(slurm) == ClusterSpec("slurm", "gpu-007:8476", 4, 2)
    assert detect_cluster({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}).kind == "single"
    tpu = {"TPU_WORKER_HOSTNAMES": "a,b,c,d", "TPU_WORKER_ID": "1"}
    assert detect_cluster(tpu) == ClusterSpec("tpu", None, 4, 1)


@pytest.mark.parametrize("env, match", [
    ({"MEMSEARCHER_COORDINATOR": "h:1"}, "MEMSEARCHER_NUM_PROCESSES"),
    ({"MEMSEARCHER_COORDINATOR": "h:1", "MEMSEARCHER_NUM_PROCESSES": "2", "MEMSEARCHER_PROCESS_ID": "2"}, "outside"),
    ({"MEMSEARCHER_COORDINATOR": "h", "MEMSEARCHER_NUM_PROCESSES": "2", "MEMSEARCHER_PROCESS_ID": "0"}, "host:port"),
    ({"SLURM_NTASKS": "two", "SLURM_PROCID": "0"}, "SLURM_NTASKS='two'"),
    ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0"}, "SLURM_STEP_NODELIST"),
])
def test_bad_environments_are_named(env, match):
    with pytest.raises(ValueError, match=match):
        detect_cluster(env)


def test_first_slurm_host():
    assert first_slurm_host("node17") == "node17"
    assert first_slurm_host("gpu-[003-005,9],cpu1") == "gpu-003"
    assert first_slurm_host("a[1,3]") == "a1"


def test_host_shard_partitions_the_batch_in_order():
    items = list(range(12))
    shards = [host_shard(items, i, 3) for i in range(3)]
    assert shards == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(ValueError, match="cannot be split evenly over 5 hosts"):
        host_shard(items, 0, 5)
    with pytest.raises(ValueError, match="outside"):
        host_shard(items, 3, 3)


@pytest.mark.parametrize("path", RECIPES, ids=_name)
def test_every_recipe_mesh_keeps_tensor_parallelism_inside_a_host(path, monkeypatch):
    # The real checks of distributed.global_mesh and local_mesh, on a fake pod of the recipe's
    # hosts: jax reports the pod's process and device counts, make_mesh records what it is given.
    import jax

    import memsearcher_jax.models as models
    from memsearcher_jax.runtime import distributed
    from memsearcher_jax.settings.config_utils import load_config

    cfg = load_config(path, [])
    hw = cfg.hardware
    hosts, n = int(hw.hosts), int(hw.num_devices)
    assert n % hosts == 0, f"{hw.num_devices} devices do not split over {hosts} hosts"
    per_host = n // hosts
    assert per_host % cfg.mesh.tp == 0, (f"{_name(path)}: mesh.tp={cfg.mesh.tp} does not divide the "
                                         f"{per_host} chips of one host")
    made = []
    monkeypatch.setattr(jax, "process_count", lambda: hosts)
    monkeypatch.setattr(jax, "local_device_count", lambda: per_host)
    monkeypatch.setattr(jax, "devices", lambda: list(range(n)))
    monkeypatch.setattr(jax, "local_devices", lambda: list(range(per_host)))
    monkeypatch.setattr(models, "make_mesh", lambda d, f, t, devices: made.append((d, f, t, len(devices))))
    distributed.global_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tp)
    distributed.local_mesh(cfg.mesh.tp)
    assert made == [(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tp, n), (1, per_host // cfg.mesh.tp, cfg.mesh.tp, per_host)]


CHUNKS = os.path.join(ROOT, "launch", "pretrain_in_chunks.sh")


def test_pretrain_in_chunks_refuses_a_work_folder_it_did_not_make(tmp_path):
    """The chunked pretraining script never writes into (or clears) a work folder someone else
    made, and says so before anything is installed or run; without its four arguments it prints
    its usage. (The whole interrupt-pack-resume cycle was run by hand, 2026-11-27:
    docs/lab/2026-11-27-suite-compilation-cache-works-for-toy.md.)"""
    work = tmp_path / "work"
    work.mkdir()
    (work / "mine.txt").write_text("keep")
    env = dict(os.environ, PRETRAIN_IN_CHUNKS_DIR=str(work), PYTHON="false")
    res = subprocess.run(["bash", CHUNKS, "configs/base_v8.py", "5", str(tmp_path / "in"), str(tmp_path / "out")],
                         env=env, capture_output=True, text=True)
    assert res.returncode == 2 and "was not made by this script" in res.stderr
    assert sorted(os.listdir(work)) == ["mine.txt"] and (work / "mine.txt").read_text() == "keep"
    assert not (tmp_path / "out").exists()
    usage = subprocess.run(["bash", CHUNKS, "configs/base_v8.py"], capture_output=True, text=True)
    assert usage.returncode == 2 and "PACK_OUT" in usage.stderr
