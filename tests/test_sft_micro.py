"""SFT gradient accumulation (sft.max_batch_tokens): a batch padded past the budget takes the same
update from micro-batches, over a few fixed shapes, none padded past the budget."""
import os

import jax
import numpy as np
import pytest
from flax import nnx

from memsearcher_jax.agent.rollout import Conversation
from memsearcher_jax.models import ModelConfig, Qwen2
from memsearcher_jax.rl.sft import SFTConfig, SFTTrainer, build_rows, plan_micro_batches
from memsearcher_jax.runtime import compile_stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 128


def _model(seed=0):
    return Qwen2(ModelConfig.tiny(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_layers=2),
                 rngs=nnx.Rngs(seed))


def _convs(lengths, seed=0, answer=3):
    """Conversations of `lengths` tokens: a prompt, a masked observation, then `answer` loss tokens
    among 70..79 (the tied rows below) and two more loss tokens elsewhere in the response."""
    rng = np.random.default_rng(seed)
    convs = []
    for n in lengths:
        prompt = rng.integers(10, 60, size=max(n - answer - 3, 1)).tolist()
        response = [int(rng.integers(60, 70))] + [int(t) for t in rng.integers(10, 90, 2)] + \
            rng.integers(70, 80, answer).tolist()
        mask = [1, 0, 0] + [1] * answer
        convs.append(Conversation(prompt_ids=prompt, response_ids=response, loss_mask=mask))
    return convs


def _plan_ok(plan, lengths, budget, bucket_for):
    """Every row exactly once; a micro-batch within the budget unless it is one row; power-of-two row counts."""
    seen = np.concatenate([mb.idx for mb in plan])
    assert sorted(seen.tolist()) == list(range(len(lengths)))
    for mb in plan:
        assert mb.rows >= len(mb.idx) >= 1 and mb.rows & (mb.rows - 1) == 0
        assert mb.width == bucket_for(int(np.max(lengths[mb.idx])))
        assert mb.rows * mb.width <= budget or mb.rows == 1, (mb.rows, mb.width, budget)


def test_plan_keeps_every_micro_batch_within_the_budget():
    bucket_for = SFTConfig(min_len=16).bucket_for
    lengths = np.array([120, 100, 90, 75, 64, 40, 33, 25, 20, 19, 18])
    plan = plan_micro_batches(lengths, 256, bucket_for)
    _plan_ok(plan, lengths, 256, bucket_for)
    # Longest first; the last three rows (bucket 20) run as four, one repeated at weight 0.
    assert [(lengths[mb.idx].tolist(), mb.rows, mb.width) for mb in plan] == [
        ([120, 100], 2, 128), ([90, 75], 2, 96), ([64, 40, 33, 25], 4, 64), ([20, 19, 18], 4, 20)]
    # A row longer than the budget runs alone, in one row; the others still fit.
    long = np.array([30, 1500, 31, 12, 700])
    plan = plan_micro_batches(long, 512, bucket_for)
    _plan_ok(plan, long, 512, bucket_for)
    assert (plan[0].idx.tolist(), plan[0].rows) == ([1], 1) and plan[0].width >= 1500
    assert (plan[1].idx.tolist(), plan[1].rows) == ([4], 1)
    # Random batches: the same rules, and row counts from a small set for each width.
    rng = np.random.default_rng(0)
    shapes = set()
    for _ in range(200):
        lengths = rng.integers(2, 1400, rng.integers(1, 33))
        plan = plan_micro_batches(lengths, 4096, bucket_for)
        _plan_ok(plan, lengths, 4096, bucket_for)
        shapes |= {(mb.rows, mb.width) for mb in plan}
    widths = {w for _, w in shapes}
    assert len(shapes) <= 6 * len(widths)


def test_max_batch_tokens_is_checked():
    with pytest.raises(ValueError, match="max_batch_tokens must be >= 0"):
        SFTConfig(max_batch_tokens=-1)
    from memsearcher_jax.app.experiment import config_problems
    from memsearcher_jax.app.warm_start import sft_config
    from memsearcher_jax.settings.config_utils import load_config

    cfg = load_config(os.path.join(ROOT, "configs/default.py"), [])
    assert cfg.sft.max_batch_tokens == 0 and sft_config(cfg, 10).max_batch_tokens == 0  # default: never split
    cfg.sft.max_batch_tokens = 4096
    assert sft_config(cfg, 10).max_batch_tokens == 4096
    cfg.sft.max_batch_tokens = -5
    assert any("sft.max_batch_tokens=-5" in p for p in config_problems(cfg))


