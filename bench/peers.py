"""Ours vs Google Tunix (google-tunix 0.1.7), side by side on one checkpoint, and vs a floor.

    bench/peers_setup.sh                      # once: Tunix's own venv (it pins safetensors<0.8)
    python bench/peers.py [--quick] [--small] [--rows update,agent_update,plain1,plain8,agent,plain32]
                          [--results FILE.jsonl] [--update-rows 16 --micro 8] [--agent-rows 128]
                          [--layers N] [--repeats 2]
    python bench/peers.py --table FILE.jsonl   # the table of rows measured so far

One random-weight Qwen2.5-0.5B-shaped f32 checkpoint (HF format; --small: a smaller shape) is
written once and loaded by both sides. Tunix runs in subprocesses of its venv
(bench/peers_tunix.py). Each row is appended to the results file as soon as it is measured, so
a run cut short still leaves its finished rows; the table is printed from that file.

Rows:
- plainB: batch B, 256-token prompts, 128 new tokens, greedy, no stop. Checked first: both
  sides produce the same tokens (the share of identical rows is printed).
- agent: batch 32 (--quick: 8), one shared 500-token prefix + ragged 50-300-token suffixes,
  stop on an end-of-turn id, 128 new tokens. Random weights never end a turn on a fixed id,
  so the id is picked from a first, untimed greedy run without stops: the one whose first
  occurrences give the most distinct row lengths (ragged stops). Tunix's stop rule is
  `eos_tokens` (single ids, no sequences); it left-pads to `max_prompt_length`, given here as
  the longest prompt (its default, the next power of two, would cost it more).
  Sampler rows: both sides hold their model at once (ours here, Tunix in one worker); a row's
  repeats alternate ours, Tunix, ours, Tunix..., so load from other processes hits both alike.
- update: the GRPO update on R rows of 512 tokens (256 prompt + 64-256 completion,
  right-padded), loss mask on the completion, clip 0.2, dual clip 3, KL coef 0.001 (k3),
  AdamW lr 1e-6 after global-norm clipping 1.0, micro-batches of --micro rows, gradients of
  each micro-batch's token mean averaged (Tunix: optax.MultiSteps over its PeftTrainer step
  with rl.algo_core.grpo_loss_fn; ours: GRPOLearner, aggregation microbatch_token_mean). Two
  0.5B learners with AdamW do not fit in memory together, so each side's learner lives in its
  own subprocess, one at a time, alternating ours, Tunix, ours, Tunix (one round per repeat;
  each round: a warm-up step, then the timed one; JAX's persistent compilation cache, one
  directory per side, spares the later rounds the compile). The first round checks that both
  sides' losses agree on one micro-batch (same params, old/ref log-probs). Timed: one
  optimizer step (all micro-batches) and one log-prob pass over the rows (ours: the learner's
  compute_logprobs; Tunix: rl.common.compute_per_token_logps per micro-batch).
  Our learner alone holds five parameter-sized f32 arrays (params, reference, AdamW's two
  moments, the gradient sum: ~10 GB at 0.5B) before activations; where that does not fit,
  --layers N keeps the shape's widths and vocabulary with N layers (the rows say so).
- agent_update: the same update (and log-prob pass) on agent-shaped rows, --agent-rows
  conversations of 70-400 tokens shaped like the default job's (bench/peers_agent.py): ours
  packed (rl.pack_rows), Tunix padded as its GRPO learner pads (prompts left-padded to the longest
  context, completions right-padded to the longest response). A check round of ours comes first
  (old/ref log-probs, the step's loss through our packed micro-batches); Tunix's first round
  compares its step loss (the mean over its micro-batches) and times nothing unless the two
  agree within peers_agent.LOSS_TOL; then Tunix and ours alternate. Floors count real tokens only.
- whole GRPO step: not run; Tunix's loop could run on CPU (docs/benchmarks.md, "Against Tunix"), but it is
  rollout + reference log-probs + this update, each measured here, and it needs the actor,
  its AdamW state, the reference and the rollout model in memory at once.

Floors: decode/prefill as in bench/sampler.py; update = 3 x forward FLOPs / matmul rate +
AdamW traffic (7 parameter-sized arrays read or written) / copy bandwidth; log-probs =
forward FLOPs / matmul rate. FLOPs count the head on the completion columns only (the
logits the loss reads; both sides compute those alone), the layers on every position. The
matmul rate and bandwidth are measured again just before each row (the machine is shared and
its load moves), and each row's floor uses its own measurement.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_agent  # noqa: E402  (bench/peers_agent.py: the agent-shaped update rows)
from learner import forward_flops  # noqa: E402  (bench/learner.py: the learner floor's FLOP count, shared)
from sampler import floor_seconds, measure_machine, small_config  # noqa: E402  (bench/sampler.py)

from memsearcher_jax.models import ModelConfig, Qwen2, from_pretrained, save_pretrained  # noqa: E402
from memsearcher_jax.rl.batching import RowBatch  # noqa: E402
from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner, micro_batch_loss  # noqa: E402
from memsearcher_jax.rl.learner import OptimConfig  # noqa: E402
from memsearcher_jax.rl.losses import LossConfig  # noqa: E402
from memsearcher_jax.sampling import BucketConfig, Sampler  # noqa: E402

PAD = 0
DEFAULT_VENV = "~/.cache/memsearcher-jax/tunix-venv"
XLA_CACHE = "~/.cache/memsearcher-jax/bench-peers-xla"
PROMPT, COMPLETION, NEW = 256, 256, 128
CLIP, DUAL_CLIP, KL_COEF, LR = 0.2, 3.0, 0.001, 1e-6
LOSS = LossConfig(clip_low=CLIP, clip_high=CLIP, dual_clip=DUAL_CLIP, kl_coef=KL_COEF, kl_clamp=10.0,
                  log_ratio_clamp=20.0, entropy_coef=0.0, aggregation="microbatch_token_mean",
                  kl_estimator="low_var_kl")


def first_to_go_on_oom():
    """Called by each bench worker process (bench/peers_tunix.py has its own copy): if memory
    runs out, the kernel ends this process before any other job of a shared machine."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


