"""Demonstrations with their entity names swapped for names no question asks about (`sft.name_swap_rate`).

In a reading vocabulary every name is one token, and the warm start's demonstrations are about the
world's training entities only. SFT can then learn to write those names rather than copy the name in
front of it: the 450-step memsearcher warm start searched "Negin makes" for "What does Pebacorp make?",
a held-out pair (docs/lab/2026-11-29-memsearcher-worse-at-pairs.md). Swapping, per demonstration and
consistently across its turns, every world name for a reserved name of the same type that the world
never uses keeps the demonstration's logic (question, query, document, memory and answer still agree)
and leaves a name nothing to do but be copied. Held-out names are never drawn: the substitutes are
the vocabulary's reserved names outside the world.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
from collections.abc import Iterable, Sequence

from memsearcher_jax.agent.rollout import Conversation
from memsearcher_jax.data.vocab import ReadingVocab


@dataclasses.dataclass(frozen=True)
class NameTable:
    """The world's name tokens (id -> type) and the substitutes per type (ids no world entity has)."""

    world: dict[int, str]
    free: dict[str, list[int]]

    @classmethod
    def build(cls, names: dict[str, dict[str, list[str]]], ids: dict[str, int],
              world_names: Iterable[str]) -> NameTable:
        """names: a reading vocabulary's type -> {"pretrain", "reserved"} pools; ids: name -> token id;
        world_names: every entity of the world (training and held-out)."""
        in_world = set(world_names)
        world, free = {}, {}
        for kind, pools in names.items():
            every = list(pools.get("pretrain", ())) + list(pools.get("reserved", ()))
            world.update({ids[n]: kind for n in every if n in in_world})
            free[kind] = [ids[n] for n in pools.get("reserved", ()) if n not in in_world]
        return cls(world=world, free=free)


def world_name_table(tokenizer_dir: str, world_dir: str) -> NameTable:
    """The table of a synthetic world (its entities.json in `world_dir`) against the reading
    vocabulary in `tokenizer_dir`: the world's names and the vocabulary's unused reserved names."""
    vocab = ReadingVocab.load(tokenizer_dir)
    with open(os.path.join(world_dir, "entities.json"), encoding="utf-8") as f:
        entities = json.load(f)["entities"]
    return NameTable.build(vocab.names, vocab.ids, entities)


def swap_names(conversations: Sequence[Conversation], table: NameTable, rng: random.Random) -> list[Conversation]:
    """One demonstration's conversations with each world name replaced by a distinct free name of its
    type; one mapping for the whole demonstration, so a name keeps its substitute across turns. Loss
    masks, lengths and every other token stay as they were."""
    present: dict[str, list[int]] = {}
    for tok in sorted({t for c in conversations for t in (*c.prompt_ids, *c.response_ids) if t in table.world}):
        present.setdefault(table.world[tok], []).append(tok)
    mapping = {}
    for kind, toks in present.items():
        pool = table.free.get(kind, [])
        if len(toks) > len(pool):
            raise ValueError(f"a demonstration names {len(toks)} {kind} entities but only {len(pool)} free {kind} "
                             "names are left in the vocabulary's reserved pool")
        mapping.update(zip(toks, rng.sample(pool, len(toks))))
    return [dataclasses.replace(c, prompt_ids=[mapping.get(t, t) for t in c.prompt_ids],
                                response_ids=[mapping.get(t, t) for t in c.response_ids])
            for c in conversations]


def name_swapped_conversations(demos: Sequence, table: NameTable, rate: float, seed: int) -> list[Conversation]:
    """Every demonstration's conversations (as `demo_conversations`), a `rate` share of the
    demonstrations (drawn per demonstration, from `seed`) with their names swapped."""
    if not 0 <= rate <= 1:
        raise ValueError(f"name swap rate must be in [0, 1], got {rate}")
    choose, draw = random.Random(seed), random.Random(seed + 1)  # which demos apart from their substitutes
    out: list[Conversation] = []
    for demo in demos:
        swap = choose.random() < rate
        out += swap_names(demo.conversations, table, draw) if swap else list(demo.conversations)
    return out