@pytest.mark.parametrize("tied", [None, [[70, 71, 72, 73, 74], [75, 76, 77, 78, 79, 100]]])
@pytest.mark.slow
def test_a_split_step_is_the_unsplit_step(tied):
    lengths = [120, 100, 90, 75, 64, 40, 33, 25, 20, 19, 18]
    rows = build_rows(_convs(lengths), pad_id=0, max_len=256)
    base = SFTConfig(max_len=2048, steps=10, batch_size=len(lengths), lr=1e-3, warmup=0, min_len=16, progress=False)
    whole = SFTTrainer(_model(), base, tied_rows=tied)
    split = SFTTrainer(_model(), SFTConfig(**{**base.__dict__, "max_batch_tokens": 256}), tied_rows=tied)
    idx = np.random.default_rng(1).permutation(len(lengths))
    for _ in range(2):  # the second step also compares the optimizer state the first one left
        a, b = whole.train_step(rows, idx), split.train_step(rows, idx)
        assert a["micro_batches"] == 1 and b["micro_batches"] == 4
        assert a["tokens"] == b["tokens"] == rows.weights.sum() and a["length"] == b["length"] == 128
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5)
        np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-4)
    start = jax.tree.leaves(nnx.split(_model(), nnx.Param)[1])
    moved, apart, norm = 0.0, 0.0, 0.0
    for x, y, x0 in zip(jax.tree.leaves(whole.params), jax.tree.leaves(split.params), start):
        x, y, x0 = (np.asarray(a, np.float64) for a in (x, y, x0))
        # Adam's first steps are about lr * sign(grad): compare each weight to a small fraction of lr.
        np.testing.assert_allclose(y, x, atol=2e-5)
        moved = max(moved, float(np.abs(x - x0).max()))
        apart, norm = apart + float(np.sum((y - x) ** 2)), norm + float(np.sum(x ** 2))
    assert np.sqrt(apart) <= 1e-5 * np.sqrt(norm), (np.sqrt(apart), np.sqrt(norm))  # all weights, relative
    assert moved > 1e-3  # two steps did move the weights
    if tied:
        embed = np.asarray(split.model().embed[...]) - np.asarray(_model().embed[...])
        np.testing.assert_allclose(embed[100], embed[75], atol=1e-6)  # a group moved together
        assert np.abs(embed[100]).max() > 1e-4 and np.abs(embed[100] - embed[70]).max() > 1e-4


@pytest.mark.slow
def test_split_steps_compile_once_per_micro_batch_shape():
    # Batches of every size and length mix: programs come only from new micro-batch shapes (one
    # each), plus the zeroing and the update once; never one per batch or per micro-batch count.
    rng = np.random.default_rng(2)
    lengths = rng.choice([10, 14, 30, 60, 120], 96)  # buckets 16, 32, 64, 128: few shapes to compile
    rows = build_rows(_convs(lengths, seed=2, answer=1), pad_id=0, max_len=256)
    cfg = SFTConfig(max_len=2048, steps=10, batch_size=16, warmup=0, min_len=16, max_batch_tokens=128, progress=False)
    trainer = SFTTrainer(_model(), cfg)
    seen, micro_batches = set(), 0
    for step in range(8):
        idx = rng.choice(len(lengths), int(rng.integers(6, 17)), replace=False)
        plan = plan_micro_batches(rows.lengths[idx], cfg.max_batch_tokens, cfg.bucket_for)
        new = {(mb.rows, mb.width) for mb in plan} - seen
        before = compile_stats.snapshot()
        stats = trainer.train_step(rows, idx)
        programs = (compile_stats.snapshot() - before).programs
        assert stats["micro_batches"] == len(plan) > 1
        assert programs == len(new) + (2 if step == 0 else 0), (step, programs, new)
        seen |= new
        micro_batches += len(plan)
    assert len(seen) < micro_batches / 3  # shapes were reused across batches