class Tunix:
    """One Tunix worker subprocess (bench/peers_tunix.py in Tunix's venv)."""

    def __init__(self, venv: str):
        py = os.path.join(os.path.expanduser(venv), "bin", "python")
        if not os.path.exists(py):
            raise SystemExit(f"no Tunix venv at {venv}: run bench/peers_setup.sh first (or pass --tunix-venv)")
        here = os.path.dirname(os.path.abspath(__file__))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PEERS_XLA_CACHE"] = os.path.join(os.path.expanduser(XLA_CACHE), "tunix")
        self.proc = subprocess.Popen([py, os.path.join(here, "peers_tunix.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=tempfile.gettempdir())
        self.info = json.loads(self.proc.stdout.readline())

    def __call__(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"Tunix worker died on {req['op']} (exit {self.proc.wait()}; out of memory?)")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"Tunix worker failed on {req['op']}: {reply['error']}")
        return reply

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def tunix_config(cfg: ModelConfig) -> dict:
    return dict(num_layers=cfg.num_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.hidden_size,
                hidden_dim=cfg.intermediate_size, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                num_kv_heads=cfg.num_kv_heads, rope_theta=int(cfg.rope_theta), norm_eps=cfg.rms_norm_eps,
                use_tied_embedding=cfg.tie_word_embeddings)


def npz(path: str | None = None, **arrays) -> str:
    path = path or tempfile.mktemp(suffix=".npz")
    np.savez(path, **arrays)
    return path


# ----------------------------------------------------------------------------- sampler rows

def make_prompts(case: str, rng, vocab: int, quick: bool):
    if case.startswith("plain"):
        return [rng.randint(10, vocab, PROMPT).tolist() for _ in range(int(case[5:]))]
    system = rng.randint(10, vocab, 500).tolist()
    n = 8 if quick else 32
    return [system + rng.randint(10, vocab, int(rng.randint(50, 301))).tolist() for _ in range(n)]


def pick_stop(outputs: list[list[int]], budget: int) -> int:
    """The id whose first occurrences in these unstopped outputs give the most distinct row
    lengths (ties: the one that stops more rows): a stop rule that makes the rows ragged."""
    best, best_key = None, None
    for t in sorted({t for row in outputs for t in row}):
        lengths = [row.index(t) + 1 if t in row else budget for row in outputs]
        key = (len(set(lengths)), sum(t in row for row in outputs), -t)
        if best_key is None or key > best_key:
            best, best_key = t, key
    return best


def sampler_floor(case: str, cfg, prompts, outs, rate, bw) -> float:
    if case == "agent":
        distinct = 500 + sum(len(p) - 500 for p in prompts)
        ctx = (500 * 250 + sum((len(p) - 500) * (500 + (len(p) - 500) / 2) for p in prompts)) / distinct
    else:
        distinct, ctx = sum(map(len, prompts)), PROMPT / 2
    return floor_seconds(cfg, distinct, ctx, [(len(p), len(o.tokens)) for p, o in zip(prompts, outs)],
                         rate, bw, 4, 4)


def sampler_row(case, sampler, tunix, cfg, rng, repeats, quick, rate, bw):
    prompts = make_prompts(case, rng, cfg.vocab_size, quick)
    stops, note = (), ""
    if case == "agent":  # an untimed run without stops (it also compiles ours) picks the end-of-turn id
        probe = sampler.generate(prompts, max_new_tokens=NEW)
        stops = (pick_stop([o.tokens for o in probe], NEW),)
    grid = np.full((len(prompts), max(map(len, prompts))), -1, np.int64)
    for i, p in enumerate(prompts):
        grid[i, :len(p)] = p
    treq = dict(op="sample", prompts=npz(prompts=grid), new=NEW, eos=list(stops), max_prompt_length=grid.shape[1])
    ours_fn = lambda: sampler.generate(prompts, max_new_tokens=NEW, stop_token_ids=stops)
    outs = ours_fn()  # compiles
    theirs = np.load(tunix(**treq)["tokens"])["tokens"]  # compiles
    same = sum(o.tokens == [int(t) for t in row if t >= 0] for o, row in zip(outs, theirs))
    ours_t, tunix_t = [], []
    for _ in range(repeats):  # interleaved
        t0 = time.perf_counter()
        ours_fn()
        ours_t.append(time.perf_counter() - t0)
        tunix_t.append(tunix(**treq)["seconds"])
    lengths = [len(o.tokens) for o in outs]
    if stops:
        note = f"; stop id {stops[0]}, rows of {min(lengths)}-{max(lengths)} tokens"
    return dict(row=f"sampler {case}", batch=len(prompts), work=f"{sum(lengths)} tokens", ours=min(ours_t),
                tunix=min(tunix_t), floor=sampler_floor(case, cfg, prompts, outs, rate, bw),
                check=f"same tokens {same}/{len(prompts)} rows{note}", ours_all=ours_t, tunix_all=tunix_t)


# ----------------------------------------------------------------------------- update row

def make_rows(rng, vocab: int, n_rows: int) -> dict:
    """R rows of PROMPT + COMPLETION tokens: a full prompt, a 64..COMPLETION-token completion
    (the loss mask), right padding; one advantage per row."""
    s = PROMPT + COMPLETION
    tokens = np.full((n_rows, s), PAD, np.int32)
    attention = np.zeros((n_rows, s), np.int32)
    mask = np.zeros((n_rows, s), np.float32)
    for i in range(n_rows):
        n = int(rng.randint(64, COMPLETION + 1))
        tokens[i, :PROMPT + n] = rng.randint(10, vocab, PROMPT + n)
        attention[i, :PROMPT + n] = 1
        mask[i, PROMPT:PROMPT + n] = 1
    return dict(tokens=tokens, attention=attention, loss_mask=mask, advantages=rng.randn(n_rows).astype(np.float32))


def row_batch(d) -> RowBatch:
    n = d["tokens"].shape[0]
    ids = np.arange(n)
    return RowBatch(tokens=d["tokens"], attention=d["attention"], loss_mask=d["loss_mask"],
                    sampler_logp=np.zeros(d["loss_mask"].shape, np.float32), advantages=d["advantages"],
                    traj_ids=ids, group_ids=ids // 4, turns=np.zeros(n, np.int64), is_final=np.ones(n, bool))


def tunix_batch(rows: dict, old: np.ndarray, ref: np.ndarray) -> str:
    """Our [R, S] rows as Tunix's TrainExample fields: prompt [R, P], completion [R, C] (right-padded),
    log-probs of the completion tokens."""
    c = slice(PROMPT, PROMPT + COMPLETION)
    return npz(prompt_ids=rows["tokens"][:, :PROMPT], completion_ids=rows["tokens"][:, c],
               completion_mask=rows["loss_mask"][:, c], advantages=rows["advantages"], old_logps=old[:, c],
               ref_logps=ref[:, c])


def ours_update_worker(spec: dict) -> dict:
    """One round of our side in its own process: [first round: old/ref log-probs near the
    model's own (written for Tunix), the loss], a warm-up step, timed steps (repeats 0: none,
    the check alone). spec["kind"] "agent": agent-shaped rows (bench/peers_agent.py), the loss
    the whole step's through the packed micro-batches; else micro-batch 0's, unpacked."""
    import jax.experimental.compilation_cache.compilation_cache as cc
    jax.config.update("jax_compilation_cache_dir", os.path.join(os.path.expanduser(XLA_CACHE), "ours"))
    cc.reset_cache()
    micro, agent = spec["micro"], spec.get("kind") == "agent"
    learner = GRPOLearner(from_pretrained(spec["dir"], dtype="float32"),
                          GRPOConfig(optimizer_steps=1, micro_batch_size=micro, logprob_batch_size=micro,
                                     shuffle_rows=False, min_seq_len=64, loss=LOSS,
                                     logits_chunk=spec.get("logits_chunk", 0), optim=OptimConfig(learning_rate=LR)))
    d = dict(np.load(spec["rows"]))
    rows = row_batch(d)
    out = {}
    if spec["first"]:
        lp = learner.compute_logprobs(learner.params, rows)
        noise = np.random.RandomState(1)
        old, ref = ((lp + 0.3 * noise.randn(*lp.shape) * d["loss_mask"]).astype(np.float32) for _ in range(2))
        if agent:
            out["tunix_batch"] = npz(**peers_agent.tunix_agent_layout(d, old, ref))
            out["loss"] = peers_agent.packed_step_loss(learner, rows, old, ref)
        else:
            out["tunix_batch"] = tunix_batch(d, old, ref)
            out["loss"] = micro_batch0_loss(learner, d, old, ref, micro)
    out["update"], out["logps"] = [], []
    if spec["repeats"] == 0:
        return out
    learner.train_on_rows(rows, np.random.default_rng(0))  # warm-up (compiles, or loads the cached programs)
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        got = learner.train_on_rows(rows, np.random.default_rng(0))
        total = time.perf_counter() - t0
        out["update"].append(total - got["time_logprobs"])
        out["logps"].append(got["time_logprobs"] / 2)  # old and ref: two passes
        out["pad_frac"] = got["pad_frac_packed"] if learner.config.pack_rows else got["pad_frac_unpacked"]
    return out


def micro_batch0_loss(learner, d: dict, old, ref, micro: int) -> float:
    """The loss of the first `micro` rows, unpacked (the plain update row's check)."""
    m = d["loss_mask"][:micro]
    mb = {"tokens": d["tokens"][:micro], "attention": d["attention"][:micro], "loss_mask": m,
          "weights": m / m.sum(), "advantages": d["advantages"][:micro], "old_logp": old[:micro],
          "ref_logp": ref[:micro]}
    loss_fn = jax.jit(micro_batch_loss, static_argnums=(1, 3))
    return float(loss_fn(learner.params, learner.graphdef, jax.tree.map(jnp.asarray, mb), LOSS)[0])


def run_ours_round(spec: dict) -> dict:
    path = npz_spec = tempfile.mktemp(suffix=".json")
    with open(npz_spec, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--update-worker", path], env=env,
                          stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"our update worker failed (exit {done.returncode}; -9: out of memory)")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_tunix_round(venv: str, ckpt: str, cfg, batch: str, micro_batches: int, first: bool, repeats: int,
                    expect: float | None = None) -> dict:
    """One Tunix learner in its own worker: [first: the loss (micro-batch 0's; with `expect`, the
    whole step's, and no timing at all unless it is within peers_agent.LOSS_TOL of `expect`)], a
    warm-up step, timed steps, log-prob passes."""
    t = Tunix(venv)
    try:
        t(op="load", dir=ckpt, config=tunix_config(cfg))
        t(op="update_setup", lr=LR, clip=CLIP, kl_coef=KL_COEF, dual_clip=DUAL_CLIP, micro_batches=micro_batches)
        out = {"loss": t(op="loss", batch=batch, all=expect is not None)["loss"]} if first else {}
        if first and expect is not None and not abs(out["loss"] - expect) <= peers_agent.LOSS_TOL:
            raise RuntimeError(f"the losses differ: ours {expect:.6f}, Tunix {out['loss']:.6f} "
                               f"(tolerance {peers_agent.LOSS_TOL}); nothing timed")
        t(op="update", batch=batch)  # warm-up
        out["update"] = [t(op="update", batch=batch)["seconds"] for _ in range(repeats)]
        t(op="logps", batch=batch)
        out["logps"] = [t(op="logps", batch=batch)["seconds"] for _ in range(repeats)]
    finally:
        t.close()
    return out


def update_rows(args, ckpt, cfg, rng, measure):
    """Rounds of ours then Tunix, each side's learner alone in memory; rows, floors, loss gap."""
    n_rows, micro = args.update_rows, args.micro
    if n_rows % micro:
        raise SystemExit(f"--update-rows {n_rows} is not a multiple of --micro {micro}")
    rows = make_rows(rng, cfg.vocab_size, n_rows)
    rows_path = npz(**rows)
    ours, theirs, batch, losses = {"update": [], "logps": []}, {"update": [], "logps": []}, None, {}
    rates = []
    for r in range(args.repeats):
        rates.append(measure())
        got = run_ours_round(dict(dir=ckpt, rows=rows_path, micro=micro, first=r == 0, repeats=1,
                                  logits_chunk=args.logits_chunk))
        batch = got.get("tunix_batch", batch)
        losses.setdefault("ours", got.get("loss"))
        got_t = run_tunix_round(args.tunix_venv, ckpt, cfg, batch, n_rows // micro, r == 0, 1)
        losses.setdefault("tunix", got_t.get("loss"))
        add_round(ours, theirs, got, got_t)
        print(f"  update round {r + 1}: ours step {got['update']} logps {got['logps']}; Tunix step "
              f"{got_t['update']} logps {got_t['logps']}", flush=True)
    rate, bw = max(x[0] for x in rates), max(x[1] for x in rates)
    fwd = forward_flops(cfg, n_rows, PROMPT + COMPLETION, COMPLETION)
    trained = int(rows["loss_mask"].sum())
    gap = abs(losses["ours"] - losses["tunix"])
    common = dict(batch=f"{n_rows} rows x {PROMPT + COMPLETION}", rate=rate, bw=bw)
    chunk = f"; ours logits_chunk {args.logits_chunk}" if args.logits_chunk else ""
    return [dict(row=f"GRPO update, 1 optimizer step ({n_rows // micro} micro-batches of {micro}{chunk})",
                 work=f"{trained} trained tokens", ours=min(ours["update"]), tunix=min(theirs["update"]),
                 floor=3 * fwd / rate + 7 * 4 * cfg.num_params() / bw,
                 check=f"loss ours {losses['ours']:.6f} Tunix {losses['tunix']:.6f} (gap {gap:.1e})",
                 tokens_per_s=[trained / min(ours["update"]), trained / min(theirs["update"])],
                 ours_all=ours["update"], tunix_all=theirs["update"], **common),
            dict(row=f"log-prob pass ({n_rows // micro} micro-batches of {micro})",
                 work=f"{n_rows * (PROMPT + COMPLETION)} tokens", ours=min(ours["logps"]),
                 tunix=min(theirs["logps"]), floor=fwd / rate, check="", ours_all=ours["logps"],
                 tunix_all=theirs["logps"], **common)]


def add_round(ours: dict, theirs: dict, got: dict, got_t: dict) -> None:
    """One round's timings (lists per phase) appended to both sides' lists."""
    for k in ours:
        ours[k] += got[k]
        theirs[k] += got_t[k]


def agent_update_rows(args, ckpt, cfg, measure):
    """The update on agent-shaped rows (bench/peers_agent.py): our check round first (old/ref
    log-probs for both, the step's loss through the packed micro-batches), then rounds of Tunix
    (its loss checked against ours before it times anything) and ours, alternating."""
    n_rows, micro = args.agent_rows, args.micro
    if n_rows % micro:
        raise SystemExit(f"--agent-rows {n_rows} is not a multiple of --micro {micro}")
    rows = peers_agent.make_agent_rows(cfg.vocab_size, n_rows)
    spec = dict(dir=ckpt, rows=npz(**rows), micro=micro, kind="agent", logits_chunk=args.logits_chunk)
    check = run_ours_round(dict(spec, first=True, repeats=0))
    ours, theirs, loss_t, rates = {"update": [], "logps": []}, {"update": [], "logps": []}, None, []
    for r in range(args.repeats):
        rates.append(measure())
        got_t = run_tunix_round(args.tunix_venv, ckpt, cfg, check["tunix_batch"], n_rows // micro, r == 0, 1,
                                expect=check["loss"])
        loss_t = got_t.get("loss", loss_t)
        got = run_ours_round(dict(spec, first=False, repeats=1))
        add_round(ours, theirs, got, got_t)
        print(f"  agent update round {r + 1}: Tunix step {got_t['update']} logps {got_t['logps']}; ours step "
              f"{got['update']} logps {got['logps']}", flush=True)
    rate, bw = max(x[0] for x in rates), max(x[1] for x in rates)
    fwd = peers_agent.agent_flops(cfg, rows)
    trained = int(rows["loss_mask"].sum())
    real = int(rows["attention"].sum())
    t_slots = n_rows * (int(rows["context"].max()) + int((rows["attention"].sum(axis=1) - rows["context"]).max()))
    pads = f"padding ours {100 * got['pad_frac']:.0f}% (packed), Tunix {100 * (1 - real / t_slots):.0f}%"
    common = dict(batch=peers_agent.describe(rows), rate=rate, bw=bw)
    name = f"agent-shaped rows (micro-batches: ours {micro} packed rows, Tunix {micro} conversations)"
    return [dict(row=f"GRPO update, 1 optimizer step, {name}", work=f"{trained} trained tokens",
                 ours=min(ours["update"]), tunix=min(theirs["update"]),
                 floor=3 * fwd / rate + 7 * 4 * cfg.num_params() / bw,
                 check=f"step loss ours {check['loss']:.6f} Tunix {loss_t:.6f} (gap "
                       f"{abs(check['loss'] - loss_t):.1e}, tol {peers_agent.LOSS_TOL:.0e}); {pads}",
                 tokens_per_s=[trained / min(ours["update"]), trained / min(theirs["update"])],
                 ours_all=ours["update"], tunix_all=theirs["update"], **common),
            dict(row=f"log-prob pass, {name}", work=f"{real} real tokens", ours=min(ours["logps"]),
                 tunix=min(theirs["logps"]), floor=fwd / rate, check=pads, ours_all=ours["logps"],
                 tunix_all=theirs["logps"], **common)]


# ----------------------------------------------------------------------------- table and main

def table(results: list[dict]) -> str:
    lines = ["| row | batch | work | ours s | Tunix s | speed-up | floor s | ours % of floor | Tunix % of floor "
             "| check |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['row']} | {r['batch']} | {r['work']} | {r['ours']:.2f} | {r['tunix']:.2f} | "
                     f"{r['tunix'] / r['ours']:.2f}x | {r['floor']:.2f} | {100 * r['floor'] / r['ours']:.0f}% | "
                     f"{100 * r['floor'] / r['tunix']:.0f}% | {r['check']} |")
    for r in results:
        if "tokens_per_s" in r:
            lines.append(f"\nTrained tokens/s: ours {r['tokens_per_s'][0]:.1f}, Tunix {r['tokens_per_s'][1]:.1f}.")
    lines.append("\nThe machine, measured before each row in the table's order (matmul GFLOP/s / copy GB/s; "
                 "each row's floor uses its own): " + ", ".join(f"{r['rate'] / 1e9:.1f}/{r['bw'] / 1e9:.1f}"
                                                               for r in results))
    return "\n".join(lines)


def run_row(case, args, ckpt, cfg, rng, measure, state) -> list[dict]:
    if case == "update":
        return update_rows(args, ckpt, cfg, rng, measure)
    if case == "agent_update":
        return agent_update_rows(args, ckpt, cfg, measure)
    if "sampler" not in state:  # loaded after the update rows, so no learner shares memory with them
        state["sampler"] = Sampler(from_pretrained(ckpt, dtype="float32"), cache_dtype=jnp.float32,
                                   buckets=BucketConfig(min_shared_prefix=64))
        state["tunix"] = Tunix(args.tunix_venv)
        state["tunix"](op="load", dir=ckpt, config=tunix_config(cfg))
    rate, bw = measure()
    return [dict(sampler_row(case, state["sampler"], state["tunix"], cfg, rng, args.repeats, args.quick, rate, bw),
                 rate=rate, bw=bw)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rows and repeats (a shared machine)")
    ap.add_argument("--small", action="store_true", help="a smaller model shape than Qwen2.5-0.5B")
    ap.add_argument("--rows", default="", help="comma list of update,agent_update,plain1,plain8,agent,plain32 (in "
                                               "that order by default)")
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats per side (update: rounds)")
    ap.add_argument("--update-rows", type=int, default=0, help="rows (B x G) of the update (default 16; quick 8)")
    ap.add_argument("--micro", type=int, default=0, help="rows per micro-batch, both sides (default 8; "
                                                          "agent_update: ours packed rows, Tunix conversations)")
    ap.add_argument("--agent-rows", type=int, default=0, help=f"conversations of agent_update (default "
                                                              f"{peers_agent.ROWS}; quick {peers_agent.ROWS_QUICK})")
    ap.add_argument("--logits-chunk", type=int, default=0,
                    help="our rl.logits_chunk in the update (0: the [rows, seq, vocab] logits whole, as Tunix "
                         "holds them; > 0 recomputes the head per chunk: less memory, FLOPs the floor does not count)")
    ap.add_argument("--layers", type=int, default=0, help="keep the shape's widths and vocabulary, this many layers "
                                                         "(a 0.5B learner with AdamW may not fit a shared machine)")
    ap.add_argument("--results", default="", help="append each measured row to this JSONL file")
    ap.add_argument("--table", default="", help="print the table of a results file and exit")
    ap.add_argument("--tunix-venv", default=DEFAULT_VENV)
    ap.add_argument("--update-worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.update_worker:
        first_to_go_on_oom()
        with open(args.update_worker) as f:
            print(json.dumps(ours_update_worker(json.load(f))), flush=True)
        return
    if args.table:
        with open(args.table) as f:
            print(table([json.loads(line) for line in f if line.strip()]))
        return
    rows = [r for r in (args.rows or ("update,agent_update,plain1,plain8" if args.quick
                                      else "update,agent_update,plain1,plain8,agent,plain32"))
            .split(",") if r]
    bad = [r for r in rows if r not in ("update", "agent_update", "agent") and not
           (r.startswith("plain") and r[5:].isdigit())]
    if bad:
        raise SystemExit(f"unknown --rows {bad}: use update, agent_update, agent, plainB (B a batch size)")
    args.update_rows = args.update_rows or (8 if args.quick else 16)
    args.micro = args.micro or 8
    args.agent_rows = args.agent_rows or (peers_agent.ROWS_QUICK if args.quick else peers_agent.ROWS)
    results_path = args.results or tempfile.mktemp(prefix="bench_peers_", suffix=".jsonl")
    cfg = (small_config() if args.small else ModelConfig.qwen2_5_0_5b()).replace(dtype="float32",
                                                                                  param_dtype="float32")
    if args.layers:
        cfg = cfg.replace(num_layers=args.layers)
    ckpt = tempfile.mkdtemp(prefix="bench_peers_")
    save_pretrained(Qwen2(cfg, rngs=nnx.Rngs(0)), ckpt)
    gc.collect()
    print(f"model: {'small' if args.small else 'Qwen2.5-0.5B'}-shaped ({cfg.num_layers} layers), "
          f"{cfg.num_params() / 1e6:.0f}M params, random weights, float32, {ckpt}; "
          f"ours jax {jax.__version__}; XLA CPU, {os.cpu_count()} cores shared "
          f"with other jobs; results -> {results_path}", flush=True)

    def measure():
        rate, bw = measure_machine("float32")
        print(f"machine: matmul {rate / 1e9:.1f} GFLOP/s, copy bandwidth {bw / 1e9:.1f} GB/s", flush=True)
        return rate, bw

    rng = np.random.RandomState(0)
    state = {}
    try:
        for case in rows:
            try:
                got = run_row(case, args, ckpt, cfg, rng, measure, state)
                if args.layers:  # a cut of the named shape: say so in the row
                    got = [dict(r, row=f"{r['row']} [{cfg.num_layers}-layer cut]") for r in got]
            except (RuntimeError, MemoryError) as e:  # the other rows still run; the log says what failed
                print(f"  row {case} FAILED: {e}", flush=True)
                continue
            with open(results_path, "a") as f:
                for r in got:
                    f.write(json.dumps(r) + "\n")
            for r in got:
                print(f"  done {r['row']}: ours {r['ours_all']} Tunix {r['tunix_all']}; {r['check']}", flush=True)
    finally:  # whatever ended the rows: no Tunix worker left running, no 2 GB checkpoint left in /tmp
        if "tunix" in state:
            state["tunix"].close()
        shutil.rmtree(ckpt, ignore_errors=True)
    with open(results_path) as f:
        print("\n" + table([json.loads(line) for line in f if line.strip()]))


if __name__ == "__main__":
    main()
