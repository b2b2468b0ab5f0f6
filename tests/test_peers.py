"""bench/peers.py (ours vs Tunix): the pieces that need no Tunix venv (end-of-turn pick, rows,
Tunix's view of them, FLOPs, table, our update worker on a tiny model), and, when the Tunix
venv exists, the two sides' GRPO losses agreeing on one micro-batch."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import peers  # noqa: E402

from memsearcher_jax.models import ModelConfig, Qwen2, save_pretrained  # noqa: E402


def tiny_config() -> ModelConfig:
    return ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=16, tie_word_embeddings=True, bos_token_id=0, eos_token_id=1,
                       dtype="float32", param_dtype="float32")


def test_pick_stop_prefers_the_id_that_makes_rows_ragged():
    # 9 ends every row at once (all length 1); 4 ends them at 2, 3 and 4 tokens.
    outputs = [[9, 4, 5, 5], [9, 5, 4, 5], [9, 5, 5, 4]]
    assert peers.pick_stop(outputs, budget=4) == 4
    # Equal raggedness: the id that stops more rows wins.
    assert peers.pick_stop([[1, 2, 3], [3, 1, 2], [2, 2, 2]], budget=3) == 2


def test_rows_mask_only_the_completion_and_tunix_sees_the_same_tokens(tmp_path):
    rows = peers.make_rows(np.random.RandomState(0), 512, 6)
    s = peers.PROMPT + peers.COMPLETION
    assert rows["tokens"].shape == (6, s)
    n = rows["loss_mask"].sum(axis=1)
    assert n.min() >= 64 and n.max() <= peers.COMPLETION
    assert not rows["loss_mask"][:, :peers.PROMPT].any()
    np.testing.assert_array_equal(rows["attention"].sum(axis=1), peers.PROMPT + n)
    old = np.random.RandomState(1).randn(6, s).astype(np.float32)
    d = np.load(peers.tunix_batch(rows, old, old + 1))
    np.testing.assert_array_equal(d["prompt_ids"], rows["tokens"][:, :peers.PROMPT])
    np.testing.assert_array_equal(d["completion_ids"], rows["tokens"][:, peers.PROMPT:])
    np.testing.assert_array_equal(d["completion_mask"], rows["loss_mask"][:, peers.PROMPT:])
    np.testing.assert_array_equal(d["old_logps"], old[:, peers.PROMPT:])
    batch = peers.row_batch(rows)
    assert batch.num_rows == 6 and batch.sampler_logp.shape == rows["loss_mask"].shape


def test_learner_flops_counts_layers_head_and_causal_attention():
    """peers and the learner bench share one FLOP count: every layer at every position, causal
    attention over (seq + 1) / 2 keys on average, the head once (tied or not) at the completion."""
    import dataclasses
    cfg = tiny_config()
    body = 2 * (cfg.num_params() - 512 * 64)
    per_token = body + 4 * 2 * 4 * 16 * 101 / 2
    assert peers.forward_flops(cfg, 3, 100, 40) == pytest.approx(3 * (100 * per_token + 40 * 2 * 512 * 64))
    assert peers.forward_flops(cfg, 3, 100, 100) > peers.forward_flops(cfg, 3, 100, 40)
    untied = dataclasses.replace(cfg, tie_word_embeddings=False)
    assert untied.num_params() == cfg.num_params() + 512 * 64
    assert peers.forward_flops(untied, 3, 100, 40) == pytest.approx(peers.forward_flops(cfg, 3, 100, 40))


def test_table_reports_speed_up_and_share_of_floor(tmp_path):
    rows = [dict(row="sampler plain8", batch=8, work="1024 tokens", ours=2.0, tunix=5.0, floor=1.0,
                 check="same tokens 8/8 rows", rate=4e10, bw=1e10),
            dict(row="GRPO update", batch="8 rows x 512", work="900 trained tokens", ours=10.0, tunix=15.0, floor=4.0,
                 check="", tokens_per_s=[90.0, 60.0], rate=3e10, bw=1e10)]
    out = peers.table(rows)
    assert "| sampler plain8 | 8 | 1024 tokens | 2.00 | 5.00 | 2.50x | 1.00 | 50% | 20% |" in out
    assert "| 10.00 | 15.00 | 1.50x | 4.00 | 40% | 27% |" in out
    assert "Trained tokens/s: ours 90.0, Tunix 60.0." in out
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    shown = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "peers.py"), "--table", str(path)],
                           capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert shown.stdout.strip() == out


@pytest.fixture(scope="module")
def tiny_update(tmp_path_factory):
    """Our update worker's first round on a tiny model: old/ref written for Tunix, loss, timings."""
    tmp = tmp_path_factory.mktemp("peers")
    cfg = tiny_config()
    save_pretrained(Qwen2(cfg, rngs=nnx.Rngs(0)), str(tmp / "ckpt"))
    rows = peers.npz(str(tmp / "rows.npz"), **peers.make_rows(np.random.RandomState(0), cfg.vocab_size, 4))
    old_cache = peers.XLA_CACHE
    peers.XLA_CACHE = str(tmp / "xla")
    try:
        got = peers.ours_update_worker(dict(dir=str(tmp / "ckpt"), rows=rows, micro=2, first=True, repeats=1))
    finally:
        peers.XLA_CACHE = old_cache
    return cfg, str(tmp / "ckpt"), got


