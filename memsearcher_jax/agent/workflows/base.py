"""The workflow interface and its registry (docs/method.md §1, §8).

A workflow says, for one trajectory, what a turn's context is, what the model's calls mean,
what carries to the next turn and when the episode ends. The batched turn loop that drives
every workflow (one act call for all live rows, one batched retriever call, one second call
where the workflow has one) is shared: `agent.rollout.AgentRunner`.

One turn, as the loop runs it for each live trajectory `t`:
    wf.open_turn(t, turn)          the act's conversation is t.final; its prompt + response so far
                                   is the act call's context
    act call                       (shared) recorded on t.final; an answer, an invalid act or a
                                   bad stop ends the episode
    wf.observe(t, hits)            after the batched search: what the observation adds, and where
    second call (if wf.second_call) (shared) prompt = t.final's prompt + response so far;
    wf.after_second(t, text)       what the second call's text carries to the next turn (or ends)

Adding a workflow: one file here with a `Workflow` subclass decorated `@register`, plus its
tests. `agent.workflow=<name>` then selects it. For a warm start (the scripted demonstrator,
data/demos.py) the same file gives its `ScriptRecorder` subclass as the workflow's `recorder`:
how a scripted episode is written down in this workflow's format. (The benches that compare the
designs, bench/paper_tables.py and its targets, name the ones they compare.)
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from memsearcher_jax.agent.trajectory import ACT, SECOND, Conversation, Trajectory

if TYPE_CHECKING:  # the prompt builder and the hits, for annotations only
    from memsearcher_jax.agent.prompts import PromptBuilder
    from retrieval.base import Hit

_REGISTRY: dict[str, Workflow] = {}


class AgentBudgets(Protocol):
    """What a workflow reads of the agent's config: the loop hands its `AgentConfig`
    (agent/config.py, which checks its workflow against this registry), the planner the config
    file's agent section."""

    max_turns: int
    max_new_tokens: int
    max_response_tokens: int
    max_context_tokens: int
    max_observation_tokens: int
    memory_budget: int


# The least an observation may hold: the bare message markup and its longest instruction (memory_ops'
# full-style one is 110 tokens with the shipped base's tokenizer), so a cap is never below what
# `PromptBuilder.fit_tool_message` must return whatever the documents.
MIN_OBSERVATION_TOKENS = 128


def observation_cap(cfg: AgentBudgets) -> int:
    """Tokens one observation may add to a row, its markup, notes and refusals included
    (`PromptBuilder.fit_tool_message` holds it there; a cut says so): agent.max_observation_tokens,
    or max_response_tokens where that is 0."""
    return max(cfg.max_observation_tokens or cfg.max_response_tokens, MIN_OBSERVATION_TOKENS)


