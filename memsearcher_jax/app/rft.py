"""Rejection-sampling fine-tuning (RFT): the supervised control GRPO has to beat on its own rollouts.

From the warm-started model, sample as many trajectories as GRPO does (train.steps x
rl.batch_questions x rl.group_size, the same questions in the same order, the same sampling
settings and turn limits), keep those whose reward reaches `min_reward`, and fine-tune on their
conversations (the generated tokens only, as SFT trains demonstrations) for at least as long as
GRPO took in all (sampling + fine-tuning >= `seconds`), and at least one pass over the kept rows:
ceil(kept conversations / sft.batch_size) steps, whose batches hold every kept conversation
(`rl.sft.sft_train` skips no row; one longer than sft.max_len is cut to it, as in SFT).
This is the paper's comparison (RL against supervised training on the same data, MemSearcher
Table 1) with the data the policy itself produced, which GRPO also sees; unlike the older control
(`warm_start.extra_sft`: more of the demonstrator's episodes) it can unlearn the demonstrator's habits.
"""
from __future__ import annotations

import dataclasses
import math
import time

from tqdm.auto import tqdm

from memsearcher_jax.app.experiment import Setup, build_sampler, load_reward_fn, sampling_mesh, training_runner
from memsearcher_jax.app.warm_start import continued_sft, embedding_row_groups
from memsearcher_jax.models import from_pretrained
from memsearcher_jax.rl.grpo import score_trajectories
from memsearcher_jax.rl.sft import sft_train
from memsearcher_jax.rl.trainer import batch_for_step
from memsearcher_jax.settings import Settings

# A trajectory is kept when its reward reaches this: every objective answered exactly right
# (the reward is F1-based, so 1.0 means token F1 1 on every part).
MIN_REWARD = 1.0
# A float reached by another order of operations can sit a few ulps below the threshold
# (0.9999999999999999 for 1): such a reward still reaches it.
REWARD_TOLERANCE = 1e-9


@dataclasses.dataclass
class RFTResult:
    model: object
    sampled: int          # trajectories sampled
    kept: int             # of them, with reward >= min_reward
    rows: int             # conversations trained on
    steps: int            # fine-tuning steps
    sample_seconds: float
    train_seconds: float

    def summary(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "model"}


def kept_trajectories(trajs, results, min_reward: float = MIN_REWARD) -> list:
    """The trajectories whose reward reaches min_reward (and whose format passed)."""
    return [t for t, r in zip(trajs, results) if r.format_ok and r.reward >= min_reward - REWARD_TOLERANCE]


def sample_rollouts(cfg: Settings, setup: Setup, model, min_reward: float = MIN_REWARD,
                    progress: bool = True) -> list[tuple[list, list]]:
    """GRPO's rollouts without its updates: per training step, that step's questions (the same
    data order, `rl.trainer.batch_for_step`) x rl.group_size samples, with the training sampling
    settings. Returns [(trajectories, reward results)] per step. `progress`: a bar by step, with
    the trajectories kept so far (reward >= min_reward; the sampling takes as long as GRPO's rollouts)."""
    runner = training_runner(cfg, setup, build_sampler(cfg, model, sampling_mesh(cfg)))
    reward_fn = load_reward_fn(cfg.rl.reward_fn)
    b, g = cfg.rl.batch_questions, cfg.rl.group_size
    out, kept = [], 0
    bar = tqdm(range(cfg.train.steps), desc="RFT sampling", unit="step", disable=not progress)
    for step in bar:
        questions, _ = batch_for_step(setup.train_questions, step, b, cfg.train.seed)
        trajs = runner.run(questions, group_size=g, seed=cfg.train.seed * 1_000_003 + step,
                           first_group_id=step * b, first_traj_id=step * b * g)
        out.append((trajs, score_trajectories(trajs, reward_fn)))
        kept += len(kept_trajectories(*out[-1], min_reward))
        bar.set_postfix(kept=f"{kept}/{(step + 1) * b * g}")
    bar.close()
    return out


def rft_control(cfg: Settings, setup: Setup, model_dir: str, seconds: float,
                min_reward: float = MIN_REWARD) -> RFTResult:
    """RFT from the model in `model_dir` (the warm start): sample, keep, fine-tune for at least
    `seconds` in all (see the module docstring). The fine-tuning runs at the warm start's final
    learning rate, as `warm_start.extra_sft` does, with the same tied embedding rows."""
    t0 = time.perf_counter()
    policy = from_pretrained(model_dir, dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype)
    steps = sample_rollouts(cfg, setup, policy, min_reward)
    sampled = sum(len(trajs) for trajs, _ in steps)
    kept = [t for trajs, results in steps for t in kept_trajectories(trajs, results, min_reward)]
    sample_seconds = time.perf_counter() - t0
    convs = [c for t in kept for c in t.conversations]
    if not convs:
        return RFTResult(policy, sampled, 0, 0, 0, sample_seconds, 0.0)
    sft_cfg, optim = continued_sft(cfg, seed=cfg.train.seed + 20_000)
    t1 = time.perf_counter()
    model, history = sft_train(policy, convs, sft_cfg, setup.builder.pad_id, optim=optim,
                               seconds=max(0.0, seconds - sample_seconds), tied_rows=embedding_row_groups(cfg, setup),
                               min_steps=math.ceil(len(convs) / sft_cfg.batch_size))
    return RFTResult(model, sampled, len(kept), len(convs), len(history), sample_seconds, time.perf_counter() - t1)
