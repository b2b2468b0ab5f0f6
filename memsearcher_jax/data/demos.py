"""Scripted demonstrations on the synthetic world, as rollout-identical token rows.

A demonstration is what the agent loop (`agent.rollout.AgentRunner`) would record if the model
had generated the scripted text, in one workflow's format (`DemoConfig.workflow`), written down
by that workflow's `ScriptRecorder` (in its own file under agent/workflows/). MemSearcher:
one `Conversation` per turn with
    prompt   = builder.memsearcher_context(question, memory)
    response = act tokens (mask 1) + builder.observation(BM25 hits) (mask 0) + update tokens (mask 1)
and a final act `...</think>\\n\\boxed{answer}<|im_end|>`. ReAct (the baseline, also mixed in by
`DemoConfig.react_share`): ONE growing conversation with
    prompt   = builder.react_context(question)
    response = act (mask 1) + builder.react_observation(hits) (mask 0) + act (mask 1) + ... + final act
mem1: one conversation per turn holding the act only, on question + last act + last observation;
the script's memory opens each act's thinking (the internal state). memory_ops: as MemSearcher,
with the bank in the context and `<ops>ADD fact</ops>` (or UPDATE of the no-result note) as the second call.
Every format comes from the same script (same searches, flaws and answers for a given seed and
row); only the recording differs. Supervised warm-up on these rows teaches exactly the format
the loop parses (tests replay them through `AgentRunner`).

Script per question (state machine over the hops whose fact is not yet in memory):
    turn k: think briefly, search the query of the first unfound hop; the memory update keeps
            every supporting sentence found so far in the retrieved documents;
    last:   once all hops are found, answer `\\boxed{answer}`.
A multi-objective row (`objectives`: the sub-questions' rows; its question is theirs joined by
"; ") runs the hops of each objective in turn, the memory holding every objective's sentences,
and answers once with the objectives' answers joined by "; ".
Deliberate flaws (seeded, at most one per demo and, with several objectives, on one of them
drawn at random, so GRPO has something to improve):
    vague_query   the first search is vague or about the wrong entity; a recovery search follows
    wrong_answer  every hop is searched but the boxed answer is wrong
    early_answer  answers (wrongly) before every hop is found: 1-hop with no search at all,
                  2-hop right after the first hop (boxing the bridge entity), or with
                  `early_two_hop="no_search"` with no search at all, as on 1-hop questions.
                  With several objectives (`early_several`): "first_hop" searches every
                  objective and stops a 2-hop one after its first hop (a row without one gets a
                  wrong answer instead); "skip" leaves one objective unsearched, its answer a guess
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from memsearcher_jax.agent.config import episode_turns
from memsearcher_jax.agent.parsing import (
    ActKind,
)
from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.agent.trajectory import Conversation, Trajectory
from memsearcher_jax.agent.workflows import get_workflow, recorded_workflows
from memsearcher_jax.data.synthetic import objectives_of
from memsearcher_jax.errors import UserInputError
from memsearcher_jax.qa_metrics import (
    normalize_answer,
    token_f1,
)

FLAWS = ("vague_query", "wrong_answer", "early_answer")
EARLY_TWO_HOP = ("first_hop", "no_search")
EARLY_SEVERAL = ("first_hop", "skip")

# Kept to a few tokens each: the model is tiny and every token is context.
THINK_SEARCH = "I need to search."
THINK_NEXT = "Next search {e}."
THINK_RETRY = "Not found. Search again."
THINK_ANSWER = "The memory has the answer."
THINK_GUESS = "I know the answer."
THINK_NEXT_QUESTION = "Next question."
# The note a search that found nothing leaves in memory ({s}: the objective's subject), so the next
# context differs from this one. The default's wording is text the reading bases were pretrained on
# (vocab.FORMAT_LINES: 7 tokens). "{s}: no result." (FACT_SHAPED_NO_RESULT) opens with its subject as
# facts do and shares no word with a think; made for memsearcher's sampled pair updates, which closed
# the default's note with </think> (docs/lab/2026-11-29-four-designs-seed0-and-sampled-episodes.md),
# it costs the single-question default 14 points of mean gain on seeds 0-2 (its "result" splits into
# byte pieces the base never read: docs/lab/2026-11-30-default-job-after-the-no-result-note.md).
NO_RESULT_NOTE = "Nothing found about {s} yet."
FACT_SHAPED_NO_RESULT = "{s}: no result."


def no_result_note_problem(note: str) -> str | None:
    """Why `note` cannot be the no-result note (None when it can): it names the subject once, as {s}."""
    try:
        named = note.format(s="\0") if isinstance(note, str) else None
    except (KeyError, IndexError, ValueError):
        named = None
    if named is None or named.count("\0") != 1 or not named.replace("\0", "").strip():
        return (f"sft.no_result_note={note!r}: the note a search that found nothing leaves in memory must name "
                "the subject once as {s} beside some words, e.g. " + repr(NO_RESULT_NOTE))
    return None


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """The demonstrator. Defaults: the sft.* / agent.* keys' (settings/; tests/test_lower_defaults.py)."""
    vague_query_rate: float = 0.1
    wrong_answer_rate: float = 0.05
    early_answer_rate: float = 0.5
    # Share of 2-hop demos that stop after the first hop (boxing the bridge entity), drawn apart
    # from the rates above. Above 0.5 the stop is the demonstrator's habit, so the warm-started
    # policy's greedy choice too: a mistake only reward can correct (SFT would copy it).
    two_hop_early_rate: float = 0.0
    # How an early answer to a 2-hop question stops: "first_hop" right after the first hop (boxing
    # the bridge entity), "no_search" before any search (a guess, as on 1-hop questions). With
    # "no_search" every demo that searches a 2-hop question searches both hops.
    early_two_hop: str = "no_search"
    # How an early answer to several objectives stops: "first_hop" stops one 2-hop objective after
    # its first hop and boxes the bridge entity (a row of 1-hop objectives gets a wrong answer
    # instead); "skip" leaves one objective unsearched and guesses its answer, so every objective
    # that is searched has all its hops found (early_two_hop's "no_search", per objective).
    early_several: str = "first_hop"
    top_n: int = 5          # written into each tool call (the agent's default_top_n)
    max_turns: int = 5      # the agent's turn limit; every demo must fit in it
    # Turns each question after the first adds to max_turns (agent.turns_per_question): a demo of N
    # questions has episode_turns(max_turns, turns_per_question, N), as the rollout's episode has.
    turns_per_question: int = 0
    # Share of demos recorded in the ReAct workflow's format instead of `workflow`'s, drawn per
    # row apart from the flaws (0: all `workflow`, 1: all ReAct). A model meant to run both
    # workflows (bench/context.py) needs demos of both.
    react_share: float = 0.0
    workflow: str = "memsearcher"   # the format of the other demos: a workflow with a recorder
    no_result_note: str = NO_RESULT_NOTE   # left in memory by a search that found nothing; {s}: the subject

    def __post_init__(self):
        rates = (self.vague_query_rate, self.wrong_answer_rate, self.early_answer_rate)
        if any(r < 0 for r in rates) or sum(rates) > 1:
            raise ValueError(f"flaw rates must be >= 0 and sum to <= 1, got {rates}")
        if not 0 <= self.two_hop_early_rate <= 1:
            raise ValueError(f"two_hop_early_rate must be in [0, 1], got {self.two_hop_early_rate}")
        if not 0 <= self.react_share <= 1:
            raise ValueError(f"react_share must be in [0, 1], got {self.react_share}")
        if self.early_two_hop not in EARLY_TWO_HOP:
            raise ValueError(f"early_two_hop must be one of {EARLY_TWO_HOP}, got {self.early_two_hop!r}")
        if self.early_several not in EARLY_SEVERAL:
            raise ValueError(f"early_several must be one of {EARLY_SEVERAL}, got {self.early_several!r}")
        if self.top_n < 1:
            raise ValueError(f"top_n must be >= 1, got {self.top_n}")
        if why := no_result_note_problem(self.no_result_note):
            raise ValueError(why)
        if self.workflow not in recorded_workflows():
            raise ValueError(f"workflow must be one of the recorded formats {recorded_workflows()}, "
                             f"got {self.workflow!r}")
        if self.max_turns < 4:  # 2 hops + a recovery search + the answer
            raise ValueError(f"max_turns must be >= 4 for the scripts, got {self.max_turns}")
        if self.turns_per_question < 0:
            raise ValueError(f"turns_per_question must be >= 0, got {self.turns_per_question}")


