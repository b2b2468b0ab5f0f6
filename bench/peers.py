"""Ours vs Google Tunix (google-tunix 0.1.7), side by side on one checkpoint, and vs a floor.

    bench/peers_setup.sh                      # once: Tunix's own venv (it pins safetensors<0.8)
    python bench/peers.py [--quick] [--small] [--rows plain1,plain8,plain32,agent,update]

One random-weight Qwen2.5-0.5B-shaped f32 checkpoint (HF format; --small: a smaller shape) is
written once and loaded by both sides. Tunix runs in a subprocess of its venv
(bench/peers_tunix.py), so both sides hold their model at once; the repeats of a row alternate
ours, Tunix, ours, Tunix..., so load from other processes hits both alike. Compile time (each
side's first call) is never inside a timing; the best repeat is reported.

Rows:
- plainB: batch B, 256-token prompts, 128 new tokens, greedy, no stop. Checked first: both
  sides produce the same tokens (the share of identical rows is printed).
- agent: batch 32 (--quick: 8), one shared 500-token prefix + ragged 50-300-token suffixes,
  stop on an end-of-turn id, 128 new tokens. Tunix's stop rule is `eos_tokens` (single ids,
  no sequences); it left-pads to `max_prompt_length`, given here as the longest prompt (its
  default, the next power of two, would cost it more).
- update: the GRPO update on R = B x G rows of 512 tokens (256 prompt + 64-256 completion,
  right-padded), loss mask on the completion, clip 0.2, dual clip 3, KL coef 0.001 (k3),
  AdamW lr 1e-6 after global-norm clipping 1.0, micro-batch 8, gradients of each
  micro-batch's token mean averaged (Tunix: optax.MultiSteps over its PeftTrainer step with
  rl.algo_core.grpo_loss_fn; ours: GRPOLearner, aggregation microbatch_token_mean). The loss
  of one micro-batch is checked to agree first. Timed: one optimizer step (all micro-batches),
  and one log-prob pass over the rows (ours: the learner's compute_logprobs; Tunix:
  rl.common.compute_per_token_logps per micro-batch).
- whole GRPO step: not run; Tunix's loop (rl_cluster + GRPOLearner) wants a tokenizer, a
  grain dataset and text reward functions; see the README section for what was tried.

Floors: decode/prefill as in bench/sampler.py; update = 3 x forward FLOPs / matmul rate +
AdamW traffic (7 parameter-sized arrays read or written) / copy bandwidth; log-probs =
forward FLOPs / matmul rate. FLOPs count every position's logits (the loss needs them).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sampler import floor_seconds, measure_machine, small_config  # noqa: E402  (bench/sampler.py)

from memsearcher_jax.models import ModelConfig, Qwen2, from_pretrained, save_pretrained  # noqa: E402
from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner, RowBatch, micro_batch_loss  # noqa: E402
from memsearcher_jax.rl.learner import OptimConfig  # noqa: E402
from memsearcher_jax.rl.losses import LossConfig  # noqa: E402
from memsearcher_jax.sampling import BucketConfig, Sampler  # noqa: E402

EOT = 7
PAD = 0
DEFAULT_VENV = "~/.cache/memsearcher-jax/tunix-venv"
PROMPT, COMPLETION, MICRO = 256, 256, 8
CLIP, DUAL_CLIP, KL_COEF, LR = 0.2, 3.0, 0.001, 1e-6


class Tunix:
    """The Tunix worker subprocess (bench/peers_tunix.py in Tunix's venv)."""

    def __init__(self, venv: str):
        py = os.path.join(os.path.expanduser(venv), "bin", "python")
        if not os.path.exists(py):
            raise SystemExit(f"no Tunix venv at {venv}: run bench/peers_setup.sh first (or pass --tunix-venv)")
        here = os.path.dirname(os.path.abspath(__file__))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.proc = subprocess.Popen([py, os.path.join(here, "peers_tunix.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=tempfile.gettempdir())
        self.info = json.loads(self.proc.stdout.readline())

    def __call__(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        if "error" in reply:
            raise RuntimeError(f"Tunix worker failed on {req['op']}: {reply['error']}")
        return reply

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def tunix_config(cfg: ModelConfig) -> dict:
    return dict(num_layers=cfg.num_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.hidden_size,
                hidden_dim=cfg.intermediate_size, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                num_kv_heads=cfg.num_kv_heads, rope_theta=int(cfg.rope_theta), norm_eps=cfg.rms_norm_eps,
                use_tied_embedding=cfg.tie_word_embeddings)


def npz(**arrays) -> str:
    path = tempfile.mktemp(suffix=".npz")
    np.savez(path, **arrays)
    return path


# ----------------------------------------------------------------------------- sampler rows

def make_prompts(case: str, rng, vocab: int, quick: bool):
    if case.startswith("plain"):
        return [rng.randint(10, vocab, PROMPT).tolist() for _ in range(int(case[5:]))], ()
    system = rng.randint(10, vocab, 500).tolist()
    n = 8 if quick else 32
    return [system + rng.randint(10, vocab, int(rng.randint(50, 301))).tolist() for _ in range(n)], (EOT,)


def sampler_row(case, sampler, tunix, cfg, rng, repeats, quick, rate, bw):
    prompts, stops = make_prompts(case, rng, cfg.vocab_size, quick)
    new = 128
    grid = np.full((len(prompts), max(map(len, prompts))), -1, np.int64)
    for i, p in enumerate(prompts):
        grid[i, :len(p)] = p
    treq = dict(op="sample", prompts=npz(prompts=grid), new=new, eos=list(stops), max_prompt_length=grid.shape[1])
    ours_fn = lambda: sampler.generate(prompts, max_new_tokens=new, stop_token_ids=stops)
    outs = ours_fn()  # compiles
    theirs = np.load(tunix(**treq)["tokens"])["tokens"]  # compiles
    same = sum(o.tokens == [int(t) for t in row if t >= 0] for o, row in zip(outs, theirs))
    ours_t, tunix_t = [], []
    for _ in range(repeats):  # interleaved
        t0 = time.perf_counter()
        ours_fn()
        ours_t.append(time.perf_counter() - t0)
        tunix_t.append(tunix(**treq)["seconds"])
    if case == "agent":
        distinct = 500 + sum(len(p) - 500 for p in prompts)
        ctx = (500 * 250 + sum((len(p) - 500) * (500 + (len(p) - 500) / 2) for p in prompts)) / distinct
    else:
        distinct, ctx = sum(map(len, prompts)), PROMPT / 2
    floor = floor_seconds(cfg, distinct, ctx, [(len(p), len(o.tokens)) for p, o in zip(prompts, outs)], rate, bw, 4, 4)
    tokens = sum(len(o.tokens) for o in outs)
    return dict(row=f"sampler {case}", batch=len(prompts), work=f"{tokens} tokens", ours=min(ours_t),
                tunix=min(tunix_t), floor=floor, check=f"same tokens {same}/{len(prompts)} rows")


# ----------------------------------------------------------------------------- update row

def make_rows(rng, vocab: int, n_rows: int) -> RowBatch:
    s = PROMPT + COMPLETION
    tokens = np.full((n_rows, s), PAD, np.int32)
    attention = np.zeros((n_rows, s), np.int32)
    mask = np.zeros((n_rows, s), np.float32)
    for i in range(n_rows):
        n = int(rng.randint(64, COMPLETION + 1))
        tokens[i, :PROMPT + n] = rng.randint(10, vocab, PROMPT + n)
        attention[i, :PROMPT + n] = 1
        mask[i, PROMPT:PROMPT + n] = 1
    adv = rng.randn(n_rows).astype(np.float32)
    ids = np.arange(n_rows)
    return RowBatch(tokens=tokens, attention=attention, loss_mask=mask, sampler_logp=np.zeros_like(mask),
                    advantages=adv, traj_ids=ids, group_ids=ids // 4, turns=np.zeros(n_rows, np.int64),
                    is_final=np.ones(n_rows, bool))


def tunix_batch(rows: RowBatch, old: np.ndarray, ref: np.ndarray) -> str:
    """Our [R, S] rows as Tunix's TrainExample fields: prompt [R, P], completion [R, C] (right-padded),
    log-probs of the completion tokens."""
    c = slice(PROMPT, PROMPT + COMPLETION)
    return npz(prompt_ids=rows.tokens[:, :PROMPT], completion_ids=rows.tokens[:, c],
               completion_mask=rows.loss_mask[:, c], advantages=rows.advantages, old_logps=old[:, c],
               ref_logps=ref[:, c])


def learner_flops(cfg: ModelConfig, rows: int, seq: int) -> float:
    """Forward FLOPs over [rows, seq]: every layer, every position's logits, causal attention."""
    body = 2 * (cfg.num_params() - cfg.vocab_size * cfg.hidden_size)
    head = 2 * cfg.vocab_size * cfg.hidden_size
    attn = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq / 2
    return rows * seq * (body + head + attn)


def update_rows(model, tunix, cfg, rng, repeats, n_rows, rate, bw):
    loss_cfg = LossConfig(clip_low=CLIP, clip_high=CLIP, dual_clip=DUAL_CLIP, kl_coef=KL_COEF, kl_clamp=10.0,
                          log_ratio_clamp=20.0, entropy_coef=0.0, aggregation="microbatch_token_mean",
                          kl_estimator="low_var_kl")
    learner = GRPOLearner(model, GRPOConfig(optimizer_steps=1, micro_batch_size=MICRO, logprob_batch_size=MICRO,
                                            shuffle_rows=False, min_seq_len=64, loss=loss_cfg,
                                            optim=OptimConfig(learning_rate=LR)))
    rows = make_rows(rng, cfg.vocab_size, n_rows)
    lp = learner.compute_logprobs(learner.params, rows)
    noise = lambda: (0.3 * rng.randn(*lp.shape)).astype(np.float32) * rows.loss_mask
    old, ref = lp + noise(), lp + noise()
    tunix(op="update_setup", lr=LR, clip=CLIP, kl_coef=KL_COEF, dual_clip=DUAL_CLIP, micro_batches=n_rows // MICRO)

    # The loss of the first micro-batch, both sides, same params and batch.
    first = slice(0, MICRO)
    m = rows.loss_mask[first]
    mb = {"tokens": jnp.asarray(rows.tokens[first]), "attention": jnp.asarray(rows.attention[first]),
          "loss_mask": jnp.asarray(m), "weights": jnp.asarray(m / m.sum()),
          "advantages": jnp.asarray(rows.advantages[first]), "old_logp": jnp.asarray(old[first]),
          "ref_logp": jnp.asarray(ref[first])}
    ours_loss = float(jax.jit(micro_batch_loss, static_argnums=(1, 3))(learner.params, learner.graphdef, mb,
                                                                        loss_cfg)[0])
    tunix_loss = tunix(op="loss", batch=tunix_batch(rows.take(np.arange(MICRO)), old[first], ref[first]))["loss"]

    batch = tunix_batch(rows, old, ref)
    learner.train_on_rows(rows, np.random.default_rng(0))  # compiles
    tunix(op="update", batch=batch)
    tunix(op="logps", batch=batch)
    ours_u, ours_l, tunix_u, tunix_l = [], [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        got = learner.train_on_rows(rows, np.random.default_rng(0))
        total = time.perf_counter() - t0
        ours_l.append(got["time_logprobs"] / 2)  # old and ref: two passes
        ours_u.append(total - got["time_logprobs"])
        tunix_u.append(tunix(op="update", batch=batch)["seconds"])
        tunix_l.append(tunix(op="logps", batch=batch)["seconds"])
    fwd = learner_flops(cfg, n_rows, PROMPT + COMPLETION)
    adam_bytes = 7 * 4 * cfg.num_params()
    trained = int(rows.loss_mask.sum())
    check = f"loss ours {ours_loss:.6f} Tunix {tunix_loss:.6f}"
    return [dict(row="GRPO update (1 optimizer step)", batch=n_rows, work=f"{trained} trained tokens",
                 ours=min(ours_u), tunix=min(tunix_u), floor=3 * fwd / rate + adam_bytes / bw, check=check,
                 tokens_per_s=(trained / min(ours_u), trained / min(tunix_u))),
            dict(row="log-prob pass", batch=n_rows, work=f"{n_rows * (PROMPT + COMPLETION)} tokens",
                 ours=min(ours_l), tunix=min(tunix_l), floor=fwd / rate, check="")], abs(ours_loss - tunix_loss)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rows and repeats (a shared machine)")
    ap.add_argument("--small", action="store_true", help="a smaller model shape than Qwen2.5-0.5B")
    ap.add_argument("--rows", default="", help="comma list of plain1,plain8,plain32,agent,update")
    ap.add_argument("--repeats", type=int, default=0)
    ap.add_argument("--tunix-venv", default=DEFAULT_VENV)
    args = ap.parse_args()
    rows = [r for r in (args.rows or ("plain1,plain8,update" if args.quick else "plain1,plain8,plain32,agent,update"))
            .split(",") if r]
    repeats = args.repeats or (2 if args.quick else 3)
    cfg = (small_config() if args.small else ModelConfig.qwen2_5_0_5b()).replace(dtype="float32",
                                                                                  param_dtype="float32")
    tmp = tempfile.mkdtemp(prefix="bench_peers_")
    save_pretrained(Qwen2(cfg, rngs=nnx.Rngs(0)), tmp)
    model = from_pretrained(tmp, dtype="float32")
    tunix = Tunix(args.tunix_venv)
    n_params = tunix(op="load", dir=tmp, config=tunix_config(cfg))["params"]
    print(f"model: {'small' if args.small else 'Qwen2.5-0.5B'}-shaped, {cfg.num_params() / 1e6:.0f}M params "
          f"(Tunix loaded {n_params / 1e6:.0f}M), random weights, float32, {tmp}; Tunix jax {tunix.info['jax']}, "
          f"ours jax {jax.__version__}; XLA CPU, {os.cpu_count()} cores shared with other jobs", flush=True)
    rate, bw = measure_machine("float32")
    print(f"machine: matmul {rate / 1e9:.1f} GFLOP/s, copy bandwidth {bw / 1e9:.1f} GB/s", flush=True)
    rng = np.random.RandomState(0)
    sampler = Sampler(model, cache_dtype=jnp.float32, buckets=BucketConfig(min_shared_prefix=64))
    results, loss_gap = [], None
    for case in rows:
        if case == "update":
            got, loss_gap = update_rows(model, tunix, cfg, rng, repeats, 8 if args.quick else 16, rate, bw)
            results += got
        else:
            results.append(sampler_row(case, sampler, tunix, cfg, rng, repeats, args.quick, rate, bw))
        print(f"  done {case}: " + "; ".join(f"{r['row']} ours {r['ours']:.2f}s Tunix {r['tunix']:.2f}s {r['check']}"
                                             for r in results[-(2 if case == 'update' else 1):]), flush=True)
    tunix.close()
    print("\n| row | batch | work | ours s | Tunix s | speed-up | floor s | ours % of floor | Tunix % of floor "
          "| check |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['row']} | {r['batch']} | {r['work']} | {r['ours']:.2f} | {r['tunix']:.2f} | "
              f"{r['tunix'] / r['ours']:.2f}x | {r['floor']:.2f} | {100 * r['floor'] / r['ours']:.0f}% | "
              f"{100 * r['floor'] / r['tunix']:.0f}% | {r['check']} |")
    for r in results:
        if "tokens_per_s" in r:
            print(f"\ntrained tokens/s: ours {r['tokens_per_s'][0]:.0f}, Tunix {r['tokens_per_s'][1]:.0f}")
    if loss_gap is not None:
        print(f"loss agreement on one micro-batch: |ours - Tunix| = {loss_gap:.2e}")


if __name__ == "__main__":
    main()
