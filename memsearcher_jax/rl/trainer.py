"""The GRPO training loop: rollouts, updates, checkpoints, metrics. Built by `experiment.build_trainer`.

The math of one step lives in `rl/grpo.py` and the turn loop in `agent/rollout.py`; this file
runs them: for each step
    questions -> AgentRunner (sampler + retriever) -> rewards -> rows -> GRPOLearner update
    -> the sampler gets the new weights
with metrics to TensorBoard + JSONL, a progress bar, and atomic Orbax checkpoints that a
resumed run continues from exactly (params, optimizer state, step, data position, RNG).

Multi-host (jax.process_count() > 1, after `distributed.initialize_from_env`): the learner
runs on the global mesh; each host rolls out its contiguous slice of the step's questions
(`host_shard`) with a sampler on its own devices (`distributed.local_mesh`), scores and packs
its rows, and `distributed.allgather_rows` gives every host the same global rows, in the
order one process would have packed them, for the unchanged update. Trajectory and group ids
are global and every trajectory samples from (step seed, its traj_id), so N hosts draw the
same tokens as one process.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from tqdm.auto import tqdm

from memsearcher_jax import distributed
from memsearcher_jax.agent.rollout import AgentRunner, Trajectory
from memsearcher_jax.models import Qwen2, ShardingConfig, shard_model
from memsearcher_jax.rl.advantages import zero_variance_fraction
from memsearcher_jax.rl.grpo import GRPOLearner, RowBatch, pack_rows, score_trajectories, trajectory_advantages


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    steps: int
    batch_questions: int                # B questions per step
    group_size: int                     # G samples per question
    seed: int
    output_dir: str
    save_every: int = 10
    keep: int = 3                       # checkpoints kept
    sampling_dtype: str = "float32"     # the dtype weights move in when re-laid out for the sampler


def batch_for_step(questions: list[dict], step: int, batch: int, seed: int) -> tuple[list[dict], int]:
    """Deterministic data order: a fresh permutation per epoch. Returns (batch, data position)."""
    n = len(questions)
    start = step * batch
    out = []
    for pos in range(start, start + batch):
        epoch, i = divmod(pos, n)
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        out.append(questions[perm[i]])
    return out, start + batch


def sampling_model(learner: GRPOLearner, mesh, sampler_mesh, dtype: str) -> Qwen2:
    """The learner's current weights as the sampler wants them: a model over fresh Variables
    (re-placing it must not move the learner's own params out of the training layout), in the
    TP-only sampling layout on a mesh, as host-local arrays on several hosts."""
    model = nnx.merge(learner.graphdef, jax.tree.map(lambda x: x, learner.params))
    if mesh is not None:
        # The tensors that move are moved in the compute dtype (the Sampler casts to it anyway).
        model = shard_model(model, mesh, ShardingConfig.sampling(), move_dtype=dtype)
    if jax.process_count() > 1:
        # The sampling layout is replicated over data/fsdp and split over tp, which stays inside
        # a host: every host holds a whole copy among its shards. Rebuild it as host-local arrays
        # on the sampler's local mesh (same specs, same devices).
        graphdef, state = nnx.split(model)
        model = nnx.merge(graphdef, distributed.to_local_arrays(state, sampler_mesh))
        model.mesh = sampler_mesh
        model.sharding = ShardingConfig.sampling()
    return model


# ----------------------------------------------------------------------------- the loop

def rollout_metrics(trajs: list[Trajectory], results, rows) -> dict:
    rewards = np.array([r.reward for r in results])
    groups = np.array([t.group_id for t in trajs])
    ctx = [c for t in trajs for c in t.context_tokens]
    mem = [n for t in trajs for n in t.memory_tokens]
    return {
        "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
        "em": float(np.mean([r.em for r in results])), "f1": float(np.mean([r.f1 for r in results])),
        "format_error_rate": float(np.mean([not r.format_ok for r in results])),
        "zero_variance_groups": float(zero_variance_fraction(rewards, groups)),
        "turns_per_trajectory": float(np.mean([len(t.conversations) for t in trajs])),
        "searches_per_trajectory": float(np.mean([t.num_searches for t in trajs])),
        "memory_tokens_mean": float(np.mean(mem)) if mem else 0.0,
        "context_tokens_mean": float(np.mean(ctx)) if ctx else 0.0,
        "context_tokens_max": float(np.max(ctx)) if ctx else 0.0,
        "response_tokens_mean": float(np.mean([len(c.response_ids) for t in trajs for c in t.conversations])),
        "rows": int(rows.num_rows),
    }


class MetricsWriter:
    """TensorBoard scalars + one JSON line per step."""

    def __init__(self, log_dir: str, resume_step: int = 0):
        """resume_step: the step a resumed run restarts after; lines logged past it by the run
        that died are dropped (TensorBoard purges them too), so every step is logged once."""
        os.makedirs(log_dir, exist_ok=True)
        path = os.path.join(log_dir, "metrics.jsonl")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                kept = [line for line in f if line.endswith("\n") and json.loads(line)["step"] <= resume_step]
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.writelines(kept)
            os.replace(path + ".tmp", path)
        self.jsonl = open(path, "a", encoding="utf-8")
        try:
            from tensorboardX import SummaryWriter

            self.tb = SummaryWriter(log_dir, purge_step=resume_step + 1 if resume_step else None)
        except ImportError:  # TensorBoard is optional
            self.tb = None

    def write(self, step: int, metrics: dict):
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and np.isfinite(v)}
        self.jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def close(self):
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()


class Trainer:
    """Runs (or resumes) GRPO: `train()`. Built from a config by `experiment.build_trainer`.

    learner: the GRPOLearner (its mesh is `mesh`); runner: the turn loop over `runner.sampler`,
    which gets the learner's weights after every update; questions: the training questions;
    meta: extra fields for each checkpoint's metadata (e.g. the tokenizer directory).
    """

    def __init__(self, learner: GRPOLearner, runner: AgentRunner, questions: list[dict], pad_id: int,
                 loop: LoopConfig, mesh=None, sampler_mesh=None, meta: dict | None = None, progress: bool = True):
        self.learner, self.runner, self.sampler = learner, runner, runner.sampler
        self.questions, self.pad_id, self.loop = questions, pad_id, loop
        self.mesh, self.sampler_mesh = mesh, sampler_mesh
        self.meta, self.progress = dict(meta or {}), progress
        self.num_hosts = jax.process_count()
        self.out_dir = loop.output_dir
        os.makedirs(self.out_dir, exist_ok=True)
        self.step = 0
        self._ckpt = None

    def _sampling_model(self) -> Qwen2:
        return sampling_model(self.learner, self.mesh, self.sampler_mesh, self.loop.sampling_dtype)

    # --- checkpoints ---
    @property
    def checkpoints(self):
        if self._ckpt is None:
            opts = ocp.CheckpointManagerOptions(max_to_keep=self.loop.keep, enable_async_checkpointing=True)
            self._ckpt = ocp.CheckpointManager(os.path.join(self.out_dir, "checkpoints"), options=opts)
        return self._ckpt

    def save(self, block: bool = False):
        meta = {"step": self.step, "data_position": self.step * self.loop.batch_questions,
                "skipped_steps": self.learner.skipped_steps, "seed": self.loop.seed,
                "model_config": dataclasses.asdict(self.learner.model().config), **self.meta}
        # Params, optimizer state and metadata are separate items: export restores params alone.
        self.checkpoints.save(self.step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(self.learner.params), opt_state=ocp.args.StandardSave(self.learner.opt_state),
            meta=ocp.args.JsonSave(meta)), force=True)
        if block:
            self.checkpoints.wait_until_finished()

    def maybe_resume(self) -> bool:
        latest = self.checkpoints.latest_step()
        if latest is None:
            return False
        abstract = lambda tree: jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
        restored = self.checkpoints.restore(latest, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract(self.learner.params)),
            opt_state=ocp.args.StandardRestore(abstract(self.learner.opt_state)), meta=ocp.args.JsonRestore()))
        self.learner.params = restored["params"]
        self.learner.opt_state = restored["opt_state"]
        self.learner.skipped_steps = int(restored["meta"]["skipped_steps"])
        self.step = int(restored["meta"]["step"])
        self.sampler.update_params(self._sampling_model())
        return True

    # --- one step ---
    def train_step(self) -> dict:
        loop = self.loop
        t0 = time.perf_counter()
        questions, _ = batch_for_step(self.questions, self.step, loop.batch_questions, loop.seed)
        # This host's contiguous slice (all of it on one host): a group's G samples stay
        # together, so rewards and advantages need nothing from the other hosts.
        first_q = jax.process_index() * (len(questions) // self.num_hosts)
        questions = distributed.host_shard(questions, jax.process_index(), self.num_hosts)
        self.runner.stats = type(self.runner.stats)()
        # Global ids: group ids for the advantages, trajectory ids for the rows and the seeds.
        trajs = self.runner.run(questions, group_size=loop.group_size, seed=_step_seed(loop.seed, self.step),
                                first_group_id=self.step * loop.batch_questions + first_q,
                                first_traj_id=first_q * loop.group_size)
        t_rollout = time.perf_counter() - t0
        results = score_trajectories(trajs)
        adv = trajectory_advantages(trajs, [r.reward for r in results])
        grpo = self.learner.config
        rows = pack_rows(trajs, adv, self.pad_id, min_len=grpo.min_seq_len, max_len=grpo.max_seq_len)
        if self.num_hosts > 1:
            rows = gather_rows(rows, self.pad_id)
        t1 = time.perf_counter()
        rng = np.random.default_rng([loop.seed, self.step, 1])
        update = self.learner.train_on_rows(rows, rng)
        t_update = time.perf_counter() - t1
        self.sampler.update_params(self._sampling_model())
        self.step += 1
        stats = self.runner.stats
        # Multi-host: the rollout metrics (rewards, turns, timings) are this host's trajectories;
        # "rows" and the update's metrics are global.
        metrics = rollout_metrics(trajs, results, rows)
        metrics.update(update)
        metrics.update({
            "skipped_steps_total": self.learner.skipped_steps,
            "time_rollout": t_rollout, "time_sampling": stats.sampler_seconds,
            "time_retrieval": stats.retrieval_seconds, "time_logprobs": update["time_logprobs"],
            "time_update": t_update - update["time_logprobs"],
            "tokens_per_second": stats.generated_tokens / max(stats.sampler_seconds, 1e-9),
        })
        return metrics

    def train(self, steps: int | None = None) -> list[dict]:
        steps = self.loop.steps if steps is None else steps
        self.maybe_resume()
        lead = jax.process_index() == 0  # one host writes the logs and draws the bar
        writer = MetricsWriter(os.path.join(self.out_dir, "logs"), resume_step=self.step) if lead else None
        history = []
        bar = tqdm(total=steps, initial=self.step, desc="GRPO", disable=not (self.progress and lead),
                   dynamic_ncols=True)
        try:
            while self.step < steps:
                m = self.train_step()
                history.append(m)
                if writer is not None:
                    writer.write(self.step, m)
                bar.update(1)
                bar.set_postfix(reward=f"{m['reward_mean']:.3f}", em=f"{m['em']:.2f}", kl=f"{m['approx_kl']:.4f}")
                if self.step % self.loop.save_every == 0 or self.step == steps:
                    self.save()
        finally:
            bar.close()
            if writer is not None:
                writer.close()
            if self._ckpt is not None:
                self.checkpoints.wait_until_finished()
        return history


def gather_rows(rows: RowBatch, pad_id: int) -> RowBatch:
    """Every host's packed rows, in process order, on every host (a collective).

    The sequence length becomes the longest host's bucket, which is the bucket one process
    packing all the trajectories picks (buckets grow with the length); the extra columns are
    padding exactly as pack_rows writes it. So the result equals the single-process RowBatch.
    """
    fields = {f.name: getattr(rows, f.name) for f in dataclasses.fields(RowBatch)}
    return RowBatch(**distributed.allgather_rows(fields, pad_values={"tokens": pad_id}))


def _step_seed(seed: int, step: int) -> int:
    return (seed * 100_003 + step * 9_973 + 17) % (2 ** 31 - 1)
