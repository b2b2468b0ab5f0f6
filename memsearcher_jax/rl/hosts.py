"""Verdicts every host of a multi-host step must reach alike: one host that stops (or skips) on its
own counts leaves the others waiting in the update's collectives until a deadline kills them."""
from __future__ import annotations

import dataclasses

import numpy as np

from memsearcher_jax.agent.rollout import RolloutStats
from memsearcher_jax.runtime import distributed


def all_hosts_search_stats(stats: RolloutStats, counts: np.ndarray, said: list[str]) -> RolloutStats:
    """This host's stats with every host's searches and failures summed (counts [hosts, 2], in
    process order) and the first retriever error any host recorded: the same on every host."""
    return dataclasses.replace(stats, searches=int(counts[:, 0].sum()), search_errors=int(counts[:, 1].sum()),
                               last_search_error=next((s for s in said if s), ""))


def check_search_errors(stats: RolloutStats, num_hosts: int) -> None:
    """SearchFailuresError when more than the allowed share of the step's searches failed, counted
    over every host (a collective: every host calls it), so all hosts stop with one message or none."""
    if num_hosts > 1:
        counts, said = distributed.allgather_ints_and_text([stats.searches, stats.search_errors],
                                                           stats.last_search_error)
        stats = all_hosts_search_stats(stats, counts, said)
    stats.check_search_errors()
