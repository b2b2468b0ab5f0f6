"""Rollouts ahead of the learner (rl.max_staleness = K > 0): while the learner updates step t, a
background thread rolls out steps t+1..t+K with the weights the learner had up to K steps before.

Which weights sample which step is fixed by the steps, never by timing, so a run is deterministic
and a resumed one continues exactly:
- version v of the weights is the learner's after v steps. The rollout of step s samples with
  version max(0, s - K), exactly that one: the thread waits until it is published (admission paced
  by version: the rollout of step s cannot start before the learner has finished step s - K - 1),
  never takes a newer one, and no rollout is ever dropped for being stale. The learner trains on
  it at step s, so each trajectory's staleness (s minus the version that sampled it, recorded in
  `Trajectory.policy_version`) is at most K.
- weights reach the sampler between two rollouts, never inside one: a step's episodes (its
  refill rounds too) all run the version they started with, so every group is one version.
- a checkpoint at step c keeps the versions the rollouts of steps c..c+K-1 need (c-K..c-1, its
  item `behaviour_params`); a resumed run regenerates those rollouts from them (the same weights
  and seeds: the same tokens) instead of saving the rollouts themselves.

XLA releases the GIL while a program runs, so the thread's sampler and the learner's programs
overlap, on shared devices or on their own (sampler.devices: the sampler on the last devices).
K = 0 never comes here (`Trainer.train_step` rolls out in line, as it always did); forced
through here (`Trainer.pipelined = True`) at K = 0 it trains the same steps bit for bit.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from memsearcher_jax.rl.sampler_weights import sampling_model

BEHAVIOUR_ITEM = "behaviour_params"  # a checkpoint's older weight versions (rl/checkpoints.py STEP_ITEMS)


@dataclasses.dataclass
class Version:
    """The learner's weights after `number` steps: a copy of its params (its update donates its
    own) and the question schedule's stage then (the pool the rollouts it samples draw from)."""
    number: int
    params: Any
    stage: int = 0


@dataclasses.dataclass
class Collected:
    """One step's rollout, scored and filtered (`Trainer._collect`), as the learner takes it."""
    step: int
    version: int                 # the weights that sampled it
    trajs: list                  # every trajectory rolled out (the metrics' view)
    results: list
    kept: list                   # those trained on (zero_std: the groups with a spread)
    kept_results: list
    dropped: int                 # groups dropped by zero_std
    refills: int                 # zero_std's refill rounds
    stats: Any                   # the turn loop's RolloutStats of this rollout alone
    seconds: float               # wall time of the rollout


def copy_params(tree):
    """Fresh buffers for every leaf, in place (same devices and layout): the learner's next update
    donates its params, and a version must outlive it."""
    return jax.tree.map(jnp.copy, tree)


def staleness_metrics(trajs: list, step: int) -> dict:
    """Staleness (the step trained at minus the version that sampled it) over the trained
    trajectories, weighted by their generated tokens: mean and max."""
    tokens = np.array([sum(len(c.response_ids) for c in t.conversations) for t in trajs], np.float64)
    stale = np.array([step - t.policy_version for t in trajs], np.float64)
    if not len(trajs):
        return {"staleness_mean": 0.0, "staleness_max": 0}
    weights = tokens if tokens.sum() > 0 else np.ones_like(tokens)
    return {"staleness_mean": float((stale * weights).sum() / weights.sum()), "staleness_max": int(stale.max())}


