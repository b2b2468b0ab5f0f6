"""A full GRPO training step (rollout + retrieval + reward + update): sharded == single device,
and a run killed with SIGKILL between checkpoints resumes to exactly the uninterrupted result."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from memsearcher_jax.models import param_dict
from memsearcher_jax.runtime import compile_stats
from memsearcher_jax.settings import load_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A tiny random model (not the shipped base), so each test trains its own in seconds.
SMALL = [
    ("model.source", "init"), ("sft.steps", "0"), ("train.eval_questions", "0"), ("model.hidden_size", "64"),
    ("model.intermediate_size", "128"), ("model.num_layers", "2"), ("model.num_heads", "4"),
    ("model.num_kv_heads", "2"), ("model.head_dim", "16"), ("rl.batch_questions", "4"), ("rl.group_size", "2"),
    ("rl.micro_batch_size", "4"), ("rl.logprob_batch_size", "8"), ("agent.max_new_tokens", "24"),
    ("agent.max_turns", "2"), ("optim.learning_rate", "1e-3"),
]


def _config(tmp_path, name, extra=()):
    overrides = SMALL + [("world.cache_dir", str(tmp_path / "worlds")),
                         ("train.output_dir", str(tmp_path / name))] + list(extra)
    return load_settings(os.path.join(ROOT, "configs/default.py"), overrides)


@pytest.mark.slow
def test_sharded_train_step_equals_single_device(tmp_path):
    from memsearcher_jax.app.experiment import build_setup, build_trainer

    single_cfg = _config(tmp_path, "single")
    setup = build_setup(single_cfg)
    single = build_trainer(single_cfg, setup, progress=False)
    before = {k: np.asarray(v) for k, v in param_dict(single.learner.model()).items()}
    m1 = single.train_step()
    p1 = {k: np.asarray(v) for k, v in param_dict(single.learner.model()).items()}

    sharded_cfg = _config(tmp_path, "sharded", [("mesh.data", "2"), ("mesh.fsdp", "2"), ("mesh.tp", "2")])
    sharded = build_trainer(sharded_cfg, setup, progress=False)
    q = param_dict(sharded.learner.model())["layers.q_kernel"]
    assert len(q.sharding.device_set) == 8 and q.sharding.spec[1] == "fsdp"  # the training layout
    m2 = sharded.train_step()
    p2 = {k: np.asarray(jax.device_get(v)) for k, v in param_dict(sharded.learner.model()).items()}
    # The same rollout happened (same rows, same generated tokens), and the update moved the weights.
    assert m1["rows"] == m2["rows"] and m1["trained_tokens"] == m2["trained_tokens"]
    assert any(not np.array_equal(before[k], p1[k]) for k in p1)
    worst = max(float(np.abs(p1[k] - p2[k]).max()) for k in p1)
    assert worst < 1e-5, worst
    # The learner kept its FSDP layout after the sampler got its TP-only copy.
    q = param_dict(sharded.learner.model())["layers.q_kernel"]
    assert q.sharding.spec[1] == "fsdp"


def _train_cmd(cfg_dir, out, steps, worlds):
    args = [sys.executable, "-m", "memsearcher_jax.cli", "train", "--config", os.path.join(ROOT, "configs/default.py")]
    for k, v in SMALL + [("world.cache_dir", worlds), ("train.output_dir", out), ("train.steps", str(steps)),
                         ("train.save_every", "2"), ("train.keep", "5")]:
        args.append(f"--config.{k}={v}")
    return args


# What every training step must log (the trainer issue's list), in metrics.jsonl and TensorBoard.
STEP_METRICS = (
    "reward_mean", "reward_std", "em", "f1", "format_error_rate", "zero_variance_groups", "turns_per_trajectory",
    "searches_per_trajectory", "memory_tokens_mean", "context_tokens_mean", "context_tokens_max",
    "response_tokens_mean", "clip_fraction", "approx_kl", "entropy", "grad_norm", "skipped_steps_total",
    "logprob_gap_max", "time_rollout", "time_retrieval", "time_logprobs", "time_update", "tokens_per_second")


def _check_logged_metrics(out: str, steps: int):
    import json

    with open(os.path.join(out, "logs", "metrics.jsonl"), encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    assert [m["step"] for m in lines] == list(range(1, steps + 1))
    for m in lines:
        missing = [k for k in STEP_METRICS if k not in m]
        assert not missing, missing
        assert 0.0 <= m["reward_mean"] <= 1.0 and m["time_rollout"] > 0 and m["tokens_per_second"] > 0
    # The sampler and the trainer score the same ids with the same weights before the update.
    assert lines[0]["logprob_gap_max"] < 1e-3, lines[0]["logprob_gap_max"]
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(os.path.join(out, "logs")))


def _logged_steps(metrics_path: str) -> int:
    if not os.path.exists(metrics_path):
        return 0
    with open(metrics_path, encoding="utf-8") as f:
        return sum(1 for line in f if line.endswith("\n"))


def _final_params(out):
    from memsearcher_jax.app.jobs import restore_policy

    model, meta = restore_policy(out)
    return meta["step"], {k: np.asarray(v) for k, v in param_dict(model).items()}


def sigkill_then_resume(train_cmd, tmp_path, steps=4) -> tuple[dict, dict]:
    """Run `train_cmd(out, steps, worlds)` to the end once; run it again, kill it with SIGKILL
    between checkpoints and resume it. Returns the final params of both runs (same step)."""
    # One compilation cache for the three runs (the test session's, else one of its own): the
    # killed and the resumed runs load the programs the first one compiled (the shapes follow the
    # seeded rollout) and compile only their own.
    cache = os.environ.get(compile_stats.CACHE_DIR_ENV) or str(tmp_path / "xla-cache")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", PYTHONPATH=ROOT,
               **{compile_stats.CACHE_DIR_ENV: cache})
    worlds = str(tmp_path / "worlds")
    ref_out, killed_out = str(tmp_path / "ref"), str(tmp_path / "killed")
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(train_cmd(ref_out, steps, worlds), env=env, check=True, timeout=900, **quiet)
    _check_logged_metrics(ref_out, steps=steps)

    proc = subprocess.Popen(train_cmd(killed_out, steps, worlds), env=env, **quiet)
    # Kill once step 3 is logged AND the step-2 checkpoint is finalized. The asynchronous save
    # can finish after step 3 is logged, so the metrics alone are not enough; and Orbax begins
    # the step-4 save only after the step-2 one is finalized, so polling every 10 ms kills the
    # run before "4" can exist.
    metrics = os.path.join(killed_out, "logs", "metrics.jsonl")
    ckpts = os.path.join(killed_out, "checkpoints")
    deadline = time.time() + 600
    while not (_logged_steps(metrics) >= 3 and os.path.isdir(os.path.join(ckpts, "2"))) \
            and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished (or died) before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert os.path.isdir(os.path.join(ckpts, "2")) and not os.path.isdir(os.path.join(ckpts, "4")), os.listdir(ckpts)

    subprocess.run(train_cmd(killed_out, steps, worlds), env=env, check=True, timeout=900, **quiet)
    _check_logged_metrics(killed_out, steps=steps)  # the last step logged once, by the resumed run
    step_a, ref = _final_params(ref_out)
    step_b, resumed = _final_params(killed_out)
    assert step_a == step_b == steps
    return ref, resumed


@pytest.mark.slow
def test_sigkill_between_checkpoints_then_resume_matches_uninterrupted(tmp_path):
    ref, resumed = sigkill_then_resume(lambda out, steps, worlds: _train_cmd(ROOT, out, steps, worlds), tmp_path)
    for k in ref:
        np.testing.assert_array_equal(ref[k], resumed[k], err_msg=k)


# ----------------------------------------------------------------------------- zero_std: a step with nothing to learn

class _RecordingSampler:
    """Counts the weight copies the Trainer hands the sampler."""

    def __init__(self):
        self.updates = 0

    def update_params(self, model):
        self.updates += 1


class _FixedRewardRunner:
    """The Trainer's view of a turn loop: one short conversation per trajectory over a 64-token
    vocabulary, its gold answer the trajectory's reward (so a test picks which groups tie)."""

    def __init__(self, reward_of):
        from memsearcher_jax.agent.rollout import RolloutStats

        self.sampler, self.stats, self.reward_of = _RecordingSampler(), RolloutStats(), reward_of

    def run(self, questions, group_size=1, seed=0, first_group_id=0, first_traj_id=0):
        from memsearcher_jax.agent.rollout import Conversation, Trajectory

        rng = np.random.default_rng(seed)
        trajs = []
        for qi, q in enumerate(questions):
            for g in range(group_size):
                tid, gid = first_traj_id + len(trajs), first_group_id + qi
                t = Trajectory(traj_id=tid, group_id=gid, question=q["question"], golds=[str(self.reward_of(g))])
                conv = Conversation(prompt_ids=rng.integers(1, 64, 6).tolist(), traj_id=tid, group_id=gid)
                conv.add_generated(rng.integers(1, 64, 5).tolist(), [-1.0] * 5)
                t.conversations.append(conv)
                t.finish("answer")
                trajs.append(t)
        return trajs


