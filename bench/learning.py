"""Does GRPO, and not just more training, raise held-out EM? The embedded default, N seeds.

    python bench/learning.py --seeds 3 [--first-seed 0] [--config configs/default.py] [--config.train.steps=30 ...]

Per seed (world, demonstrations, rollouts and data order all change with it; the base model
is the shipped one): the default job (warm start on the flawed demonstrations, held-out EM,
GRPO, held-out EM), then the **control**: from the same warm-started model, the same
wall-clock time of extra supervised training on the same demonstrator's episodes instead of
GRPO, and held-out EM again; and the **RFT control** (memsearcher_jax/app/rft.py): GRPO's number of
rollouts sampled from the same warm start, fine-tuned on the successful ones for at least GRPO's
minutes. Prints a row per seed and ends with the one line
`held-out EM: before X after Y gain Z` (averaged over the seeds).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from memsearcher_jax.app.experiment import build_setup
from memsearcher_jax.app.jobs import held_out_em, train_job
from memsearcher_jax.app.rft import rft_control
from memsearcher_jax.app.warm_start import extra_sft
from memsearcher_jax.errors import UserInputError
from memsearcher_jax.rules.run_dir import existing_parent
from memsearcher_jax.settings import load_settings
from memsearcher_jax.settings.config_utils import split_overrides


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3, help="number of seeds (FIRST..FIRST+N-1)")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="the first seed: e.g. --first-seed 3 --seeds 1 runs seed 3 alone (a fresh seed, once a "
                         "setting was chosen on 0-2)")
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs", "default.py"))
    ap.add_argument("--out", default="runs/bench_learning", help="parent output directory")
    ap.add_argument("--no-control", action="store_true", help="skip the extra-SFT control")
    ap.add_argument("--no-rft", action="store_true", help="skip the RFT control (rejection-sampling fine-tuning)")
    ap.add_argument("--fresh", action="store_true",
                    help="start over in OUT/seedN where an earlier run of this bench is (removes what that run "
                         "wrote there, nothing else); without it such a directory is refused")
    args = ap.parse_args(rest)
    if args.seeds < 1 or args.first_seed < 0:
        print(f"bench/learning.py: --seeds {args.seeds} --first-seed {args.first_seed}: expected --seeds >= 1 and "
              "--first-seed >= 0", file=sys.stderr)
        return 2
    refused = check_out(args.out, seed_range(args), args.fresh)
    if refused:
        print(f"bench/learning.py: {refused}", file=sys.stderr)
        return 2
    try:
        rows = run_seeds(args, overrides)
    except UserInputError as e:  # a config or directory the job refuses: its message, before any work
        print(f"bench/learning.py: {e}", file=sys.stderr)
        return 2
    print("\n| seed | EM after SFT | EM after GRPO | EM after extra SFT (control) | control steps | "
          "EM after RFT (same rollouts) | GRPO minutes | job minutes |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seed, b, a, c, n, r, gm, m in rows:
        cells = [str(seed), f"{b:.1f}", f"{a:.1f}"]
        cells += ["not run", "-"] if args.no_control else [f"{c:.1f}", str(n)]
        cells += ["not run"] if args.no_rft else [f"{r:.1f}"]
        cells += [f"{gm:.1f}", f"{m:.1f}"]
        print("| " + " | ".join(cells) + " |")
    if not args.no_rft:
        print(f"GRPO beats RFT on {sum(r[2] > r[5] for r in rows)} of {len(rows)} seeds")
    before = sum(r[1] for r in rows) / len(rows)
    after = sum(r[2] for r in rows) / len(rows)
    if not args.no_control:
        beats = sum(r[2] > r[3] for r in rows)
        print(f"GRPO beats the control on {beats} of {len(rows)} seeds")
    print(f"held-out EM: before {before:.1f} after {after:.1f} gain {after - before:.1f}")
    return 0


def seed_range(args) -> range:
    return range(args.first_seed, args.first_seed + args.seeds)


def check_out(out: str, seeds: range, fresh: bool) -> str:
    """Why --out must not be used (checked before any seed trains), "" when it may: under a file,
    or holding a seed's directory already without --fresh (its results would be replaced)."""
    path = os.path.abspath(os.path.expanduser(out))
    if not os.path.isdir(existing_parent(path)):
        return f"--out {out}: {existing_parent(path)} is a file, not a directory; give a new directory"
    used = [os.path.join(path, f"seed{s}") for s in seeds
            if os.path.isdir(os.path.join(path, f"seed{s}")) and os.listdir(os.path.join(path, f"seed{s}"))]
    if used and not fresh:
        return (f"--out {out} already holds {used[0]}: an earlier run's results would be replaced; give a new "
                "--out, or --fresh to start those seeds over")
    return ""


def run_seeds(args, overrides) -> list[tuple]:
    """The job and its controls per seed: a row (seed, EM before, after, control, control steps, RFT,
    GRPO minutes, job minutes) each."""
    rows = []
    for seed in seed_range(args):
        cfg = load_settings(args.config, overrides).with_values(  # this seed's settings, built once
            {"train.seed": seed, "world.seed": seed, "train.output_dir": os.path.join(args.out, f"seed{seed}")})
        t0 = time.perf_counter()
        summary = train_job(cfg, resume=False)
        minutes = (time.perf_counter() - t0) / 60
        control, control_steps = float("nan"), 0
        if not args.no_control:
            setup = build_setup(cfg)
            model, control_steps = extra_sft(cfg, setup, os.path.join(cfg.train.output_dir, "warmstart"),
                                             summary["grpo_seconds"])
            control = held_out_em(cfg, setup, model)
            print(f"seed {seed} control: {control_steps} extra SFT steps in {summary['grpo_seconds'] / 60:.1f} min, "
                  f"held-out EM {100 * control:.1f}", flush=True)
        rft = float("nan")
        if not args.no_rft:
            setup = build_setup(cfg)
            got = rft_control(cfg, setup, os.path.join(cfg.train.output_dir, "warmstart"), summary["grpo_seconds"])
            rft = held_out_em(cfg, setup, got.model)
            print(f"seed {seed} RFT: kept {got.kept} of {got.sampled} trajectories, {got.steps} steps in "
                  f"{(got.sample_seconds + got.train_seconds) / 60:.1f} min, held-out EM {100 * rft:.1f}", flush=True)
        rows.append((seed, 100 * summary["em_before"], 100 * summary["em_after"], 100 * control, control_steps,
                     100 * rft, summary["grpo_seconds"] / 60, minutes))
    return rows


if __name__ == "__main__":
    sys.exit(main())
