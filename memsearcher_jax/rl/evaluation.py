"""Greedy evaluation of a turn loop: one episode per question, scored as training scores them
(the held-out EM before and after GRPO, every train.eval_every steps, and `eval`), with the
context it used and, on the synthetic world's questions, how much of the task it searched
(`coverage_metrics`)."""
from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from memsearcher_jax.agent.rollout import AgentRunner, Trajectory
from memsearcher_jax.rl.grpo import score_trajectories
from memsearcher_jax.rl.token_metrics import trajectory_token_metrics

COVERAGE_KEYS = ("coverage", "hop_coverage", "searches_per_question", "hops_per_question", "searches_per_hop",
                 "early_answer_rate", "passages", "passages_max")


def evaluate(runner: AgentRunner, questions: list[dict], batch: int = 64, seed: int = 0) -> dict:
    """Greedy episodes; EM / F1 / reward means and the context they used (token_metrics:
    peak_tokens, tokens_per_question, searches, turns, prompt_tokens_by_turn); passages and
    passages_max (returned by the searches: what react's history holds); and where every question
    names its subject (the synthetic world's), the coverage keys (`coverage_metrics`).

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
        "passages": mean([t.passages for t in trajs]),
        "passages_max": float(max((t.passages for t in trajs), default=0)),
        **coverage_metrics(trajs, questions),
        "trajectories": trajs,
        "results": results,
    }


def mentions(query: str, entity: str) -> bool:
    """Whether a search query names an entity: its name as a whole word, any case ("Bolin" in
    "bolin born year", not in "Bolinar")."""
    return bool(entity) and re.search(rf"(?<!\w){re.escape(entity)}(?!\w)", query, re.IGNORECASE) is not None


def coverage_metrics(trajs: Sequence[Trajectory], questions: Sequence[dict]) -> dict[str, float]:
    """How much of each task the episodes searched (issue 83), episode i answering questions[i]:

    - coverage: the share of questions searched, over every question of every episode; a question
      (an objective of a "q1; q2" task) counts as searched when some search query of its episode
      names its subject entity (`mentions`);
    - hop_coverage: the same over hops, a 2-hop question's second hop searched when a query names
      its bridge entity (the entity its first passage leads to);
    - searches_per_question and hops_per_question: an episode's searches and the hops its questions
      need, each over its question count, averaged over episodes; searches_per_hop: all searches
      over all hops needed (1: one search per hop, as the demonstrator does);
    - early_answer_rate: the share of episodes that answered while a question was still unsearched.

    {} unless every question names its subject ("subject" and "hops": the synthetic world's rows,
    `objectives` for several at once): a data set without them has nothing to count against."""
    tasks = [list(q.get("objectives", [q])) for q in questions]
    if not tasks or not all("subject" in o and "hops" in o for task in tasks for o in task):
        return {}
    searched, hops_found, per_question, hops_needed, early = [], [], [], [], []
    for t, task in zip(trajs, tasks):
        found = [any(mentions(q, o["subject"]) for q in t.queries) for o in task]
        searched += found
        for o in task:
            entities = [o["subject"]] + ([o.get("intermediate", "")] if o["hops"] >= 2 else [])
            hops_found += [any(mentions(q, e) for q in t.queries) for e in entities]
        per_question.append(t.num_searches / len(task))
        hops_needed.append(sum(o["hops"] for o in task))
        early.append(t.end_reason == "answer" and not all(found))
    searches = sum(t.num_searches for t in trajs)
    return {"coverage": float(np.mean(searched)), "hop_coverage": float(np.mean(hops_found)),
            "searches_per_question": float(np.mean(per_question)),
            "hops_per_question": float(np.mean([h / len(task) for h, task in zip(hops_needed, tasks)])),
            "searches_per_hop": searches / max(sum(hops_needed), 1), "early_answer_rate": float(np.mean(early))}