@pytest.mark.slow
def test_our_update_worker_reports_loss_and_times(tiny_update):
    _, _, got = tiny_update
    assert np.isfinite(got["loss"]) and got["loss"] != 0.0
    assert len(got["update"]) == 1 and got["update"][0] > 0 and got["logps"][0] > 0
    d = np.load(got["tunix_batch"])
    assert d["old_logps"].shape == (4, peers.COMPLETION) and not np.allclose(d["old_logps"], d["ref_logps"])


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.path.expanduser(os.path.join(peers.DEFAULT_VENV, "bin", "python"))),
                    reason="no Tunix venv (bench/peers_setup.sh makes it)")
def test_tunix_and_ours_agree_on_the_grpo_loss(tiny_update, monkeypatch):
    cfg, ckpt, got = tiny_update
    monkeypatch.setattr(peers, "XLA_CACHE", os.path.join(os.path.dirname(ckpt), "xla"))
    theirs = peers.run_tunix_round(peers.DEFAULT_VENV, ckpt, cfg, got["tunix_batch"], 2, True, 1)
    assert theirs["loss"] == pytest.approx(got["loss"], abs=1e-5)
    assert theirs["update"][0] > 0 and theirs["logps"][0] > 0


# ----------------------------------------------------------------------------- agent-shaped update rows

import peers_agent  # noqa: E402


def test_agent_rows_follow_the_default_jobs_shape():
    """Seeded (the same rows every run), 70-400-token conversations averaging 130-190 tokens,
    the loss mask on each response only, laid out as pack_rows does (quarter-octave width)."""
    rows = peers_agent.make_agent_rows(512, 128)
    again = peers_agent.make_agent_rows(512, 128)
    for k in rows:
        np.testing.assert_array_equal(rows[k], again[k])
    n = rows["attention"].sum(axis=1)
    assert n.min() >= 60 and n.max() <= 400 and 130 <= n.mean() <= 190
    assert rows["tokens"].shape == (128, 448)  # bucket(400, 64, 4 steps an octave): 256, 320, 384, 448, 512
    ctx = rows["context"]
    assert ctx.min() >= 64 and ctx.max() <= 100
    for i in (0, 7, 127):
        assert not rows["loss_mask"][i, :ctx[i]].any() and rows["loss_mask"][i, ctx[i]:n[i]].all()
        assert not rows["loss_mask"][i, n[i]:].any() and (rows["tokens"][i, :n[i]] >= 10).all()
    assert peers_agent.describe(rows).startswith("128 conversations of ")


