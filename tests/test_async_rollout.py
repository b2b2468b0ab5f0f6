"""Rollouts ahead of the learner (rl.max_staleness, rl/async_rollout.py): K = 0 through the
pipeline trains what the inline step trains, bit for bit; at K >= 1 each step's rollout samples
with exactly the weights K steps back, a slow episode makes the learner wait (never trains a
rollout staler than K, never drops one); LoRA, zero_std, compile-once, resume and a sampler on
devices of its own keep working."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from tests.bench_loader import load_bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, G = 2, 2  # questions per step, samples per question


_BENCH = load_bench("device_async")
parity_reward = _BENCH.parity_reward  # golds[0] is the parity of the first sampled token


class SamplingRunner(_BENCH.TokenRunner):
    """The Trainer's view of a turn loop on a real Sampler (bench/device_async.py's TokenRunner): each
    trajectory one conversation, a 6-token prompt drawn from its id and 5 tokens sampled (seeded by
    the step and its id), its gold the parity of its first token (`parity_reward`: groups mostly with
    a spread). delays: seconds the rollout of a step sleeps, by step (the adversarial slow episode).
    `seen`: per rollout call, (its seed, the step's first group id, the sampler's head table it
    sampled with)."""

    def __init__(self, sampler, delays: dict | None = None):
        super().__init__(sampler, prompt=6, new_tokens=5, vocab=64)
        self.delays, self.seen = dict(delays or {}), []

    def generated(self, seed: int, first_group_id: int) -> None:
        time.sleep(self.delays.get(first_group_id // B, 0.0))
        self.seen.append((seed, first_group_id, np.asarray(self.sampler._params["head"]).copy()))


def tiny_trainer(tmp_path, k: int, name: str = "run", lora: bool = False, delays=None, mesh=None, sampler_mesh=None,
                 **loop_kw):
    """A Trainer of a 1-layer model over a 64-token vocabulary, sampler in float32 (its log-probs
    are the learner's), old log-probs from the sampler, rl.max_staleness = k."""
    from flax import nnx

    from memsearcher_jax.models import ModelConfig, Qwen2
    from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner, OptimConfig
    from memsearcher_jax.rl.sampler_weights import sampling_model
    from memsearcher_jax.rl.trainer import LoopConfig, Trainer
    from memsearcher_jax.sampling.sampler import Sampler

    config = ModelConfig.tiny(vocab_size=64, num_layers=1, **({"lora_rank": 4, "lora_alpha": 8.0} if lora else {}))
    learner = GRPOLearner(Qwen2(config, rngs=nnx.Rngs(0)),
                          GRPOConfig(optimizer_steps=1, micro_batch_size=4, logprob_batch_size=4, min_seq_len=16,
                                     old_logprobs="sampler", optim=OptimConfig(learning_rate=3e-2)))
    sampler = Sampler(sampling_model(learner, mesh, sampler_mesh, "float32"), mesh=sampler_mesh, layer_by_layer=lora)
    loop = LoopConfig(steps=loop_kw.pop("steps", 4), batch_questions=B, group_size=G, seed=0,
                      output_dir=str(tmp_path / name), max_staleness=k, save_every=2, **loop_kw)
    questions = [{"question": f"q{i}", "golden_answers": ["x"]} for i in range(8)]
    return Trainer(learner, SamplingRunner(sampler, delays), questions, pad_id=0, loop=loop, mesh=mesh,
                   sampler_mesh=sampler_mesh, progress=False, reward_fn=parity_reward)


def _leaves(trainer):
    return [np.asarray(x) for x in jax.tree.leaves(trainer.learner.params)]


def _embed(trainer):
    from memsearcher_jax.models import param_dict

    return np.asarray(param_dict(trainer.learner.model())["embed"])


PIPELINE_ONLY = ("time_", "compile", "tokens_per_second", "staleness_", "rollouts_queued")


def test_k0_through_the_pipeline_trains_what_the_inline_step_trains(tmp_path):
    inline, piped = tiny_trainer(tmp_path, 0, "inline"), tiny_trainer(tmp_path, 0, "piped")
    piped.pipelined = True  # the new path, forced at K = 0
    try:
        for _ in range(3):
            a, b = inline.train_step(), piped.train_step()
            assert {k: v for k, v in a.items() if not k.startswith(PIPELINE_ONLY)} == \
                   {k: v for k, v in b.items() if not k.startswith(PIPELINE_ONLY)}
            assert b["staleness_max"] == 0
    finally:
        piped.close()
    assert a["skipped_update"] == 0 and a["logprob_gap_max"] < 1e-4  # the step learned, on its own weights
    assert all(np.array_equal(x, y) for x, y in zip(_leaves(inline), _leaves(piped)))


def _train(trainer, steps):
    trainer.end_step = steps  # as train() sets it: no rollout past the last step
    try:
        return [trainer.train_step() for _ in range(steps)]
    finally:
        trainer.close()


@pytest.mark.parametrize("k", [1, 2])
def test_each_rollout_samples_with_the_weights_k_steps_back(tmp_path, k):
    trainer = tiny_trainer(tmp_path, k)
    embeds = [_embed(trainer)]  # version v: the learner's weights after v steps

    metrics = []
    try:
        for _ in range(5):
            metrics.append(trainer.train_step())
            embeds.append(_embed(trainer))
    finally:
        trainer.close()
    seen = {first_group // B: head for _, first_group, head in trainer.runner.seen}
    for step in range(5):
        assert np.array_equal(seen[step], embeds[max(0, step - k)]), step
        assert metrics[step]["staleness_max"] == metrics[step]["staleness_mean"] == min(step, k)
    assert not np.array_equal(embeds[0], embeds[-1])  # the weights moved: the versions differ


@pytest.mark.parametrize("k", [1, 2])
def test_a_slow_episode_makes_the_learner_wait_never_train_staler_than_k(tmp_path, k):
    # Step 3's rollout takes 1.5 s, the learner's steps a fraction of that: the learner waits for it
    # (idle) and trains it at step 3, with the weights of step 3 - k; nothing is dropped or skipped.
    trainer = tiny_trainer(tmp_path, k, delays={3: 1.5})
    metrics = _train(trainer, 6)
    for step, m in enumerate(metrics):
        assert m["staleness_max"] <= k and m["skipped_update"] == 0, (step, m["staleness_max"])
    assert metrics[3]["time_learner_idle"] > 1.0, metrics[3]["time_learner_idle"]
    rolled = sorted(first_group // B for _, first_group, _ in trainer.runner.seen)
    assert rolled == list(range(6))  # each step rolled out once, none past the last


def test_zero_std_refills_sample_with_the_steps_own_version(tmp_path):
    trainer = tiny_trainer(tmp_path, 1, filter_groups="zero_std", max_refill=2)
    metrics = _train(trainer, 4)
    by_seed = {}
    for seed, _, head in trainer.runner.seen:
        by_seed.setdefault(seed, []).append(head)
    assert any(len(heads) > 1 for heads in by_seed.values())  # some step refilled
    for heads in by_seed.values():  # a refill round runs the weights its step's first round ran
        assert all(np.array_equal(heads[0], h) for h in heads)
    assert all(m["staleness_max"] <= 1 for m in metrics)


def test_lora_trains_ahead_with_the_adapters_of_the_step_before(tmp_path):
    trainer = tiny_trainer(tmp_path, 1, lora=True)
    before = _leaves(trainer)
    metrics = _train(trainer, 3)
    assert trainer.sampler.layer_by_layer
    assert [m["staleness_max"] for m in metrics] == [0, 1, 1]
    assert not all(np.array_equal(x, y) for x, y in zip(before, _leaves(trainer)))  # the adapters moved


def test_no_new_programs_after_warm_up_at_k1(tmp_path):
    trainer = tiny_trainer(tmp_path, 1)
    metrics = _train(trainer, 6)
    # Warm-up: the first two steps (step 1 publishes its first version copy, trains its first stale rows).
    assert [m["compiles"] for m in metrics[3:]] == [0, 0, 0], [m["compiles"] for m in metrics]


@pytest.mark.slow
def test_resumed_run_regenerates_the_queued_rollouts_exactly(tmp_path):
    whole = tiny_trainer(tmp_path, 1, "whole", steps=4)
    whole.train()
    whole.close()
    cut = tiny_trainer(tmp_path, 1, "cut", steps=4)
    cut.train(steps=2)  # saves step 2, its queued rollout (step 2) sampled with version 1
    cut.close()
    assert os.path.isdir(tmp_path / "cut" / "checkpoints" / "2" / "behaviour_params")
    resumed = tiny_trainer(tmp_path, 1, "cut", steps=4)
    resumed.train()
    resumed.close()
    assert all(np.array_equal(x, y) for x, y in zip(_leaves(whole), _leaves(resumed)))
    # The resumed run's step 2 sampled with version 1 (restored), not with its own version 2.
    assert resumed.runner.seen[0][1] == whole.runner.seen[2][1] == 2 * B
    assert np.array_equal(resumed.runner.seen[0][2], whole.runner.seen[2][2])
    assert not np.array_equal(resumed.runner.seen[0][2], resumed.runner.seen[1][2])


@pytest.mark.slow
def test_sigkill_mid_pipeline_then_resume_matches_uninterrupted(tmp_path):
    # The CLI's training job at K = 1, killed between checkpoints while a rollout runs ahead: the
    # resumed run regenerates its queued rollout from the checkpoint's older version, exactly.
    from tests.test_train_step import _train_cmd, sigkill_then_resume

    ahead = ["--config.rl.max_staleness=1"]
    ref, resumed = sigkill_then_resume(lambda out, steps, worlds: _train_cmd(ROOT, out, steps, worlds) + ahead,
                                       tmp_path)
    for k in ref:
        np.testing.assert_array_equal(ref[k], resumed[k], err_msg=k)
    ckpt = tmp_path / "killed" / "checkpoints" / "4"
    assert (ckpt / "behaviour_params").is_dir()  # the checkpoint kept version 3 for step 4's rollout


_SPLIT_CHILD = textwrap.dedent("""
    import json, pathlib, sys
    sys.path.insert(0, sys.argv[2])
    import jax, numpy as np
    from memsearcher_jax.runtime import distributed
    from test_async_rollout import tiny_trainer, _leaves
    tmp = pathlib.Path(sys.argv[1])
    out = {}
    for name, devices in (("shared", 0), ("split", 1)):
        mesh, sampler_mesh = distributed.learner_and_sampler_meshes(1, 1, 1, devices)
        trainer = tiny_trainer(tmp, 1, name, mesh=mesh, sampler_mesh=sampler_mesh)
        metrics = [trainer.train_step() for _ in range(3)]
        trainer.close()
        head = trainer.sampler._params["head"]
        learner = jax.tree.leaves(trainer.learner.params)
        out[name] = {"sampler": sorted(d.id for d in head.sharding.device_set),
                     "learner": sorted({d.id for x in learner for d in x.sharding.device_set}),
                     "staleness": [m["staleness_max"] for m in metrics],
                     "params": [float(np.asarray(x, np.float64).sum()) for x in _leaves(trainer)]}
    print("RESULT" + json.dumps(out))
""")


@pytest.mark.slow
def test_sampler_on_devices_of_its_own_trains_what_shared_devices_train(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", _SPLIT_CHILD, str(tmp_path), os.path.join(ROOT, "tests")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT"))[len("RESULT"):])
    assert got["shared"]["sampler"] == [0] and set(got["shared"]["learner"]) == {0}
    assert got["split"]["sampler"] == [1] and set(got["split"]["learner"]) == {0}  # the last device decodes
    assert got["split"]["staleness"] == [0, 1, 1]
    assert got["split"]["params"] == got["shared"]["params"]  # the same steps, whichever device decoded


def test_its_keys_rules_name_the_key_and_what_is_expected():
    from memsearcher_jax.errors import UserInputError
    from memsearcher_jax.rules.config_rules import config_problems
    from memsearcher_jax.runtime.distributed import learner_and_sampler_meshes, staleness_host_problems
    from memsearcher_jax.settings.config_utils import load_config

    def problems(*overrides):
        return config_problems(load_config(os.path.join(ROOT, "configs/default.py"), list(overrides)))

    assert not [p for p in problems(("rl.max_staleness", "1")) if "max_staleness" in p]  # the CPU job's "sampler"
    assert any("rl.max_staleness must be >= 0" in p for p in problems(("rl.max_staleness", "-1")))
    assert any("rl.max_staleness=2 needs rl.old_logprobs='sampler'" in p
               for p in problems(("rl.max_staleness", "2"), ("rl.old_logprobs", "recompute")))
    assert any("sampler.devices must be >= 0" in p for p in problems(("sampler.devices", "-1")))
    assert any("sampler.devices=3 must be a multiple of mesh.tp=2" in p
               for p in problems(("sampler.devices", "3"), ("mesh.tp", "2")))
    assert staleness_host_problems(1, 2) and not staleness_host_problems(0, 2) and not staleness_host_problems(1, 1)
    with pytest.raises(UserInputError, match=r"sampler.devices=2 beside .* = 8 learner devices needs 10 devices"):
        learner_and_sampler_meshes(2, 2, 2, 2)  # the test process has 8
    learner, sampler = learner_and_sampler_meshes(2, 1, 2, 4)
    assert {d.id for d in learner.devices.flat} == {0, 1, 2, 3} and {d.id for d in sampler.devices.flat} == {4, 5, 6, 7}