@dataclasses.dataclass
class Demonstration:
    """A scripted episode: the trajectory (rows as the rollout builds them) and what was intended."""

    trajectory: Trajectory
    row: dict
    flaw: str | None                 # one of FLAWS or None for a clean demo
    act_kinds: list[ActKind]         # intended kind of each turn's act
    memories: list[str]              # intended memory after each searching turn (ReAct: none kept, [])
    answer: str                      # the boxed answer
    workflow: str = "memsearcher"    # the recording format: a workflow with a recorder
    answers: list[str] = dataclasses.field(default_factory=list)  # per objective, in order

    @property
    def correct(self) -> bool:
        """Whether the scripted answer is a gold answer (reward 1.0 expected)."""
        return self.flaw not in ("wrong_answer", "early_answer")

    @property
    def conversations(self) -> list[Conversation]:
        return self.trajectory.conversations


def _wrong_answer_pool(rows: Sequence[dict]) -> dict[str, list[str]]:
    """First gold answer of every row, by relation: wrong answers of the right type."""
    pool: dict[str, list[str]] = {}
    for r in rows:
        pool.setdefault(r["relation"], [])
        if r["golden_answers"][0] not in pool[r["relation"]]:
            pool[r["relation"]].append(r["golden_answers"][0])
    return pool


