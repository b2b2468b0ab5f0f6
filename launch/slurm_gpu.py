"""Train a recipe on a SLURM GPU cluster: write an sbatch script that runs one task per node
(each task drives that node's GPUs) with `srun`, and submit it.

    python launch/slurm_gpu.py --config configs/recipe.py:qwen2_5_3b,h100_8 --nodes 1 \\
        --partition gpu --retrieval in-process --index-dir /shared/e5_flat --dry-run

The script exports MEMSEARCHER_COORDINATOR (first node of the allocation) and
MEMSEARCHER_NUM_PROCESSES; each task sets MEMSEARCHER_PROCESS_ID=$SLURM_PROCID and runs
`python -m memsearcher_jax.cli --multihost train ...`, which joins the job before training.
"""
from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch.common import (
    ROOT,
    TRAIN_ENTRY,
    LaunchError,
    execute,
    load_recipe,
    parse_launch_args,
    render,
    repo_relative,
    retrieval_overrides,
)

COORDINATOR_PORT = 8476


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch/slurm_gpu.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True,
                   help="configs/recipe.py:MODEL,POD (e.g. qwen2_5_3b,h100_8), or another config file with a "
                        "GPU hardware section")
    p.add_argument("--nodes", type=int, default=None, help="nodes (default: the recipe's hardware.nodes)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="default: the recipe's hardware.gpus_per_node")
    p.add_argument("--partition", default=None, help="SLURM partition")
    p.add_argument("--account", default=None, help="SLURM account")
    p.add_argument("--time", default="48:00:00", help="wall-clock limit")
    p.add_argument("--cpus-per-task", type=int, default=64, help="CPU cores per node-task (retrieval, parsing)")
    p.add_argument("--job-name", default="memsearcher-jax")
    p.add_argument("--workdir", default=ROOT, help="repository checkout on the shared filesystem")
    p.add_argument("--venv", default=".venv", help="virtual environment inside --workdir to activate")
    p.add_argument("--script", default="slurm/memsearcher_train.sbatch", help="where to write the sbatch script")
    p.add_argument("--retrieval", choices=("in-process", "shared"), default="in-process",
                   help="in-process: each node loads --index-dir and retrieves for its own rows; "
                        "shared: every node calls --retrieval-url")
    p.add_argument("--retrieval-url", default=None)
    p.add_argument("--index-dir", default=None)
    p.add_argument("--mem-fraction", type=float, default=0.9,
                   help="XLA_PYTHON_CLIENT_MEM_FRACTION (the planner assumes hardware.usable_fraction)")
    p.add_argument("--dry-run", action="store_true", help="print the script and the sbatch command, run nothing")
    return p


def sbatch_script(args, overrides: list[str]) -> str:
    cfg = load_recipe(args.config)
    hw = cfg.hardware
    if str(hw.device_kind).lower().startswith("tpu"):
        raise LaunchError(f"{args.config} is a {hw.device_kind} recipe; use launch/tpu_pod.py for TPUs")
    nodes = args.nodes or int(hw.get("nodes", 1))
    gpus = args.gpus_per_node or int(hw.get("gpus_per_node", 8))
    if nodes * gpus != int(hw.num_devices):
        raise LaunchError(f"{nodes} nodes x {gpus} GPUs = {nodes * gpus}, but {args.config} plans for "
                          f"hardware.num_devices={hw.num_devices} (mesh {cfg.mesh.data}x{cfg.mesh.fsdp}x{cfg.mesh.tp})")
    train = TRAIN_ENTRY + ["--config", repo_relative(args.config)] + retrieval_overrides(
        args.retrieval, args.retrieval_url, args.index_dir) + overrides
    if "'" in render(train):  # the task command sits inside bash -c '...'
        raise LaunchError(f"the training command needs shell quoting, which bash -c '...' cannot hold: {render(train)}")
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={args.job_name}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={gpus}",
             f"#SBATCH --cpus-per-task={args.cpus_per_task}",
             f"#SBATCH --time={args.time}",
             "#SBATCH --output=logs/%x-%j.out"]
    lines += [f"#SBATCH --partition={args.partition}"] * bool(args.partition)
    lines += [f"#SBATCH --account={args.account}"] * bool(args.account)
    lines += ["set -euo pipefail",
              f"cd {args.workdir}",
              f"source {args.venv}/bin/activate",
              "mkdir -p logs",
              # Rank 0's host coordinates; every task gets the same address and the process count.
              f'export MEMSEARCHER_COORDINATOR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1):'
              f'{COORDINATOR_PORT}"',
              f"export MEMSEARCHER_NUM_PROCESSES={nodes}",
              f"export XLA_PYTHON_CLIENT_MEM_FRACTION={args.mem_fraction}",
              # $SLURM_PROCID differs per task, so it is expanded inside each task, not here.
              f"srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 "
              f"bash -c 'export MEMSEARCHER_PROCESS_ID=$SLURM_PROCID; exec {render(train)}'"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args, rest = parse_launch_args(build_parser(), argv)
    try:
        script = sbatch_script(args, rest)
    except LaunchError as e:
        print(f"slurm_gpu: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(f"# {args.script}")
        print(script, end="")
    else:
        os.makedirs(os.path.dirname(os.path.abspath(args.script)), exist_ok=True)
        with open(args.script, "w", encoding="utf-8") as f:
            f.write(script)
        print(f"wrote {args.script}")
    return execute([["sbatch", args.script]], args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