def test_tunix_agent_layout_left_pads_prompts_and_right_pads_completions():
    rows = peers_agent.make_agent_rows(512, 6)
    old = np.random.RandomState(2).randn(*rows["tokens"].shape).astype(np.float32)
    t = peers_agent.tunix_agent_layout(rows, old, old + 1)
    ctx, n = rows["context"], rows["attention"].sum(axis=1)
    p, c = t["prompt_ids"].shape[1], t["completion_ids"].shape[1]
    assert p == ctx.max() and c == (n - ctx).max()
    for i in range(6):
        k, r = ctx[i], n[i] - ctx[i]
        np.testing.assert_array_equal(t["prompt_ids"][i, p - k:], rows["tokens"][i, :k])
        assert (t["prompt_ids"][i, :p - k] == peers_agent.PAD).all()
        np.testing.assert_array_equal(t["completion_ids"][i, :r], rows["tokens"][i, k:k + r])
        assert (t["completion_ids"][i, r:] == peers_agent.PAD).all() and t["completion_mask"][i].sum() == r
        np.testing.assert_array_equal(t["old_logps"][i, :r], old[i, k:k + r])
        np.testing.assert_array_equal(t["ref_logps"][i, :r], old[i, k:k + r] + 1)


def test_agent_floor_counts_each_conversation_alone():
    cfg = tiny_config()
    rows = peers_agent.make_agent_rows(512, 3)
    n, ctx = rows["attention"].sum(axis=1), rows["context"]
    want = sum(peers.forward_flops(cfg, 1, int(a), int(a - b)) for a, b in zip(n, ctx))
    assert peers_agent.agent_flops(cfg, rows) == pytest.approx(want)
    # Less than the padded rows would cost: attention over each conversation, not the widest.
    assert want < peers.forward_flops(cfg, 3, rows["tokens"].shape[1], int((n - ctx).max()))


@pytest.mark.slow
def test_packed_step_loss_is_the_unpacked_one(tmp_path):
    """The bench's check runs our packed micro-batches; they must give the unpacked step loss."""
    from memsearcher_jax.models import from_pretrained
    from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner
    cfg = tiny_config()
    save_pretrained(Qwen2(cfg, rngs=nnx.Rngs(0)), str(tmp_path))
    d = peers_agent.make_agent_rows(cfg.vocab_size, 12)
    rows = peers.row_batch(d)
    noise = np.random.RandomState(3)
    old, ref = ((-2.0 + 0.3 * noise.randn(*d["loss_mask"].shape)) * d["loss_mask"] for _ in range(2))
    losses = []
    for pack in (True, False):
        learner = GRPOLearner(from_pretrained(str(tmp_path), dtype="float32"),
                              GRPOConfig(optimizer_steps=1, micro_batch_size=4, logprob_batch_size=16, min_seq_len=64,
                                         shuffle_rows=False, pack_rows=pack, loss=peers.LOSS))
        losses.append(peers_agent.packed_step_loss(learner, rows, old.astype(np.float32), ref.astype(np.float32)))
    assert np.isfinite(losses[0]) and losses[0] != 0.0
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.path.expanduser(os.path.join(peers.DEFAULT_VENV, "bin", "python"))),
                    reason="no Tunix venv (bench/peers_setup.sh makes it)")
def test_agent_update_rows_smoke_on_a_tiny_model(tmp_path, monkeypatch):
    """The whole agent_update row at a tiny size: the losses agree, both sides timed, ours packs."""
    import argparse
    cfg = tiny_config()
    ckpt = str(tmp_path / "ckpt")
    save_pretrained(Qwen2(cfg, rngs=nnx.Rngs(0)), ckpt)
    monkeypatch.setattr(peers, "XLA_CACHE", str(tmp_path / "xla"))
    args = argparse.Namespace(agent_rows=8, micro=4, repeats=1, logits_chunk=0, tunix_venv=peers.DEFAULT_VENV)
    update, logps = peers.agent_update_rows(args, ckpt, cfg, lambda: (1e10, 1e10))
    assert update["ours"] > 0 and update["tunix"] > 0 and logps["ours"] > 0 and logps["tunix"] > 0
    gap = float(update["check"].split("(gap ")[1].split(",")[0])
    assert gap <= peers_agent.LOSS_TOL
    assert "padding ours" in update["check"] and update["batch"].startswith("8 conversations")