class RolloutPipeline:
    """The rollout thread and what it shares with the learner. collect(step, version) rolls out
    and scores one step (on the sampler, which install(version) loaded first); the learner calls
    `publish` after each step and `take(step)` for its rollout."""

    def __init__(self, collect: Callable[[int, Version], Collected], install: Callable[[Version], None],
                 max_staleness: int):
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.collect, self.install, self.max_staleness = collect, install, max_staleness
        self._cond = threading.Condition()
        self._sampler_lock = threading.Lock()   # held by a rollout, or by whoever else uses the sampler
        self._versions: dict[int, Version] = {}
        self._ready: dict[int, Collected] = {}
        self._learner_step = self._next_step = 0
        self._installed: int | None = None      # the version the sampler holds (None: unknown)
        self._sampler_idle = 0.0
        self._closed, self._error, self._end = False, None, None
        self._thread: threading.Thread | None = None

    def version_for(self, step: int) -> int:
        return max(0, step - self.max_staleness)

    def start(self, step: int, versions: list[Version], end: int | None = None) -> None:
        """Roll out steps step..end-1 (end None: no end); `versions`: those published so far that it
        needs (the learner's current one, numbered `step`, and the older ones a resumed run restored)."""
        with self._cond:
            self._learner_step = self._next_step = step
            self._end = end
            self._versions.update({v.number: v for v in versions})
        self._thread = threading.Thread(target=self._run, name="rollout-ahead", daemon=True)
        self._thread.start()

    def publish(self, version: Version) -> None:
        """The learner's weights after its step `version.number`; versions no queued rollout nor a
        checkpoint can need any more (older than version.number - K) are let go."""
        with self._cond:
            self._versions[version.number] = version
            self._learner_step = version.number
            for n in [n for n in self._versions if n < version.number - self.max_staleness]:
                del self._versions[n]
            self._cond.notify_all()

    def take(self, step: int) -> tuple[Collected, dict]:
        """Step `step`'s rollout (waiting for it) and the pipeline's metrics since the last take:
        the learner's wait, the rollout thread's wait for weights, the finished rollouts queued."""
        t0 = time.perf_counter()
        with self._cond:
            self._cond.wait_for(lambda: step in self._ready or self._error is not None)
            if self._error is not None:
                raise self._error
            got = self._ready.pop(step)
            sampler_idle, self._sampler_idle = self._sampler_idle, 0.0
            queued = len(self._ready)
        return got, {"time_learner_idle": time.perf_counter() - t0, "time_sampler_idle": sampler_idle,
                     "rollouts_queued": queued}

    def behaviour_numbers(self, step: int) -> list[int]:
        """The versions older than `step` that the rollouts of steps step..step+K-1 sample with."""
        return sorted({self.version_for(s) for s in range(step, step + self.max_staleness)} - {step})

    def behaviour_versions(self, step: int) -> list[Version]:
        """behaviour_numbers' versions: what a checkpoint at `step` keeps for its resumed run to regenerate
        the rollouts queued then."""
        with self._cond:
            return [self._versions[n] for n in self.behaviour_numbers(step) if n in self._versions]

    def version(self, number: int) -> Version | None:
        with self._cond:
            return self._versions.get(number)

    @contextlib.contextmanager
    def sampler_held(self):
        """The sampler to oneself between two rollouts (evaluation); the next rollout reloads its weights."""
        with self._sampler_lock:
            self._installed = None
            yield

    def close(self, wait: bool = True) -> None:
        """Stop after the rollout in flight (wait: until it ends; an interrupted run does not)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if wait and self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        try:
            while True:
                t0 = time.perf_counter()
                with self._cond:
                    step = self._next_step
                    need = self.version_for(step)
                    self._cond.wait_for(lambda: self._closed or need in self._versions)
                    if self._closed or (self._end is not None and step >= self._end):
                        return
                    version = self._versions[need]
                    self._sampler_idle += time.perf_counter() - t0
                with self._sampler_lock:
                    if self._installed != need:
                        self.install(version)
                        self._installed = need
                    got = self.collect(step, version)
                with self._cond:
                    self._ready[step] = got
                    self._next_step = step + 1
                    self._cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the learner's thread, which raises it
            with self._cond:
                self._error = e
                self._cond.notify_all()


# ----------------------------------------------------------------------------- the trainer's hooks

def _current_version(trainer) -> Version:
    return Version(trainer.step, copy_params(trainer.learner.params), trainer.schedule.stage)


def start(trainer, restored: list[Version] = (), end: int | None = None) -> RolloutPipeline:
    """The trainer's pipeline, rolling out from its current step up to `end` (None: no end): its
    rollouts through `Trainer._collect` on the sampler, which gets each version in the sampling layout."""
    loop = trainer.loop

    def install(version: Version) -> None:
        trainer.sampler.update_params(sampling_model(trainer.learner, trainer.mesh, trainer.sampler_mesh,
                                                     loop.sampling_dtype, params=version.params))

    def collect(step: int, version: Version) -> Collected:
        return trainer._collect(step, version.number, trainer.schedule.pools[version.stage])

    pipeline = RolloutPipeline(collect, install, loop.max_staleness)
    current = _current_version(trainer)
    pipeline.start(trainer.step, _fill(pipeline, trainer.step, list(restored), current), end)
    return pipeline


def _fill(pipeline: RolloutPipeline, step: int, restored: list[Version], current: Version) -> list[Version]:
    """`restored` and `current`, and for each older version the first rollouts need that a checkpoint
    did not keep (saved with a smaller K, or none), the next newer one's weights under its number:
    those rollouts are then less stale than their number says, never more."""
    have = {v.number: v for v in [*restored, current]}
    for n in sorted(pipeline.behaviour_numbers(step), reverse=True):
        if n not in have:
            newer = have[min(m for m in have if m > n)]
            have[n] = Version(n, newer.params, newer.stage)
    return list(have.values())


def take(trainer) -> tuple[Collected, dict]:
    """The trainer's rollout of its current step (the pipeline started on the first call)."""
    if trainer.pipeline is None:
        trainer.pipeline = start(trainer, trainer.restored_versions, trainer.end_step)
        trainer.restored_versions = []
    return trainer.pipeline.take(trainer.step)


