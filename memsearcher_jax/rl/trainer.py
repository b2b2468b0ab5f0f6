"""The GRPO training loop: rollouts, updates, checkpoints, metrics. Built by `experiment.build_trainer`.

The math of one step lives in `rl/grpo.py` (its rows and batches in `rl/batching.py`) and the turn
loop in `agent/rollout.py`; this file runs them: for each step
    questions -> AgentRunner (sampler + retriever) -> rewards -> rows -> GRPOLearner update
    -> the sampler gets the new weights
with metrics to TensorBoard + JSONL, a progress bar, and atomic Orbax checkpoints that a
resumed run continues from exactly (params, optimizer state, step; the data position and the
seeds follow from the step).

Multi-host (jax.process_count() > 1, after `distributed.initialize_from_env`): the learner
runs on the global mesh; each host rolls out its contiguous slice of the step's questions
(`host_shard`) with a sampler on its own devices (`distributed.local_mesh`), scores and packs
its rows, and `distributed.allgather_rows` gives every host the same global rows, in the
order one process would have packed them, for the unchanged update. Trajectory and group ids
are global and every trajectory samples from (step seed, its traj_id), so N hosts draw the
same tokens as one process.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from memsearcher_jax.agent.rollout import AgentRunner
from memsearcher_jax.models import CausalLM
from memsearcher_jax.qa_metrics import compute_reward
from memsearcher_jax.rl import async_rollout
from memsearcher_jax.rl.advantages import groups_with_spread
from memsearcher_jax.rl.async_rollout import Collected
from memsearcher_jax.rl.batching import gather_rows, pack_rows
from memsearcher_jax.rl.checkpoints import CheckpointedLoop
from memsearcher_jax.rl.grpo import GRPOLearner, score_trajectories, with_coverage
from memsearcher_jax.rl.hosts import check_search_errors
from memsearcher_jax.rl.information import information_advantages, merge_info
from memsearcher_jax.rl.metrics import LOG_DIR, MetricsWriter, rollout_metrics, sample_records
from memsearcher_jax.rl.sampler_weights import sampling_model
from memsearcher_jax.rl.schedule import QuestionSchedule, batch_for_step
from memsearcher_jax.runtime import compile_stats, distributed


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Defaults: the train.* / rl.* keys' (settings/training.py; tests/test_lower_defaults.py)."""
    steps: int
    batch_questions: int                # B questions per step
    group_size: int                     # G samples per question
    seed: int
    output_dir: str
    save_every: int = 20
    keep: int = 3                       # checkpoints kept
    sampling_dtype: str = "float32"     # the dtype weights move in when re-laid out for the sampler
    eval_every: int = 50                # steps between held-out evaluations (0: none); the best is kept
    log_samples_every: int = 0          # steps between sample trajectories logged as text (0: none)
    samples_per_log: int = 4
    wandb_project: str = ""             # also log to Weights & Biases ("" : off)
    filter_groups: str = "none"         # "zero_std": drop groups whose rewards all tie, refill the batch
    max_refill: int = 2                 # refill rounds of fresh questions per step (zero_std)
    info_signal: str = "off"            # "log" | "reward": per-question information signal (rl/information.py)
    info_coef: float = 0.0              # "reward": weight of its group-normalised bonus in the advantage
    coverage_coef: float = 0.0          # reward + coef x the share of the task's questions searched (with_coverage)
    max_staleness: int = 0              # K > 0: steps t+1..t+K rolled out while step t learns (rl/async_rollout.py)


# ----------------------------------------------------------------------------- the loop

