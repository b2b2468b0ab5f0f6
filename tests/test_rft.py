"""The RFT control (memsearcher_jax/app/rft.py): it samples GRPO's number of rollouts from the warm
start and fine-tunes on the successful ones only."""
from __future__ import annotations

import numpy as np
import pytest

from memsearcher_jax.qa_metrics import RewardResult
from tests.test_train_step import _config


def parity_reward(assistant_blocks, ended_with_eos, golds) -> RewardResult:
    """A reward plugin that splits a random model's episodes about in half, by content: 1.0 when the
    last block has an even number of characters, else 0.5."""
    ok = len(assistant_blocks[-1]) % 2 == 0 if assistant_blocks else False
    return RewardResult(reward=1.0 if ok else 0.5, em=float(ok), f1=float(ok), format_ok=True, answer=None)


def test_kept_trajectories_needs_the_threshold_and_the_format():
    from memsearcher_jax.app.rft import kept_trajectories

    results = [RewardResult(1.0, 1.0, 1.0, True, "a"), RewardResult(0.99, 0.0, 0.99, True, "b"),
               RewardResult(1.0, 1.0, 1.0, False, "c"), RewardResult(0.1, 0.0, 0.0, True, "d"),
               RewardResult(0.9999999999999999, 1.0, 1.0, True, "e")]  # 1 a float's last bit short
    assert kept_trajectories("wxyze", results) == ["w", "e"]
    assert kept_trajectories("wxyze", results, min_reward=0.1) == ["w", "x", "z", "e"]


@pytest.mark.slow
def test_rft_trains_on_the_successful_trajectories_only(tmp_path, monkeypatch, capsys):
    from memsearcher_jax.app import rft
    from memsearcher_jax.app.experiment import build_setup, load_policy
    from memsearcher_jax.models import save_pretrained

    cfg = _config(tmp_path, "rft", [("train.steps", "2"), ("rl.reward_fn", "tests.test_rft:parity_reward")])
    setup = build_setup(cfg)
    model_dir = str(tmp_path / "warm")
    save_pretrained(load_policy(cfg, setup, lora=False), model_dir, tokenizer_dir=setup.tokenizer_dir)
    sampled, trained = [], []
    real_sample = rft.sample_rollouts
    monkeypatch.setattr(rft, "sample_rollouts", lambda *a, **k: sampled.extend(real_sample(*a, **k)) or sampled)

    def fake_sft(model, convs, config, pad_id, optim=None, seconds=None, tied_rows=None, min_steps=0):
        trained.extend(convs)
        return model, [{"loss": 0.0}] * min_steps

    monkeypatch.setattr(rft, "sft_train", fake_sft)
    got = rft.rft_control(cfg, setup, model_dir, seconds=0.0)
    trajs = [(t, r) for ts, rs in sampled for t, r in zip(ts, rs)]
    assert len(trajs) == got.sampled == 2 * cfg.rl.batch_questions * cfg.rl.group_size
    good = [t for t, r in trajs if r.reward >= 1.0]
    assert 0 < len(good) < len(trajs), "the parity reward should keep some episodes and drop others"
    want = [id(c) for t in good for c in t.conversations]
    assert [id(c) for c in trained] == want
    assert got.kept == len(good) and got.rows == len(want)
    assert got.steps == -(-len(want) // cfg.sft.batch_size)  # at least one pass over the kept rows
    # the two steps asked different questions (GRPO's data order)
    assert {t.question for t in sampled[0][0]} != {t.question for t in sampled[1][0]}
    # the sampling shows its progress: steps, and the trajectories kept of those sampled so far
    bar = capsys.readouterr().err
    assert "RFT sampling" in bar and "2/2" in bar and f"kept={got.kept}/{got.sampled}" in bar


def test_the_controls_continue_at_the_warm_starts_final_rate_until_the_clock_ends(tmp_path):
    """continued_sft (extra_sft's and RFT's settings): no warmup, no step limit that a run could
    reach, the given batch seed, and a constant rate where the warm start's schedule ended."""
    from memsearcher_jax.app.warm_start import continued_sft, sft_config

    cfg = _config(tmp_path, "run")
    sft_cfg, optim = continued_sft(cfg, seed=123)
    warm = sft_config(cfg, 10)  # the warm start's settings at any step count
    assert sft_cfg.warmup == 0 and sft_cfg.steps >= 10 ** 9 and sft_cfg.seed == 123 and not sft_cfg.progress
    assert sft_cfg.batch_size == warm.batch_size and sft_cfg.max_len == warm.max_len
    assert 0 < optim.learning_rate == pytest.approx(cfg.sft.learning_rate * warm.final_lr_fraction)
    assert optim.learning_rate < cfg.sft.learning_rate
    assert (optim.weight_decay, optim.max_grad_norm) == (warm.weight_decay, warm.max_grad_norm)


@pytest.mark.parametrize("n, batch_size", [(10, 4), (7, 3), (5, 8), (33, 8)])
def test_the_pass_over_the_kept_rows_sees_every_row(monkeypatch, n, batch_size):
    """RFT asks sft_train for ceil(rows / batch_size) steps before its clock may stop it: one pass
    over the kept rows. The batches drawn in those steps must hold every row (the end of an epoch
    shorter than a batch, or a batch larger than the rows, dropped some), whatever the seed."""
    from types import SimpleNamespace

    from memsearcher_jax.rl import sft

    seen = []

    class Recorder:  # SFTTrainer's interface, recording the rows of each step
        def __init__(self, model, config, tied_rows=None, optim=None):
            pass

        def train_step(self, rows, idx):
            seen.append(np.asarray(idx).tolist())
            return {"loss": 0.0, "length": 8}

        def model(self):
            return None

    monkeypatch.setattr(sft, "SFTTrainer", Recorder)
    convs = [SimpleNamespace(prompt_ids=[1] * (2 + i % 5), response_ids=[2] * (1 + i % 3), loss_mask=[1] * (1 + i % 3))
             for i in range(n)]
    for seed in range(20):
        seen.clear()
        cfg = sft.SFTConfig(max_len=2048, min_len=64, steps=10 ** 9, batch_size=batch_size, seed=seed, progress=False)
        _, history = sft.sft_train(None, convs, cfg, seconds=0.0, min_steps=-(-n // batch_size))
        assert len(history) == len(seen) == -(-n // batch_size)
        assert all(len(b) == batch_size for b in seen)
        assert sorted({i for b in seen for i in b}) == list(range(n)), (seed, seen)