def _pick_wrong(rng: random.Random, candidates: Sequence[str], golds: Sequence[str]) -> str:
    """A candidate with zero token F1 against every gold; falls back to a fixed non-answer."""
    options = [c for c in candidates if token_f1(c, golds) == 0.0 and normalize_answer(c)]
    return rng.choice(options) if options else "unknown"


def _vague_query(rng: random.Random, row: dict, all_rows: Sequence[dict]) -> str:
    """Either the hop-1 query without its entity name, or the same relation about another entity."""
    q = row["queries"][0]
    if rng.random() < 0.5:
        words = [w for w in q.split() if w != row["subject"]]
        if words:
            return " ".join(words)
    others = [r for r in all_rows if r["subject"] != row["subject"]]
    other = rng.choice(others) if others else row
    return q.replace(row["subject"], other["subject"]) if other is not row else "information"


class DemoScriptError(UserInputError):
    """The demonstrator cannot script a question with this retriever or these turns."""


def make_demonstrations(world_rows: Sequence[dict], builder: PromptBuilder, retriever, seed: int = 0,
                        config: DemoConfig | None = None) -> list[Demonstration]:
    """One scripted demonstration per question row (synthetic-world rows with `queries`, `facts`;
    a multi-objective row carries them per sub-question under `objectives`).

    The retriever is searched for real (one batched call per script step), so observations are
    what the agent would see; memories only keep supporting sentences that the hits contain.
    Demos are recorded in `config.workflow`'s format, except a share `config.react_share`
    (drawn per row, apart from the flaws) recorded in the ReAct workflow's format; the format
    changes nothing else about a demo.
    """
    cfg = config or DemoConfig()
    all_objectives = [o for row in world_rows for o in objectives_of(row)]
    pool = _wrong_answer_pool(all_objectives)
    demos: list[Demonstration] = []
    for i, row in enumerate(world_rows):
        for key in ("question", "golden_answers"):
            if key not in row:
                raise ValueError(f"row {i} ({row.get('id', '?')}) lacks {key!r}; expected a synthetic-world "
                                 "question row")
        for o in objectives_of(row):
            for key in ("hops", "facts", "queries", "relation", "subject", "golden_answers"):
                if key not in o:
                    raise ValueError(f"row {i} ({row.get('id', '?')}) lacks {key!r}; expected a synthetic-world "
                                     "question row (or objectives of such rows)")
        # One generator per row: demo i depends only on (seed, i, row), not on the other rows.
        rng = random.Random(f"{seed}:{i}")
        u = rng.random()
        flaw = None
        edges = [cfg.vague_query_rate, cfg.vague_query_rate + cfg.wrong_answer_rate,
                 cfg.vague_query_rate + cfg.wrong_answer_rate + cfg.early_answer_rate]
        for name, edge in zip(FLAWS, edges):
            if u < edge:
                flaw = name
                break
        if cfg.two_hop_early_rate > 0 and int(objectives_of(row)[-1]["hops"]) == 2:
            early = rng.random() < cfg.two_hop_early_rate
            flaw = "early_answer" if early else (None if flaw == "early_answer" else flaw)
        # The format draw has its own generator, so the script (and its rng) is the same either way.
        react = cfg.react_share > 0 and random.Random(f"{seed}:{i}:workflow").random() < cfg.react_share
        demos.append(_script(row, i, flaw, builder, retriever, rng, pool, all_objectives, cfg,
                             workflow="react" if react else cfg.workflow))
    return demos