class Trainer(CheckpointedLoop):
    """Runs (or resumes) GRPO: `train()`. Built from a config by `experiment.build_trainer`.

    learner: the GRPOLearner (its mesh is `mesh`); runner: the turn loop over `runner.sampler`,
    which gets the learner's weights after every update; questions: the training questions;
    evaluate: sampler -> {"em", "f1", "turns", ...} on held-out questions (every
    loop.eval_every steps; the best params by eval/em are kept in best/); meta: extra fields
    for each checkpoint's metadata (e.g. the tokenizer directory); reward_fn: the trajectory
    reward, `compute_reward`'s signature (docs/method.md §3 by default; `rl.reward_fn` plugs in another);
    schedule: the questions by step instead of `questions` (rl/schedule.py; its stage is checkpointed).
    """

    def __init__(self, learner: GRPOLearner, runner: AgentRunner, questions: list[dict], pad_id: int,
                 loop: LoopConfig, mesh=None, sampler_mesh=None, meta: dict | None = None, progress: bool = True,
                 evaluate: Callable | None = None, reward_fn: Callable = compute_reward,
                 schedule: QuestionSchedule | None = None):
        self.learner, self.runner, self.sampler = learner, runner, runner.sampler
        self.questions, self.pad_id, self.loop = questions, pad_id, loop
        self.schedule = schedule or QuestionSchedule.fixed(questions)
        self.mesh, self.sampler_mesh = mesh, sampler_mesh
        self.meta, self.progress, self.evaluate, self.reward_fn = dict(meta or {}), progress, evaluate, reward_fn
        self.num_hosts = jax.process_count()
        self.out_dir = epath.Path(loop.output_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.step = 0
        self.skipped_updates = 0  # steps whose update was skipped: nothing to learn (train_step)
        # Rollouts ahead of the learner (K > 0; set True to force the path at K = 0): the thread, the
        # older weights its first rollouts need (a resumed run's) and the step it stops before.
        self.pipelined, self.pipeline, self.restored_versions, self.end_step = loop.max_staleness > 0, None, [], None
        self._ckpt = self._best = None
        self._last_samples: list = []

    def _sampling_model(self) -> CausalLM:
        return sampling_model(self.learner, self.mesh, self.sampler_mesh, self.loop.sampling_dtype)

    def _evaluate(self, metrics: dict) -> None:
        with self.pipeline.sampler_held() if self.pipeline is not None else contextlib.nullcontext():
            if self.pipeline is not None:  # the sampler holds an older version: evaluate the learner's
                self.sampler.update_params(self._sampling_model())
            got = self.evaluate(self.sampler)
        metrics.update({f"eval/{k}": v for k, v in got.items() if isinstance(v, (int, float))})
        meta = {"step": self.step, "model_config": dataclasses.asdict(self.learner.model().config), **self.meta}
        self.best.save(self.step, args=ocp.args.Composite(params=ocp.args.StandardSave(self.learner.params),
                                                          meta=ocp.args.JsonSave(meta)),
                       metrics={"eval/em": float(got["em"])})
        self.best.wait_until_finished()

    # --- one step ---
    def _rollout(self, step: int, pool: list[dict], refill: int = 0):
        """Roll out this host's slice of step `step`'s questions from `pool` (refill > 0: the refill
        round's fresh questions) and score them. Returns (trajectories, reward results, #questions)."""
        loop = self.loop
        seed = loop.seed if refill == 0 else loop.seed + 7919 * refill
        questions, _ = batch_for_step(pool, step, loop.batch_questions, seed)
        # This host's contiguous slice (all of it on one host): a group's G samples stay
        # together, so rewards and advantages need nothing from the other hosts.
        first_q = jax.process_index() * (len(questions) // self.num_hosts) + refill * loop.batch_questions
        questions = distributed.host_shard(questions, jax.process_index(), self.num_hosts)
        # Global ids: group ids for the advantages, trajectory ids for the rows and the seeds.
        trajs = self.runner.run(questions, group_size=loop.group_size, seed=_step_seed(loop.seed, step),
                                first_group_id=step * loop.batch_questions + first_q,
                                first_traj_id=first_q * loop.group_size)
        results = with_coverage(score_trajectories(trajs, self.reward_fn), trajs, loop.coverage_coef)
        return trajs, results, len(questions)

    def _keep_groups_with_spread(self, trajs, results, n_groups: int, step: int, pool: list[dict]):
        """Dynamic sampling (filter_groups="zero_std"): drop groups whose rewards all tie and refill
        from fresh questions, up to max_refill rounds. Returns (kept, their results, #dropped, #refills)."""
        want = n_groups * self.loop.group_size
        spread = lambda ts, rs: groups_with_spread([r.reward for r in rs], [t.group_id for t in ts])
        kept = [(t, r) for t, r, k in zip(trajs, results, spread(trajs, results)) if k]
        dropped, refills = n_groups - len(kept) // self.loop.group_size, 0
        while len(kept) < want and refills < self.loop.max_refill:
            refills += 1
            more, more_results, _ = self._rollout(step, pool, refills)
            kept += [(t, r) for t, r, k in zip(more, more_results, spread(more, more_results)) if k]
        return [t for t, _ in kept[:want]], [r for _, r in kept[:want]], dropped, refills

    def _collect(self, step: int, version: int, pool: list[dict]) -> Collected:
        """Step `step`'s rollout (on the sampler's weights, `version`), scored, zero_std's filter applied."""
        t0 = time.perf_counter()
        self.runner.stats = type(self.runner.stats)()
        trajs, results, n_groups = self._rollout(step, pool)
        kept, kept_results, dropped, refills = trajs, results, 0, 0
        if self.loop.filter_groups == "zero_std":
            kept, kept_results, dropped, refills = self._keep_groups_with_spread(trajs, results, n_groups, step, pool)
        for t in trajs + kept:
            t.policy_version = version
        return Collected(step, version, trajs, results, kept, kept_results, dropped, refills, self.runner.stats,
                         time.perf_counter() - t0)

    def _update(self, trajs, results, stale: bool = False) -> tuple[int, dict]:
        """Advantages, rows (gathered over hosts), the updates, the sampler's new weights -> (#rows, metrics).
        stale: sampled by older weights than the learner's (rl/async_rollout.py), which refreshes the sampler."""
        grpo, (adv, info) = self.learner.config, information_advantages(self, trajs, results)
        rows = pack_rows(trajs, adv, self.pad_id, min_len=grpo.min_seq_len, max_len=grpo.max_seq_len)
        if self.num_hosts > 1:
            rows = gather_rows(rows, self.pad_id)
        t0, c0 = time.perf_counter(), compile_stats.snapshot()
        update = self.learner.train_on_rows(rows, np.random.default_rng([self.loop.seed, self.step, 1]), stale=stale)
        update["time_update"] = time.perf_counter() - t0 - update["time_logprobs"]
        update["compiles_update"] = (compile_stats.snapshot() - c0).programs - update["compiles_logprobs"]
        if not self.pipelined:
            self.sampler.update_params(self._sampling_model())
        return rows.num_rows, merge_info(update, info)

    def _any_host_kept(self, kept: list) -> bool:
        """Whether any host kept a group; every host asks (a collective), then all update or all skip."""
        if self.num_hosts == 1:
            return bool(kept)
        return bool(np.sum(multihost_utils.process_allgather(np.asarray(len(kept), np.int32))) > 0)

    def train_step(self) -> dict:
        """One GRPO step: rollout (under zero_std, dynamic sampling), then the update. Under zero_std a step
        whose groups all tie has nothing to learn (all advantages 0), so its update is skipped and counted.
        Pipelined (rl.max_staleness > 0): the rollout was made ahead, by rl/async_rollout.py's thread."""
        t0, c0 = time.perf_counter(), compile_stats.snapshot()
        got, ahead = (async_rollout.take(self) if self.pipelined
                      else (self._collect(self.step, self.step, self.schedule.questions), {}))
        trajs, results, stats = got.trajs, got.results, got.stats
        # A step that mostly read "search failed" is not trained on: decided on every host's counts.
        check_search_errors(stats, self.num_hosts)
        # Multi-host: a host that kept no group still joins the others' update (its collectives),
        # with no rows, so the update is the one a single process makes on the kept groups alone.
        update_any = self._any_host_kept(got.kept)
        no_update = {"time_logprobs": 0.0, "time_update": 0.0, "compiles_logprobs": 0, "compiles_update": 0}
        stale = got.version < self.step
        num_rows, update = self._update(got.kept, got.kept_results, stale) if update_any else (0, no_update)
        skip = {} if update_any else {"skipped_update_reason": "every group's rewards tie"}
        self.skipped_updates += 0 if update_any else 1
        if self.pipelined:
            ahead.update(async_rollout.staleness_metrics(got.kept, self.step))
        self.step += 1
        if self.pipelined:  # the thread may start the rollout this version admits
            async_rollout.publish(self, updated=update_any)
        # Multi-host: rollout metrics are this host's trajectories; "rows" and the update's are global.
        metrics = rollout_metrics(trajs, results, num_rows)
        metrics.update(filtered_groups=got.dropped, refill_rounds=got.refills, skipped_update=int(not update_any),
                       **skip, **update, **ahead)
        if self.loop.log_samples_every and self.step % self.loop.log_samples_every == 0:
            self._last_samples = sample_records(trajs, results, self.runner.builder.decode, self.loop.samples_per_log)
        metrics.update({
            "skipped_steps_total": self.learner.skipped_steps, "skipped_updates_total": self.skipped_updates,
            "time_rollout": got.seconds, "time_sampling": stats.sampler_seconds,
            "time_retrieval": stats.retrieval_seconds, "search_errors": stats.search_errors,
            "tokens_per_second": stats.generated_tokens / max(stats.sampler_seconds, 1e-9),
        })
        metrics.update(compile_stats.step_compiles(compile_stats.snapshot() - c0, update["compiles_logprobs"],
                                     update["compiles_update"]))
        if self.pipelined:
            metrics["time_step"] = time.perf_counter() - t0
        return metrics

    def train(self, steps: int | None = None) -> list[dict]:
        steps = self.loop.steps if steps is None else steps
        self.maybe_resume()
        self.end_step = steps  # a pipeline rolls out no step past the last
        lead = jax.process_index() == 0  # one host writes the logs and draws the bar
        writer = (MetricsWriter(str(self.out_dir / LOG_DIR), resume_step=self.step,
                                wandb_project=self.loop.wandb_project, run_name=self.out_dir.name) if lead else None)
        history = []
        bar = tqdm(total=steps, initial=self.step, desc="GRPO", disable=not (self.progress and lead),
                   dynamic_ncols=True)
        try:
            while self.step < steps:
                m = self.train_step()
                m.update(self.schedule.observe(self.step, m["em"]))  # the next step's stage (rl/schedule.py)
                if self.evaluate is not None and self.loop.eval_every and self.step % self.loop.eval_every == 0:
                    self._evaluate(m)
                history.append(m)
                if writer is not None:
                    writer.write(self.step, m)
                    if self._last_samples:
                        writer.write_samples(self.step, self._last_samples)
                        self._last_samples = []
                bar.update(1)
                if m["skipped_update"] and lead:
                    tqdm.write(f"GRPO step {self.step}: update skipped ({m['skipped_update_reason']})")
                elif not m["skipped_update"]:
                    bar.set_postfix(reward=f"{m['reward_mean']:.3f}", em=f"{m['em']:.2f}", kl=f"{m['approx_kl']:.4f}")
                if self.step % self.loop.save_every == 0 or self.step == steps:
                    self.save()
        finally:
            async_rollout.stop(self, wait=sys.exc_info()[0] is None)  # an interrupted run does not wait
            bar.close()
            if writer is not None:
                writer.close()
            if self._ckpt is not None:
                self.checkpoints.wait_until_finished()
        return history


def _step_seed(seed: int, step: int) -> int:
    return (seed * 100_003 + step * 9_973 + 17) % (2 ** 31 - 1)