def stop(trainer, wait: bool = True) -> None:
    """Stop the trainer's pipeline; the older versions its next rollouts would need are kept, so a
    pipeline started again (`take`) continues as this one would have."""
    if trainer.pipeline is not None:
        trainer.pipeline.close(wait)
        trainer.restored_versions = trainer.pipeline.behaviour_versions(trainer.step)
        trainer.pipeline = None


def publish(trainer, updated: bool) -> None:
    """After a step: the learner's weights as version `trainer.step` (a step that skipped its
    update publishes the weights it had, without a copy)."""
    pipeline = trainer.pipeline
    last = pipeline.version(trainer.step - 1) if not updated else None
    params = last.params if last is not None else copy_params(trainer.learner.params)
    pipeline.publish(Version(trainer.step, params, trainer.schedule.stage))


def checkpoint_items(trainer) -> tuple[dict, dict]:
    """(the checkpoint's extra items, its metadata's extra fields): the older versions the queued
    rollouts sample with, by number, and their schedule stages. ({}, {}) when there are none."""
    if trainer.pipeline is None:
        versions = [v for v in trainer.restored_versions if v.number < trainer.step]
    else:
        versions = trainer.pipeline.behaviour_versions(trainer.step)
    if not versions:
        return {}, {}
    tree = {str(v.number): v.params for v in versions}
    return ({BEHAVIOUR_ITEM: ocp.args.StandardSave(tree)},
            {"behaviour_versions": [v.number for v in versions], "behaviour_stages": [v.stage for v in versions]})


def restore_versions(trainer, step: int, meta: dict) -> list[Version]:
    """The older versions a checkpoint kept (`checkpoint_items`) that this run's K needs; a version
    it lacks (saved with a smaller K) is left out: its rollouts then sample with the oldest one
    there is, the resumed run's weights at worst, a staleness below K, never above."""
    needed = {max(0, s - trainer.loop.max_staleness) for s in range(step, step + trainer.loop.max_staleness)}
    saved = [n for n in meta.get("behaviour_versions", []) if n in needed and n < step]
    if not saved:
        return []
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, trainer.learner.params)
    tree = trainer.checkpoints.restore(step, args=ocp.args.Composite(**{BEHAVIOUR_ITEM: ocp.args.StandardRestore(
        {str(n): abstract for n in saved})}))[BEHAVIOUR_ITEM]
    stages = dict(zip(meta["behaviour_versions"], meta.get("behaviour_stages", [])))
    return [Version(n, tree[str(n)], int(stages.get(n, 0))) for n in saved]