def _searched_think(first: bool, retry: bool, hop: int, objective: dict) -> str:
    if first:
        return THINK_SEARCH
    if retry:
        return THINK_RETRY
    return THINK_NEXT_QUESTION if hop == 0 else THINK_NEXT.format(e=objective["intermediate"])


def _script(row, idx, flaw, builder, retriever, rng, pool, all_objectives, cfg: DemoConfig,
            workflow: str = "memsearcher") -> Demonstration:
    """The state machine of the module docstring, objective after objective; then one answer."""
    objs = objectives_of(row)
    # The episode's budget and subjects, as AgentRunner.run gives them (the hint line reads both).
    budget = episode_turns(cfg.max_turns, cfg.turns_per_question, len(objs))
    traj = Trajectory(traj_id=idx, group_id=idx, question=row["question"], golds=list(row["golden_answers"]),
                      max_turns=budget, subjects=[o["subject"] for o in objs])
    tb = get_workflow(workflow).recorder(builder, traj)
    turns_needed = sum(int(o["hops"]) for o in objs) + 1
    if flaw == "vague_query" and turns_needed + 1 > budget:
        flaw = None  # no room for the recovery search (only with several objectives: 1 takes <= 4 turns)
    # Which objective the flaw hits (a single-objective row draws nothing, so its demo is unchanged).
    target = rng.randrange(len(objs)) if flaw and len(objs) > 1 else len(objs) - 1
    several = len(objs) > 1
    # An early answer stops one hop short and boxes the bridge ("first_hop"), or guesses before any
    # search of its objective ("no_search" / "skip"): early_several with several objectives.
    stop_short = cfg.early_several == "first_hop" if several else cfg.early_two_hop == "first_hop"
    if flaw == "early_answer" and several and stop_short:
        # "first_hop": every objective is searched before the answer; answering early stops a
        # 2-hop objective after its first hop (boxing the bridge entity). A row of 1-hop
        # objectives has no hop to stop short of: its flaw is a wrong answer instead. ("skip":
        # the drawn objective, of any kind, is not searched and its answer is a guess.)
        two_hop = [k for k, o in enumerate(objs) if int(o["hops"]) == 2]
        if two_hop:
            target = two_hop[target % len(two_hop)]
        else:
            flaw = "wrong_answer"
    found: list[str] = []       # supporting sentences in memory, in search order
    kinds: list[ActKind] = []
    memories: list[str] = []
    retry = False

    def next_turn() -> Conversation:
        if len(kinds) >= budget:
            raise DemoScriptError(f"row {row.get('id', idx)}: script did not answer within {budget} turns "
                                  f"({len(objs)} objectives); raise agent.max_turns or agent.turns_per_question")
        return tb.new_turn()

    for oi, o in enumerate(objs):
        tb.next_question(oi, o["question"])
        facts, hop = list(o["facts"]), 0
        hops = int(o["hops"])
        if flaw == "early_answer" and oi == target:  # stops one hop short, or before any search
            hops = hops - 1 if stop_short else 0
        vague_pending = flaw == "vague_query" and oi == target
        while hop < hops:
            conv = next_turn()
            think = _searched_think(not kinds, retry, hop, o)
            query = _vague_query(rng, o, all_objectives) if vague_pending else o["queries"][hop]
            tb.act(conv, think, builder.tool.call_text(query, cfg.top_n))
            kinds.append(ActKind.TOOL_CALLS)
            hits = retriever.search([query], cfg.top_n)[0][: cfg.top_n]
            text = " ".join(h.contents for h in hits)
            new_fact = facts[hop] if facts[hop] in text else None
            if new_fact is None and not vague_pending:
                raise DemoScriptError(f"row {row.get('id', idx)}: query {query!r} did not retrieve the hop-{hop + 1} "
                                      f"fact {facts[hop]!r}; the world's queries must retrieve their passages (the "
                                      "retriever must serve the synthetic world's corpus)")
            if new_fact is not None:
                found.append(new_fact)
                hop += 1
            retry, vague_pending = new_fact is None, False
            # A search that found nothing leaves a note, so the next context differs from this one.
            note = "" if new_fact else cfg.no_result_note.format(s=o["subject"])
            memory = " ".join(found + [note] if note else found)
            traj.queries.append(query)  # before the observation: the next hint line counts this search
            tb.observe_and_update(conv, hits, memory, new_fact, note)
            memories.append(memory)
    answers = [_scripted_answer(o, flaw if oi == target else None, rng, pool, stop_short) for oi, o in enumerate(objs)]
    answer = "; ".join(answers)
    conv = next_turn()
    tb.act(conv, THINK_ANSWER if found else THINK_GUESS, f"\\boxed{{{answer}}}")
    kinds.append(ActKind.ANSWER)
    traj.finish("answer")
    return Demonstration(trajectory=traj, row=row, flaw=flaw, act_kinds=kinds, answer=answer, workflow=workflow,
                         memories=tb.recorded_memories(memories), answers=answers)


