"""Train a recipe on a Cloud TPU pod slice: create (or reuse) the TPU VM, copy the repo to every
worker, install, and run the same command on all workers with their logs streamed back.

    python launch/tpu_pod.py --config configs/recipe.py:qwen2_5_3b,v5e_64 --name ms-3b \\
        --zone us-west4-a --retrieval shared --retrieval-url http://10.0.0.2:8000 --dry-run

Every worker runs `python -m memsearcher_jax.cli --multihost train ...`: JAX reads the pod
metadata (no coordinator address is needed on TPU VMs), then the usual CLI runs. Extra
`--config.*` overrides after the known flags are passed to training unchanged.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

if __package__ in (None, ""):  # run as a script: make `launch.common` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch.common import (
    TRAIN_ENTRY,
    LaunchError,
    execute,
    load_recipe,
    parse_launch_args,
    render,
    repo_relative,
    retrieval_overrides,
)

REMOTE_DIR = "memsearcher-jax"
TARBALL = "/tmp/memsearcher-jax.tar.gz"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch/tpu_pod.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True,
                   help="configs/recipe.py:MODEL,POD (e.g. qwen2_5_3b,v5e_64), or another config file with a "
                        "TPU hardware section")
    p.add_argument("--name", required=True, help="TPU VM name")
    p.add_argument("--zone", required=True, help="e.g. us-west4-a (v5e), us-central2-b (v4), us-east5-a (v5p)")
    p.add_argument("--project", default=None, help="GCP project (default: gcloud's)")
    p.add_argument("--reuse", action="store_true", help="the TPU VM exists already: skip create")
    p.add_argument("--spot", action="store_true", help="create a Spot (preemptible) slice")
    p.add_argument("--accelerator-type", default=None, help="override the recipe's hardware.accelerator_type")
    p.add_argument("--runtime-version", default=None, help="override the recipe's hardware.runtime_version")
    p.add_argument("--no-install", action="store_true", help="skip copying and installing the repo")
    p.add_argument("--retrieval", choices=("in-process", "shared"), default="shared",
                   help="in-process: each host loads --index-dir and retrieves for its own rows; "
                        "shared: every host calls --retrieval-url")
    p.add_argument("--retrieval-url", default=None, help="retrieval server for --retrieval shared")
    p.add_argument("--index-dir", default=None, help="index dir readable on every host (in-process)")
    p.add_argument("--log", default="train.log", help="log file on each worker (also streamed here)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return p


def commands(args, overrides: list[str]) -> list[list[str]]:
    cfg = load_recipe(args.config)
    hw = cfg.hardware
    if not str(hw.device_kind).lower().startswith("tpu"):
        raise LaunchError(f"{args.config} is a {hw.device_kind} recipe; use launch/slurm_gpu.py for GPUs")
    accel = args.accelerator_type or hw.accelerator_type
    version = args.runtime_version or hw.runtime_version
    where = ["--zone", args.zone] + (["--project", args.project] if args.project else [])
    tpu = ["gcloud", "compute", "tpus", "tpu-vm"]
    cmds = []
    if not args.reuse:
        cmds.append(tpu + ["create", args.name, *where, f"--accelerator-type={accel}", f"--version={version}"]
                    + (["--spot"] if args.spot else []))
    if not args.no_install:
        cmds.append(["git", "-C", os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "archive",
                     "--format=tar.gz", "-o", TARBALL, "HEAD"])
        cmds.append(tpu + ["scp", TARBALL, f"{args.name}:~/", "--worker=all", *where])
        install = (f"mkdir -p ~/{REMOTE_DIR} && tar xzf ~/{os.path.basename(TARBALL)} -C ~/{REMOTE_DIR} && "
                   f"cd ~/{REMOTE_DIR} && pip install -q -U 'jax[tpu]' -e .")
        cmds.append(tpu + ["ssh", args.name, *where, "--worker=all", f"--command={install}"])
    train = TRAIN_ENTRY + ["--config", repo_relative(args.config)] + retrieval_overrides(
        args.retrieval, args.retrieval_url, args.index_dir) + overrides
    # All workers run the same program; `tee` keeps a per-worker copy while ssh streams it here.
    remote = f"cd ~/{REMOTE_DIR} && {render(train)} 2>&1 | tee ~/{shlex.quote(args.log)}"
    cmds.append(tpu + ["ssh", args.name, *where, "--worker=all", f"--command={remote}"])
    return cmds


def main(argv=None) -> int:
    args, rest = parse_launch_args(build_parser(), argv)
    try:
        return execute(commands(args, rest), args.dry_run)
    except LaunchError as e:
        print(f"tpu_pod: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
