"""bench/learning.py: per seed the default job, the extra-SFT control and the RFT control, in one
table (the jobs stood in for: their own tests are elsewhere)."""
from __future__ import annotations

import os
import types

from tests.bench_loader import load_bench


def _bench():
    return load_bench("learning")


def test_learning_bench_reports_rft_beside_the_control(monkeypatch, capsys, tmp_path):
    bench = _bench()
    calls = []
    monkeypatch.setattr(bench, "train_job", lambda cfg, resume: calls.append(("train", cfg.train.seed)) or
                        {"em_before": 0.1, "em_after": 0.7 + cfg.train.seed / 10, "grpo_seconds": 60.0})
    monkeypatch.setattr(bench, "build_setup", lambda cfg: "setup")
    monkeypatch.setattr(bench, "extra_sft", lambda cfg, setup, d, s: ("control", 7))
    rft = types.SimpleNamespace(model="rft", kept=3, sampled=80, steps=5, sample_seconds=30.0, train_seconds=31.0)
    monkeypatch.setattr(bench, "rft_control", lambda cfg, setup, d, s: calls.append(("rft", s)) or rft)
    em = {"control": 0.2, "rft": 0.75}
    monkeypatch.setattr(bench, "held_out_em", lambda cfg, setup, model: em[model])
    assert bench.main(["--seeds", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert calls == [("train", 0), ("rft", 60.0), ("train", 1), ("rft", 60.0)]  # RFT gets GRPO's seconds
    assert "EM after RFT (same rollouts)" in out
    assert "| 0 | 10.0 | 70.0 | 20.0 | 7 | 75.0 |" in out and "| 1 | 10.0 | 80.0 | 20.0 | 7 | 75.0 |" in out
    assert "GRPO beats RFT on 1 of 2 seeds" in out and "held-out EM: before 10.0 after 75.0 gain 65.0" in out


def test_a_fresh_seed_alone_and_skipped_controls_read_not_run(monkeypatch, capsys, tmp_path):
    """--first-seed 3 --seeds 1 runs seed 3 alone (into OUT/seed3); the controls it skips read "not
    run" in the table, never "nan"; a second run into the same seed directory is refused."""
    bench = _bench()
    dirs = []

    def train(cfg, resume):
        dirs.append((cfg.train.seed, cfg.world.seed, os.path.basename(cfg.train.output_dir)))
        os.makedirs(cfg.train.output_dir, exist_ok=True)
        open(os.path.join(cfg.train.output_dir, "summary.json"), "w").close()
        return {"em_before": 0.07, "em_after": 0.82, "grpo_seconds": 60.0}

    monkeypatch.setattr(bench, "train_job", train)
    argv = ["--first-seed", "3", "--seeds", "1", "--no-control", "--no-rft", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert dirs == [(3, 3, "seed3")]
    assert "| 3 | 7.0 | 82.0 | not run | - | not run | 1.0 |" in out and "nan" not in out
    assert "held-out EM: before 7.0 after 82.0 gain 75.0" in out
    assert bench.main(argv) == 2 and "seed3" in capsys.readouterr().err
    assert bench.main(["--first-seed", "-1", "--out", str(tmp_path / "x")]) == 2
