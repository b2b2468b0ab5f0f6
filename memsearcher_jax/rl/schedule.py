"""GRPO's training questions step by step: the data order (`batch_for_step`) and the schedule of
question counts (`QuestionSchedule`, `world.objectives_schedule`; docs/method.md §5).

A schedule is a list of stages, each a pool of training questions (the synthetic world's questions
asked several at once, at the stage's counts in equal shares; experiment.py builds the pools). Stage
k runs from step `starts[k]` at the latest; with `advance_em` > 0 it also ends as soon as the mean
training EM of its last `window` steps reaches advance_em (never before it ran `window` steps). Stages
only move forward. Without a schedule there is one pool and nothing here changes a step.

The stage is the trainer's state between steps: every checkpoint's metadata holds it (`state`) and a
resumed run restores it (`restore`), so the resumed run picks the same stage, and with it the same
questions, as the uninterrupted one. A stage reached by step alone is a function of the step.
"""
from __future__ import annotations

import bisect
import dataclasses

import jax
import numpy as np
from jax.experimental import multihost_utils


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


@dataclasses.dataclass
class QuestionSchedule:
    """The training questions' pool at each stage (`questions`: the current one). pools[k] is stage
    k's; starts[k] the step it begins at the latest (starts[0] = 0); counts[k] its question counts
    (for the metrics only). advance_em > 0: a stage also ends once its last `window` steps' mean
    training EM reaches it. `stage` and `recent` (those EMs) are the state a checkpoint keeps."""

    pools: tuple[list[dict], ...]
    starts: tuple[int, ...] = (0,)
    counts: tuple[tuple[int, ...], ...] = ()
    advance_em: float = 0.0
    window: int = 5
    stage: int = 0
    recent: list[float] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        starts = list(self.starts)
        if len(starts) != len(self.pools) or not starts or starts[0] != 0 or starts != sorted(set(starts)):
            raise ValueError(f"a schedule needs one increasing start step per pool, the first 0; got {starts} "
                             f"for {len(self.pools)} pools")
        if self.window < 1 or not 0 <= self.advance_em <= 1:
            raise ValueError(f"window must be >= 1 and advance_em in [0, 1], got {self.window}, {self.advance_em}")

    @classmethod
    def fixed(cls, questions: list[dict]) -> QuestionSchedule:
        """One pool throughout: no schedule."""
        return cls(pools=(questions,))

    @property
    def active(self) -> bool:
        return len(self.pools) > 1

    @property
    def questions(self) -> list[dict]:
        return self.pools[self.stage]

    def stage_of_step(self, step: int) -> int:
        """The stage `step` runs in by the start steps alone."""
        return bisect.bisect_right(self.starts, step) - 1

    def observe(self, next_step: int, em: float) -> dict:
        """After a step: `em` its training EM (this host's; averaged over the hosts here, a collective
        every host makes alike), `next_step` the step to run next. Moves to the stage next_step runs
        in and returns the finished step's metrics ({} without a schedule)."""
        if not self.active:
            return {}
        ran = self.stage
        if self.advance_em > 0:
            self.recent = (self.recent + [_mean_over_hosts(em)])[-self.window:]
        ready = self.advance_em > 0 and len(self.recent) == self.window and np.mean(self.recent) >= self.advance_em
        new = min(max(self.stage_of_step(next_step), self.stage + int(ready)), len(self.pools) - 1)
        if new != self.stage:
            self.stage, self.recent = new, []
        metrics = {"schedule_stage": ran}
        if self.counts:
            metrics["schedule_questions_max"] = max(self.counts[ran])
        return metrics

    def state(self) -> dict:
        """What a checkpoint's metadata keeps ({} without a schedule)."""
        return {"schedule_stage": self.stage, "schedule_recent": list(self.recent)} if self.active else {}

    def restore(self, meta: dict) -> None:
        """The state a checkpoint's metadata kept; a checkpoint without it (written before the
        schedule was set) resumes at the stage its step gives."""
        if self.active:
            saved = int(meta.get("schedule_stage", 0))
            self.stage = min(max(saved, self.stage_of_step(int(meta.get("step", 0)))), len(self.pools) - 1)
            self.recent = [float(x) for x in meta.get("schedule_recent", [])] if self.stage == saved else []


def _mean_over_hosts(x: float) -> float:
    """The mean of every host's `x` (each host's mean over an equal share of the step's trajectories)."""
    if jax.process_count() == 1:
        return float(x)
    return float(np.mean(multihost_utils.process_allgather(np.asarray(x, np.float64))))
