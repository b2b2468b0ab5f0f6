"""Does GRPO raise held-out EM over the warm start? Runs the embedded default N times.

    python bench/learning.py --seeds 3 [--config configs/default.py] [--config.train.steps=30 ...]

Each seed changes the world-independent randomness: model init, demonstrations, rollouts and
data order (train.seed and model.init_seed); the synthetic world stays the same. Ends with
one line: `held-out EM: before X after Y gain Z` averaged over the seeds.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from memsearcher_jax.config_utils import load_config, split_overrides  # noqa: E402
from memsearcher_jax.pipeline import run_default_pipeline  # noqa: E402


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3, help="number of seeds (0..N-1)")
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs", "default.py"))
    ap.add_argument("--out", default="runs/bench_learning", help="parent output directory")
    args = ap.parse_args(rest)
    rows = []
    for seed in range(args.seeds):
        cfg = load_config(args.config, overrides)
        cfg.train.seed = seed
        cfg.model.init_seed = seed
        cfg.train.output_dir = os.path.join(args.out, f"seed{seed}")
        t0 = time.perf_counter()
        summary = run_default_pipeline(cfg, resume=False)
        rows.append((seed, 100 * summary["em_before"], 100 * summary["em_after"], time.perf_counter() - t0))
    print(f"\n{'seed':>4}{'EM before':>12}{'EM after':>12}{'gain':>8}{'minutes':>10}")
    for seed, b, a, sec in rows:
        print(f"{seed:>4}{b:>12.1f}{a:>12.1f}{a - b:>8.1f}{sec / 60:>10.1f}")
    before = sum(r[1] for r in rows) / len(rows)
    after = sum(r[2] for r in rows) / len(rows)
    print(f"held-out EM: before {before:.1f} after {after:.1f} gain {after - before:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