def _gold_is_reward(blocks, ended_with_eos, golds):
    from memsearcher_jax.qa_metrics import RewardResult

    return RewardResult(reward=float(golds[0]), em=0.0, f1=0.0, format_ok=True, answer=None)


def _zero_std_trainer(tmp_path, reward_of):
    from flax import nnx

    from memsearcher_jax.models import ModelConfig, Qwen2
    from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner, OptimConfig
    from memsearcher_jax.rl.trainer import LoopConfig, Trainer

    learner = GRPOLearner(Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(0)),
                          GRPOConfig(optimizer_steps=1, micro_batch_size=4, logprob_batch_size=4, min_seq_len=16,
                                     optim=OptimConfig(learning_rate=1e-3)))
    loop = LoopConfig(steps=1, batch_questions=2, group_size=2, seed=0, output_dir=str(tmp_path),
                      filter_groups="zero_std", max_refill=1)
    questions = [{"question": f"q{i}", "golden_answers": ["x"]} for i in range(4)]
    return Trainer(learner, _FixedRewardRunner(reward_of), questions, pad_id=0, loop=loop, progress=False,
                   reward_fn=_gold_is_reward)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_zero_std_step_where_every_group_ties_leaves_the_weights_alone(tmp_path):
    trainer = _zero_std_trainer(tmp_path, reward_of=lambda g: 1.0)  # every group (and every refill) ties
    params, opt_state = _leaves(trainer.learner.params), _leaves(trainer.learner.opt_state)
    m = trainer.train_step()
    # Nothing to learn: no optimizer step (params and AdamW state bit-identical), no weight copy
    # to the sampler, and the step is counted as skipped with its reason.
    assert all(np.array_equal(a, b) for a, b in zip(params, _leaves(trainer.learner.params)))
    assert all(np.array_equal(a, b) for a, b in zip(opt_state, _leaves(trainer.learner.opt_state)))
    assert trainer.sampler.updates == 0
    assert m["skipped_update"] == 1 and m["skipped_update_reason"] == "every group's rewards tie"
    assert m["filtered_groups"] == 2 and m["refill_rounds"] == 1 and trainer.step == 1


def test_zero_std_step_with_a_spread_group_updates(tmp_path):
    trainer = _zero_std_trainer(tmp_path, reward_of=lambda g: float(g))  # rewards 0, 1 in every group
    params = _leaves(trainer.learner.params)
    m = trainer.train_step()
    assert not all(np.array_equal(a, b) for a, b in zip(params, _leaves(trainer.learner.params)))
    assert trainer.sampler.updates == 1 and m["skipped_update"] == 0 and m["filtered_groups"] == 0
