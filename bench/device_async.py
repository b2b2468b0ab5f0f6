"""The prepared device check of rollouts ahead of the learner (issue 85), for when an accelerator is lent.

    python bench/device_async.py --out device_async.md            # on the accelerator: < 8 minutes
    python bench/device_async.py --tiny --out /tmp/check.md       # anywhere: a tiny model, seconds

One process, two parts, on a random-init Qwen2.5-0.5B-shaped model (`ModelConfig.qwen2_5_0_5b`,
bf16 compute, f32 params; --tiny: a 1-layer model over 64 tokens):
1. the sampler: one batch of --batch prompts of --prompt tokens, --new-tokens sampled each, timed
   after a first call that compiles (generated tokens per second);
2. GRPO steps (rl/trainer.py's Trainer, the real learner and sampler; the turn loop replaced by one
   generation per trajectory, its reward the parity of its first token, so no retriever or tokenizer
   is needed) at rl.max_staleness K = 0 and K = 1, --steps each, the first --warmup not timed:
   the mean step time, the rollout's and the learner's time and the learner's wait.
It writes one markdown table naming the device (jax.devices()[0].device_kind) to --out and prints it.
One device: the sampler and the learner share it (K = 1 then overlaps the two on one chip).
"""
from __future__ import annotations

import argparse
import tempfile
import time

import jax
import numpy as np
from flax import nnx

from memsearcher_jax.agent.rollout import Conversation, RolloutStats, Trajectory
from memsearcher_jax.models import ModelConfig, Qwen2
from memsearcher_jax.qa_metrics import RewardResult
from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner
from memsearcher_jax.rl.learner import OptimConfig
from memsearcher_jax.rl.sampler_weights import sampling_model
from memsearcher_jax.rl.trainer import LoopConfig, Trainer
from memsearcher_jax.rules import run_dir
from memsearcher_jax.sampling import Sampler


def model_config(tiny: bool) -> ModelConfig:
    if tiny:
        return ModelConfig.tiny(num_layers=1, vocab_size=64, dtype="float32")
    return ModelConfig.qwen2_5_0_5b(dtype="bfloat16", param_dtype="float32")


class TokenRunner:
    """The trainer's turn loop reduced to one generation per trajectory: a random prompt drawn
    from its id, `new_tokens` sampled at temperature 1 (seeded by the step and the id)."""

    def __init__(self, sampler: Sampler, prompt: int, new_tokens: int, vocab: int):
        self.sampler, self.prompt, self.new_tokens, self.vocab = sampler, prompt, new_tokens, vocab
        self.stats = RolloutStats()

    def run(self, questions, group_size=1, seed=0, first_group_id=0, first_traj_id=0):
        ids = [(first_traj_id + i * group_size + g, first_group_id + i, q)
               for i, q in enumerate(questions) for g in range(group_size)]
        prompts = [np.random.default_rng([tid, 7]).integers(2, self.vocab, self.prompt).tolist() for tid, _, _ in ids]
        t0 = time.perf_counter()
        outs = self.sampler.generate(prompts, max_new_tokens=self.new_tokens, temperature=1.0, seed=seed,
                                     row_seeds=[tid for tid, _, _ in ids])
        self.generated(seed, first_group_id)
        self.stats.sampler_seconds += time.perf_counter() - t0
        trajs = []
        for prompt, out, (tid, gid, q) in zip(prompts, outs, ids):
            t = Trajectory(traj_id=tid, group_id=gid, question=q["question"], golds=[str(out.tokens[0] % 2)])
            conv = Conversation(prompt_ids=prompt, traj_id=tid, group_id=gid)
            conv.add_generated(out.tokens, out.logprobs)
            self.stats.generated_tokens += len(out.tokens)
            t.conversations.append(conv)
            t.finish("answer")
            trajs.append(t)
        return trajs

    def generated(self, seed: int, first_group_id: int) -> None:
        """Called between a rollout's generation and its trajectories (tests/test_async_rollout.py
        slows a step there and records the weights it sampled with); nothing here."""


def parity_reward(blocks, ended_with_eos, golds):
    return RewardResult(reward=float(golds[0]), em=float(golds[0]), f1=0.0, format_ok=True, answer=None)


def sampler_bench(config: ModelConfig, args) -> dict:
    """Generated tokens per second of one batch, the compiling call apart."""
    sampler = Sampler(Qwen2(config, rngs=nnx.Rngs(0)), cache_dtype=config.dtype)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, config.vocab_size, args.prompt).tolist() for _ in range(args.batch)]
    t0 = time.perf_counter()
    sampler.generate(prompts, max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    outs = sampler.generate(prompts, max_new_tokens=args.new_tokens, temperature=1.0, seed=1)
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.tokens) for o in outs)
    return {"first_call_s": first, "seconds": seconds, "tokens_per_s": tokens / seconds}


