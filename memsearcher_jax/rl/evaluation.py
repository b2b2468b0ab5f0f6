"""Greedy evaluation of a turn loop: one episode per question, scored as training scores them
(the held-out EM before and after GRPO, every train.eval_every steps, and `eval`)."""
from __future__ import annotations

import numpy as np

from memsearcher_jax.agent.rollout import AgentRunner, Trajectory
from memsearcher_jax.rl.grpo import score_trajectories
from memsearcher_jax.token_metrics import trajectory_token_metrics


def evaluate(runner: AgentRunner, questions: list[dict], batch: int = 64, seed: int = 0) -> dict:
    """Greedy episodes; EM / F1 / reward means and the context they used (token_metrics:
    peak_tokens, tokens_per_question, searches, turns, prompt_tokens_by_turn).

    Question i is group i and trajectory i in every batch (ids unique across batches, as
    AgentRunner.run asks: each trajectory samples from its own id)."""
    trajs: list[Trajectory] = []
    for i in range(0, len(questions), batch):
        trajs += runner.run(questions[i:i + batch], group_size=1, seed=seed, first_group_id=i, first_traj_id=i)
    results = score_trajectories(trajs)
    mean = lambda xs: float(np.mean(xs)) if len(xs) else 0.0
    return {
        "em": mean([r.em for r in results]), "f1": mean([r.f1 for r in results]),
        "reward": mean([r.reward for r in results]), "format_ok": mean([r.format_ok for r in results]),
        "turns": mean([len(t.context_tokens) for t in trajs]),
        **trajectory_token_metrics(trajs),
        "trajectories": trajs,
        "results": results,
    }
