"""The main job (the README's first command) against the same job at an earlier commit, in one run.

    python bench/main_job.py --baseline 2ef8ac5^ [--out runs/bench_main_job] [--config.KEY=VALUE ...]

Checks the baseline commit out into a new temporary git worktree (removed afterwards), then runs
`memsearcher-jax train --config configs/default.py` from each tree in turn, the baseline first, on
this Python. Each run gets its own fresh output directory and world cache and no persistent
compilation cache, so both build their world and pay every compile, as on a fresh machine.
`--config.KEY=VALUE` overrides go to both runs (the keys must exist at both commits). Prints a
table: seconds, held-out EM before and after GRPO, and the current job's time over the baseline's.

The issue that asked for it (24): the main job, started from a new base, must not get more than
25% slower than the job it replaces, both measured in one session. `2ef8ac5^` is the last commit
whose default started from the first base (reading_tiny, 150 SFT + 30 GRPO steps).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from memsearcher_jax.rules.run_dir import write_json
from memsearcher_jax.settings.config_utils import split_overrides

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def _git(*args: str, cwd: str = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def run_job(tree: str, out: str, overrides: list[str], log_path: str) -> dict:
    """The default job from one source tree, timed; returns its summary.json plus `seconds`."""
    run_dir = os.path.join(out, "run")
    cmd = [sys.executable, "-c", "import sys; from memsearcher_jax.cli import main; sys.exit(main())", "train",
           "--config", os.path.join(tree, "configs", "default.py"),
           f"--config.train.output_dir={run_dir}",
           f"--config.world.cache_dir={os.path.join(out, 'worlds')}",
           "--config.train.compilation_cache_dir=", *overrides]
    env = dict(os.environ, PYTHONPATH=tree)
    t0 = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        rc = subprocess.run(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - t0
    if rc:
        raise SystemExit(f"main_job: the job in {tree} exited {rc}; its output is in {log_path}")
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as f:
        return {**json.load(f), "seconds": seconds}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="git commit (or ref) whose main job is the baseline")
    ap.add_argument("--out", default="runs/bench_main_job",
                    help="parent output directory; must not exist yet (default: %(default)s)")
    args = ap.parse_args(rest)
    # Checked before anything runs: a bad ref or a used output directory fails in a second.
    try:
        commit = _git("rev-parse", "--verify", f"{args.baseline}^{{commit}}")
    except subprocess.CalledProcessError:
        ap.error(f"--baseline {args.baseline!r} is not a commit of {ROOT}")
    out = os.path.abspath(args.out)
    parent = out
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if os.path.exists(out) or not os.path.isdir(parent):
        ap.error(f"--out {out} exists (or lies under a file); give a new directory (this bench never reuses or "
                 "deletes one)")
    current = _git("rev-parse", "HEAD") + ("+changes" if _git("status", "--porcelain", "--untracked-files=no") else "")
    os.makedirs(out)
    work = tempfile.mkdtemp(prefix="main-job-baseline-")
    tree = os.path.join(work, "tree")
    _git("worktree", "add", "--detach", tree, commit)
    try:
        print(f"baseline {commit[:10]} in {tree}; current {current[:16]} in {ROOT}; output under {out}", flush=True)
        results, override_args = {}, [f"--config.{k}={v}" for k, v in overrides]
        for name, source in (("baseline", tree), ("current", ROOT)):
            results[name] = run_job(source, os.path.join(out, name), override_args, os.path.join(out, f"{name}.log"))
            r = results[name]
            print(f"{name}: {r['seconds']:.1f} s, held-out EM {100 * r['em_before']:.1f} -> {100 * r['em_after']:.1f}",
                  flush=True)
    finally:
        _git("worktree", "remove", "--force", tree)
        os.rmdir(work)
    old, new = results["baseline"], results["current"]
    table = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "baseline_commit": commit,
             "current_commit": current, "old_seconds": round(old["seconds"], 1),
             "new_seconds": round(new["seconds"], 1), "slower": round(new["seconds"] / old["seconds"] - 1, 4),
             "old_em_before_after": [100 * old["em_before"], 100 * old["em_after"]],
             "new_em_before_after": [100 * new["em_before"], 100 * new["em_after"]]}
    write_json(os.path.join(out, "main_job.json"), table, indent=1)  # a link there is replaced, not followed
    print("\n| job | commit | seconds | held-out EM before | after | time / baseline |")
    print("|---|---|---:|---:|---:|---:|")
    for name, r, c in (("baseline", old, commit[:10]), ("current", new, current[:16])):
        print(f"| {name} | {c} | {r['seconds']:.1f} | {100 * r['em_before']:.1f} | {100 * r['em_after']:.1f} | "
              f"{r['seconds'] / old['seconds']:.3f} |")
    print(f"\ncurrent main job: {100 * table['slower']:+.1f}% against the baseline (limit +25%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