def grpo_steps(config: ModelConfig, k: int, args, out_dir: str) -> dict:
    """Mean times of the timed GRPO steps at rl.max_staleness = k."""
    learner = GRPOLearner(Qwen2(config, rngs=nnx.Rngs(0)),
                          GRPOConfig(optimizer_steps=1, micro_batch_size=args.micro_batch, logprob_batch_size=16,
                                     min_seq_len=64, old_logprobs="sampler", optim=OptimConfig(learning_rate=1e-5)))
    sampler = Sampler(sampling_model(learner, None, None, config.dtype), cache_dtype=config.dtype)
    loop = LoopConfig(steps=args.steps, batch_questions=args.questions, group_size=args.group, seed=0,
                      output_dir=out_dir, max_staleness=k)
    questions = [{"question": f"q{i}", "golden_answers": ["x"]} for i in range(64)]
    trainer = Trainer(learner, TokenRunner(sampler, args.prompt, args.new_tokens, config.vocab_size), questions,
                      pad_id=0, loop=loop, progress=False, reward_fn=parity_reward)
    trainer.end_step = args.steps
    walls, metrics = [], []
    try:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            metrics.append(trainer.train_step())
            walls.append(time.perf_counter() - t0)
    finally:
        trainer.close()
    timed = slice(args.warmup, None)
    mean = lambda key: float(np.mean([m.get(key, 0.0) for m in metrics[timed]]))
    return {"K": k, "step_s": float(np.mean(walls[timed])), "rollout_s": mean("time_rollout"),
            "learner_s": mean("time_logprobs") + mean("time_update"), "learner_idle_s": mean("time_learner_idle"),
            "staleness_max": max(m.get("staleness_max", 0) for m in metrics), "first_step_s": walls[0]}


def table(device: str, config: ModelConfig, samp: dict, steps: list[dict], args) -> str:
    lines = [f"device: {device} ({jax.device_count()} device(s), {jax.default_backend()}); model "
             f"{'tiny' if args.tiny else 'Qwen2.5-0.5B-shaped'} ({config.num_params() / 1e6:.0f}M params, "
             f"{config.dtype} compute), random init", "",
             f"sampler: batch {args.batch} x {args.prompt}-token prompts, {args.new_tokens} new tokens: "
             f"{samp['tokens_per_s']:.0f} tokens/s ({samp['seconds']:.2f} s; first call {samp['first_call_s']:.1f} s)",
             "", f"GRPO: {args.questions} questions x {args.group} samples a step, {args.steps} steps, the first "
             f"{args.warmup} not timed", "",
             "| K | step s | rollout s | learner s | learner idle s | max staleness | first step s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in steps:
        lines.append(f"| {r['K']} | {r['step_s']:.2f} | {r['rollout_s']:.2f} | {r['learner_s']:.2f} | "
                     f"{r['learner_idle_s']:.2f} | {r['staleness_max']} | {r['first_step_s']:.1f} |")
    sync, ahead = steps[0], steps[-1]
    shorter = min(sync["rollout_s"], sync["learner_s"])
    hidden = (sync["step_s"] - ahead["step_s"]) / shorter if shorter > 0 else float("nan")
    lines += ["", f"(t(K=0) - t(K=1)) / min(rollout, learner at K=0) = {hidden:.2f} (the issue's target: >= 0.5)"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny model and batch: the script's own check, on CPU")
    ap.add_argument("--out", default="", help="write the table here too (markdown)")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps per K (default 6; --tiny 3)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps not timed (compiles; K=1's first stale step)")
    args = ap.parse_args(argv)
    tiny = args.tiny
    args.batch, args.prompt, args.new_tokens = (4, 16, 8) if tiny else (32, 256, 128)
    args.questions, args.group, args.micro_batch = (2, 2, 4) if tiny else (8, 4, 8)
    args.steps = args.steps or (2 if tiny else 6)
    args.warmup = min(args.warmup, args.steps - 1)
    config = model_config(tiny)
    device = jax.devices()[0].device_kind
    samp = sampler_bench(config, args)
    with tempfile.TemporaryDirectory() as tmp:
        steps = [grpo_steps(config, k, args, f"{tmp}/k{k}") for k in (0, 1)]
    text = table(device, config, samp, steps, args)
    print(text, end="")
    if args.out:
        run_dir.write_text(args.out, text)  # a link at --out is replaced, never written through
    return text


if __name__ == "__main__":
    main()
