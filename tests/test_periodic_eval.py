"""Periodic held-out evaluation, the best checkpoint, sample logging, optional W&B."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.test_train_step import ROOT, SMALL

pytestmark = pytest.mark.slow


def _run(out, worlds, *extra):
    args = [sys.executable, "-m", "memsearcher_jax.cli", "train", "--config", os.path.join(ROOT, "configs/default.py")]
    for k, v in SMALL + [("world.cache_dir", worlds), ("train.output_dir", out), *extra]:
        args.append(f"--config.{k}={v}")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", PYTHONPATH=ROOT)
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)


def test_eval_every_logs_eval_metrics_keeps_the_best_and_logs_samples(tmp_path):
    out, worlds = str(tmp_path / "run"), str(tmp_path / "worlds")
    res = _run(out, worlds, ("train.steps", "2"), ("train.eval_every", "1"), ("train.eval_questions", "4"),
               ("train.log_samples_every", "1"), ("train.wandb_project", "memsearcher-test"))
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [json.loads(x) for x in open(os.path.join(out, "logs", "metrics.jsonl"))]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert 0.0 <= m["eval/em"] <= 1.0 and "eval/f1" in m and m["eval/turns"] >= 1
    best = sorted(os.listdir(os.path.join(out, "best")))
    assert len([d for d in best if d.isdigit()]) == 1  # Orbax keeps one: the highest eval/em
    samples = [json.loads(x) for x in open(os.path.join(out, "logs", "samples.jsonl"))]
    assert [s["step"] for s in samples] == [1, 2]
    first = samples[0]["samples"][0]
    assert first["question"] and first["conversations"] and "<|im_start|>" in first["conversations"][0]
    try:
        import wandb  # noqa: F401
    except ImportError:
        assert "wandb is not installed" in res.stderr  # said once, and the run went on
    exported = str(tmp_path / "hf")
    from memsearcher_jax.cli import main

    assert main(["export-hf", "--checkpoint", out, "--best", "--out", exported]) == 0
    assert os.path.isfile(os.path.join(exported, "model.safetensors"))


def test_export_best_without_periodic_eval_says_why(tmp_path, capsys):
    from memsearcher_jax.cli import main

    os.makedirs(tmp_path / "run" / "checkpoints")
    assert main(["export-hf", "--checkpoint", str(tmp_path / "run"), "--best", "--out", str(tmp_path / "x")]) == 2
    assert "train.eval_every" in capsys.readouterr().err
