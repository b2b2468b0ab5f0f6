"""Learner benchmark: our GRPO log-prob pass and one update step against their floor.

    python bench/learner.py [--layers 24] [--rows 8] [--seq 512] [--logits-chunk 0] [--remat]

A random-weight Qwen2.5-0.5B-shaped model (the `ModelConfig.qwen2_5_0_5b` preset; --layers
keeps every layer's shape and the 151,936-token vocabulary but stacks fewer layers, for a
machine without the memory or the minutes for all 24), f32. One micro-batch of --rows rows of
--seq real tokens each, half of each row a response (loss mask 1), goes through the learner's
own path, `GRPOLearner.train_on_rows` with one optimizer step and one micro-batch: the old and
reference log-prob passes (`time_logprobs`, reported per pass) and the update (gradients of the
GRPO loss, AdamW step). The first call compiles and is reported apart; the timed calls reuse it.

The floor of each is the time its unavoidable work takes on this machine:
- log-prob pass: the forward FLOPs (every layer's matmuls, causal attention over half the row on
  average, the head's logits at the response positions, the only ones the loss reads) / the
  measured matmul rate, or reading the
  weights once / the copy bandwidth, whichever is larger;
- update: 3x the forward FLOPs (forward, and backward to inputs and weights) / matmul rate, plus
  the optimizer's traffic over every parameter (gradient accumulate and AdamW: read params,
  gradients, both moments, write params, moments: ~10 f32 passes) / copy bandwidth.
Nothing is counted that an implementation could skip: attention over masked (future) keys,
materialising the [rows, seq, vocab] logits, recomputation under remat or --logits-chunk are ours.
The matmul rate and bandwidth are measured in the same run (bench/sampler.py's measure_machine).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sampler import measure_machine  # noqa: E402  (bench/sampler.py)

from memsearcher_jax.models import ModelConfig, Qwen2  # noqa: E402
from memsearcher_jax.rl.batching import RowBatch  # noqa: E402
from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner  # noqa: E402
from memsearcher_jax.rl.learner import OptimConfig  # noqa: E402


def forward_flops(cfg: ModelConfig, rows: int, seq: int, head_positions: int) -> float:
    """Matmul FLOPs of one forward over rows x seq tokens, causal attention, and the logits at
    head_positions positions per row (the response: the only logits the loss reads)."""
    L, H, Dh, D, V = cfg.num_layers, cfg.num_heads, cfg.head_dim, cfg.hidden_size, cfg.vocab_size
    body = 2 * (cfg.num_params() - V * D * (1 if cfg.tie_word_embeddings else 2))  # layers, per token
    head = 2 * V * D
    attn = 4 * L * H * Dh * (seq + 1) / 2  # QK^T and PV per token, over the keys up to it (mean (seq + 1) / 2)
    return rows * (seq * (body + attn) + head_positions * head)


def make_rows(rows: int, seq: int, vocab: int, rng: np.random.Generator) -> RowBatch:
    tokens = rng.integers(10, vocab, (rows, seq)).astype(np.int32)
    mask = np.zeros((rows, seq), np.float32)
    mask[:, seq // 2:] = 1  # the response: the second half of every row
    return RowBatch(tokens=tokens, attention=np.ones((rows, seq), np.int32), loss_mask=mask,
                    sampler_logp=np.where(mask > 0, -2.0, 0.0).astype(np.float32),
                    advantages=rng.normal(size=rows).astype(np.float32), traj_ids=np.arange(rows),
                    group_ids=np.arange(rows) // 4, turns=np.zeros(rows, np.int64), is_final=np.ones(rows, bool))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=24, help="decoder layers of the 0.5B shape (24: all of them)")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--logits-chunk", type=int, default=0, help="rl.logits_chunk (0: all positions at once)")
    ap.add_argument("--remat", action="store_true", help="model.remat: recompute each layer in the backward")
    ap.add_argument("--vocab", type=int, default=0, help="a smaller vocabulary, for a quick check (0: the preset's)")
    ap.add_argument("--repeats", type=int, default=1, help="timed calls after the compiling one")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be >= 1 (the timed calls after the compiling one)")

    cfg = ModelConfig.qwen2_5_0_5b(remat=args.remat, dtype="float32", param_dtype="float32").replace(
        num_layers=args.layers, **({"vocab_size": args.vocab} if args.vocab else {}))
    print(f"model: Qwen2.5-0.5B-shaped, {args.layers} of 24 layers, vocab {cfg.vocab_size}, "
          f"{cfg.num_params() / 1e6:.0f}M params, random weights, f32; "
          f"micro-batch {args.rows} x {args.seq} tokens; logits_chunk {args.logits_chunk}, "
          f"remat {args.remat}; devices: {jax.devices()[0].platform} x{jax.device_count()}", flush=True)
    learner = GRPOLearner(Qwen2(cfg, rngs=nnx.Rngs(0)),
                          GRPOConfig(optimizer_steps=1, micro_batch_size=args.rows, logprob_batch_size=args.rows,
                                     min_seq_len=64, max_seq_len=args.seq, logits_chunk=args.logits_chunk,
                                     optim=OptimConfig(learning_rate=1e-6)))
    rows = make_rows(args.rows, args.seq, cfg.vocab_size, np.random.default_rng(0))

    t0 = time.perf_counter()
    first = learner.train_on_rows(rows, np.random.default_rng(0))
    compile_s = time.perf_counter() - t0
    logprob_s, update_s = [], []
    for i in range(args.repeats):
        t0 = time.perf_counter()
        got = learner.train_on_rows(rows, np.random.default_rng(i + 1))
        total = time.perf_counter() - t0
        logprob_s.append(got["time_logprobs"] / 2)  # old and reference: two passes
        update_s.append(total - got["time_logprobs"])
        print(f"  repeat {i}: log-prob pass {logprob_s[-1]:.2f}s, update {update_s[-1]:.2f}s", flush=True)
    assert np.isfinite(first["loss"]) and np.isfinite(got["loss"]), "the update's loss is not finite"

    rate, bw = measure_machine("float32")
    print(f"machine: matmul {rate / 1e9:.1f} GFLOP/s (f32), copy bandwidth {bw / 1e9:.1f} GB/s (read+write); "
          f"other processes share these cores, so numbers are noisy")
    fwd = forward_flops(cfg, args.rows, args.seq, args.seq - args.seq // 2)  # the head on the response half
    pbytes = 4 * cfg.num_params()
    floor_lp = max(fwd / rate, pbytes / bw)
    floor_up = 3 * fwd / rate + 10 * pbytes / bw
    lp, up = min(logprob_s), min(update_s)
    tokens = args.rows * args.seq
    print()
    print(f"first call (compiles both programs, runs both): {compile_s:.1f}s")
    print("| phase | tokens | GFLOP | ours s | ours tok/s | floor s | ours % of floor |")
    print("|---|---|---|---|---|---|---|")
    print(f"| log-prob pass | {tokens} | {fwd / 1e9:.0f} | {lp:.2f} | {tokens / lp:.0f} | {floor_lp:.2f} | "
          f"{100 * floor_lp / lp:.0f}% |")
    print(f"| update step | {tokens} | {3 * fwd / 1e9:.0f} | {up:.2f} | {tokens / up:.0f} | {floor_up:.2f} | "
          f"{100 * floor_up / up:.0f}% |")


if __name__ == "__main__":
    main()