class ScriptRecorder:
    """Writes a scripted episode (the demonstrator's, data/demos.py) into a trajectory turn by
    turn, exactly as AgentRunner records a sampled episode of this workflow. The script decides
    what to search, what was found and what to answer; the recorder decides only the format.

    A subclass gives `new_turn` (the conversation this turn's act extends) and
    `observe_and_update` (the search's observation and what carries to the next turn); `act`,
    `act_text` and `second` are shared."""

    def __init__(self, builder: PromptBuilder, traj: Trajectory):
        self.b, self.t = builder, traj

    def _enc(self, text: str) -> list[int]:
        return self.b.encode(text) + [self.b.eos_id]

    def new_conversation(self, prompt_ids: list[int]) -> Conversation:
        """A new conversation on `prompt_ids` for the next turn (Workflow.new_conversation's
        counterpart: the turn is the number of conversations so far)."""
        conv = Conversation(prompt_ids=prompt_ids, traj_id=self.t.traj_id, group_id=self.t.group_id,
                            turn=len(self.t.conversations))
        self.t.conversations.append(conv)
        return conv

    @property
    def turn(self) -> int:
        return len(self.t.context_tokens)

    def new_turn(self) -> Conversation:
        raise NotImplementedError

    def act_text(self, think: str, action: str) -> str:
        return f"{think}</think>\n{action}"

    def act(self, conv: Conversation, think: str, action: str) -> None:
        ids = self._enc(self.act_text(think, action))
        self.t.record_call(ACT, self.turn, len(conv.prompt_ids) + len(conv.response_ids), len(ids))
        conv.add_generated(ids, [0.0] * len(ids))
        conv.blocks.append(self.b.decode_act(ids))
        conv.ended_with_eos = True

    def second(self, conv: Conversation, observation: list[int], text: str) -> None:
        """The observation (masked), then the second call's text as if generated."""
        conv.add_injected(observation)
        ids = self._enc(text)
        self.t.record_call(SECOND, self.turn - 1, len(conv.prompt_ids) + len(conv.response_ids), len(ids))
        conv.add_generated(ids, [0.0] * len(ids))
        conv.blocks.append(self.b.decode_update(ids))
        conv.ended_with_eos = True

    def next_question(self, index: int, question: str) -> None:
        """The script turns to question `index` (from 0) of the task, whose text is `question`, before
        its first search: a design that works a question at a time (fold's branches) marks it here."""

    def observe_and_update(self, conv: Conversation, hits, memory: str, new_fact: str | None, note: str) -> None:
        """After a search: `hits` observed; `memory` is the script's memory so far (its found
        sentences and note), `new_fact` the sentence this search found (or None), `note` the
        no-result note (or "")."""
        raise NotImplementedError

    def recorded_memories(self, script_memories: list[str]) -> list[str]:
        """The memories the demonstration reports (its check compares them): the script's."""
        return script_memories


class Workflow:
    """One workflow. Instances hold no per-episode data: that lives on the Trajectory
    (`t.memory`, `t.memories`, `t.memory_tokens`, `t.state`)."""

    name: ClassVar[str] = ""
    second_call: ClassVar[bool] = False   # whether a searching turn makes a second generation call
    recorder: ClassVar[type[ScriptRecorder] | None] = None  # its scripted format (None: no demos)

    def carried_tokens(self, cfg: AgentBudgets) -> int:
        """At most how many tokens a turn's context carries beyond the system prompt and the
        question (the planner's bound on a prompt).
        0 when what grows is the response (react)."""
        return 0

    def response_tokens(self, cfg: AgentBudgets) -> int:
        """At most how many tokens one conversation's response holds: here one turn's act, its
        observation and the second call, if any (a workflow whose conversation spans several turns,
        or keeps its observation out of the response, says so)."""
        return cfg.max_new_tokens * (2 if self.second_call else 1) + observation_cap(cfg)

    def row_tokens(self, cfg: AgentBudgets, prompt: int) -> int:
        """The longest training row a conversation on a `prompt`-token context can make (the
        planner's bound): the prompt and `response_tokens`, and never more than generation allows,
        which stops at max_context_tokens and max_response_tokens (at least one token is given),
        after which one observation may still come."""
        stop = max(min(cfg.max_context_tokens, prompt + cfg.max_response_tokens), prompt + 1)
        return min(prompt + self.response_tokens(cfg), stop + observation_cap(cfg))

    def start(self, t: Trajectory, b: PromptBuilder, cfg: AgentBudgets) -> None:
        """Before the first turn."""

    def open_turn(self, t: Trajectory, turn: int, b: PromptBuilder, cfg: AgentBudgets) -> None:
        """Make `t.final` the conversation this turn's act extends (a new one, or the same)."""
        raise NotImplementedError

    def carried_span(self, t: Trajectory, b: PromptBuilder, cfg: AgentBudgets) -> tuple[int, int]:
        """Where this turn's act prompt (`t.final`'s prompt + response so far, as the turn opens)
        holds what earlier turns carried into it, [start, end): the span where it differs from the
        first turn's prompt, whose frame (system prompt, question, chat markup) every turn shares.
        memsearcher: the memory; mem1: the last act and its observation; memory_ops: the bank (and
        its error lines); react: every act and observation so far. Empty on the first turn. The loop
        records it on every opened turn (`Trajectory.carried`); rl/information.py scores it. This
        turn's hint line (`turn_hint`, which ends the user message the act reads) is the loop's
        instruction, not something carried: the span stops before it. A workflow whose frame
        changes from turn to turn otherwise overrides this."""
        now = t.final.prompt_ids + t.final.response_ids
        start, end = differing_span(t.conversations[0].prompt_ids, now)
        hint = turn_hint(b, t, t.turns)
        if hint and start < end:
            ids = b.encode_plain(hint)
            at = next((i for i in range(len(now) - len(ids), start - 1, -1) if now[i:i + len(ids)] == ids), end)
            end = min(end, at)
        return start, end

    def act_budget(self, t: Trajectory, cfg: AgentBudgets) -> int:
        """New tokens the act may write; below 1 the episode ends ("response_budget")."""
        conv = t.final
        used = len(conv.prompt_ids) + len(conv.response_ids)
        return min(cfg.max_new_tokens, cfg.max_response_tokens - len(conv.response_ids),
                   cfg.max_context_tokens - used)

    def observe(self, t: Trajectory, results: Sequence[Sequence[Hit]], b: PromptBuilder,
                cfg: AgentBudgets) -> None:
        """The search results of this turn's calls (one hit list per call)."""
        raise NotImplementedError

    def after_second(self, t: Trajectory, text: str, b: PromptBuilder, cfg: AgentBudgets) -> None:
        """The decoded second call (it ended on a stop token): carry its content or end the episode."""
        raise NotImplementedError(f"workflow {self.name!r} makes no second call")

    @staticmethod
    def new_conversation(t: Trajectory, prompt_ids: list[int], turn: int) -> Conversation:
        conv = Conversation(prompt_ids=prompt_ids, traj_id=t.traj_id, group_id=t.group_id, turn=turn)
        t.conversations.append(conv)
        return conv


