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