def _scripted_answer(o: dict, flaw: str | None, rng: random.Random, pool: dict, bridge: bool = True) -> str:
    """The gold answer, or for a wrong or early answer one with zero F1 against the golds."""
    if flaw not in ("wrong_answer", "early_answer"):
        return o["golden_answers"][0]
    early = flaw == "early_answer"
    # An early 2-hop answer after the first hop boxes the bridge entity (the classic
    # stop-one-hop-short error); one before any search (bridge=False) guesses a value.
    cands = [o["intermediate"]] if early and bridge and o.get("intermediate") else pool.get(o["relation"], [])
    answer = _pick_wrong(rng, cands, o["golden_answers"])
    if answer == "unknown" and early:
        answer = _pick_wrong(rng, pool.get(o["relation"], []), o["golden_answers"])
    return answer


def demo_conversations(demos: Sequence[Demonstration]) -> list[Conversation]:
    return [c for d in demos for c in d.conversations]


def demo_stats(demos: Sequence[Demonstration]) -> dict:
    """Token counts per conversation (prompt + response) and flaw fractions, for reports."""
    lens = [len(c.prompt_ids) + len(c.response_ids) for c in demo_conversations(demos)]
    n = max(1, len(demos))
    return {
        "demos": len(demos), "conversations": len(lens),
        "mean_tokens": sum(lens) / max(1, len(lens)), "max_tokens": max(lens, default=0),
        "trained_tokens": sum(sum(c.loss_mask) for c in demo_conversations(demos)),
        **{f"frac_{f}": sum(d.flaw == f for d in demos) / n for f in FLAWS},
        "frac_react": sum(d.workflow == "react" for d in demos) / n,
    }