def differing_span(first: Sequence[int], now: Sequence[int]) -> tuple[int, int]:
    """[start, end) of `now` between its longest common prefix and suffix with `first` (the two
    never overlap): the part of `now` that `first` does not have in the same place."""
    n = min(len(first), len(now))
    a, c = np.asarray(first[:n]), np.asarray(now[:n])
    prefix = n if np.array_equal(a, c) else int(np.argmin(a == c))
    room = n - prefix
    a, c = np.asarray(first[len(first) - room:]), np.asarray(now[len(now) - room:])
    suffix = room if np.array_equal(a, c) else room - 1 - int(np.flatnonzero(a != c)[-1])
    return prefix, len(now) - suffix


def turn_hint(b: PromptBuilder, t: Trajectory, turn: int) -> str:
    """The hint line the act of `turn` (from 0) reads, "" when the builder shows none: the turns left
    of the episode's budget (`t.max_turns`), this one included, and its questions no search has named
    (`Trajectory.unsearched_questions`). Each workflow ends the user message its act reads with it."""
    return b.hint_line(t.max_turns - turn, t.unsearched_questions()) if b.hint != "none" else ""


def register(cls: type[Workflow]) -> type[Workflow]:
    """Class decorator: make `cls` selectable as `agent.workflow=cls.name`."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY and type(_REGISTRY[cls.name]) is not cls:
        raise ValueError(f"workflow {cls.name!r} is already registered by {type(_REGISTRY[cls.name]).__name__}")
    _REGISTRY[cls.name] = cls()
    return cls


def workflow_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def recorded_workflows() -> tuple[str, ...]:
    """The workflows the demonstrator can write episodes for (those with a recorder)."""
    return tuple(n for n, wf in _REGISTRY.items() if wf.recorder is not None)


def get_workflow(name: str) -> Workflow:
    if name not in _REGISTRY:
        raise ValueError(f"agent.workflow={name!r} is not a registered workflow; registered: {workflow_names()}")
    return _REGISTRY[name]
