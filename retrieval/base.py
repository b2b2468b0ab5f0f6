"""The interface between the agent and any retriever (in process or over HTTP)."""
from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

ERROR_HIT_ID = "__error__"


@dataclasses.dataclass(frozen=True)
class Hit:
    """One retrieved passage. `contents` is `title\\ntext` (wiki-18 format)."""

    id: str
    contents: str
    score: float = 0.0


@runtime_checkable
class Retriever(Protocol):
    """Batched search: one call for all live trajectories of a turn.

    `search(queries, top_n)` returns one list of at most `top_n` hits per query, best first.
    A retriever used in a rollout never raises because search failed: a failed query gets a
    single `Hit(id=ERROR_HIT_ID, contents="<error message>")`, which the agent shows the model
    as the observation.
    """

    def search(self, queries: list[str], top_n: int) -> list[list[Hit]]: ...


def hits_wanted(top_n: int, num_docs: int) -> int:
    """How many hits a search returns per query: min(top_n, num_docs). ValueError for
    top_n < 1 (every retriever checks its input the same way)."""
    if top_n < 1:
        raise ValueError(f"top_n={top_n}; expected >= 1")
    return min(top_n, num_docs)
