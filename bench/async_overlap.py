"""Rollouts ahead of the learner on the default job: step time at rl.max_staleness K = 0 and K = 1.

    python bench/async_overlap.py [--steps 5] [--warmup 2] [--set KEY=VALUE ...] [--out FILE]

The CPU job of configs/default.py (its shipped base, its world; the warm start left out: it is not
part of a GRPO step), on two host devices of this machine (XLA's host platform device count, set
here before JAX starts): the learner on device 0, the sampler on device 1 (sampler.devices=1) at
both K, so the two rows differ only in K. One process, K = 0 then K = 1, --steps GRPO steps each,
the first --warmup not timed (compiles; K = 1's first step has no rollout made ahead).

It prints the mean step time of each, the rollout's and the learner's time (log-prob pass and
update) at K = 0, and the issue's measure (t(K=0) - t(K=1)) / min(rollout, learner at K=0) against
its target of 0.5 (the share of the shorter phase that running them side by side hides).
"""
from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")  # before JAX starts

import argparse  # noqa: E402
import datetime  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from memsearcher_jax.rules import run_dir  # noqa: E402
from memsearcher_jax.settings import load_settings  # noqa: E402


def job_config(k: int, out: str, extra: list[tuple[str, str]]):
    overrides = [("sft.steps", "0"), ("train.eval_questions", "0"), ("train.output_dir", out),
                 ("rl.max_staleness", str(k)), ("sampler.devices", "1")] + extra
    return load_settings(os.path.join(ROOT, "configs", "default.py"), overrides)


def run_k(k: int, setup, args, tmp: str) -> dict:
    """--steps GRPO steps at K = k; the means over the timed ones."""
    from memsearcher_jax.app.experiment import build_trainer

    trainer = build_trainer(job_config(k, os.path.join(tmp, f"k{k}"), args.extra), setup, progress=False)
    trainer.end_step = args.steps  # no rollout made past the last step
    walls, metrics = [], []
    try:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            metrics.append(trainer.train_step())
            walls.append(time.perf_counter() - t0)
            print(f"K={k} step {len(walls)}: {walls[-1]:.2f} s", flush=True)
    finally:
        trainer.close()
    timed = metrics[args.warmup:]
    mean = lambda key: float(np.mean([m.get(key, 0.0) for m in timed]))
    return {"K": k, "step_s": float(np.mean(walls[args.warmup:])), "rollout_s": mean("time_rollout"),
            "learner_s": mean("time_logprobs") + mean("time_update"), "learner_idle_s": mean("time_learner_idle"),
            "sampler_idle_s": mean("time_sampler_idle"), "staleness_max": max(m.get("staleness_max", 0) for m in timed)}


def report(rows: list[dict], args) -> str:
    sync, ahead = rows
    shorter = min(sync["rollout_s"], sync["learner_s"])
    hidden = (sync["step_s"] - ahead["step_s"]) / shorter
    lines = [f"{datetime.date.today().isoformat()}: configs/default.py (sft.steps=0), sampler.devices=1 on 2 host "
             f"devices, {args.steps} steps per K, the first {args.warmup} not timed", "",
             "| K | step s | rollout s | learner s | learner idle s | sampler idle s | max staleness |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['K']} | {r['step_s']:.2f} | {r['rollout_s']:.2f} | {r['learner_s']:.2f} | "
              f"{r['learner_idle_s']:.2f} | {r['sampler_idle_s']:.2f} | {r['staleness_max']} |" for r in rows]
    verdict = "met" if hidden >= 0.5 else "missed"
    ceiling = (sync["rollout_s"] + sync["learner_s"]) / max(sync["rollout_s"], sync["learner_s"])
    lines += ["", f"(t(K=0) - t(K=1)) / min(rollout, learner at K=0) = ({sync['step_s']:.2f} - {ahead['step_s']:.2f})"
                  f" / {shorter:.2f} = {hidden:.2f}: target 0.5 {verdict}; speed-up "
                  f"{sync['step_s'] / ahead['step_s']:.2f}x (ceiling {ceiling:.2f}x)"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another config override")
    ap.add_argument("--out", default="", help="write the report here too")
    args = ap.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        ap.error(f"--warmup must be in [0, --steps), got {args.warmup} and {args.steps}")
    args.extra = [tuple(kv.split("=", 1)) for kv in args.set]
    from memsearcher_jax.app.experiment import build_setup

    with tempfile.TemporaryDirectory() as tmp:
        setup = build_setup(job_config(0, os.path.join(tmp, "k0"), args.extra))
        rows = [run_k(k, setup, args, tmp) for k in (0, 1)]
    text = report(rows, args)
    print(text, end="")
    if args.out:
        run_dir.write_text(args.out, text)  # a link at --out is replaced, never written through
    return text


if __name__ == "__main__":
    main()
