"""What an episode records: its training rows (conversations) and its token counts per call.

Kept apart from the turn loop so that workflows (agent/workflows/) and the loop
(agent/rollout.py) can both use these types without importing each other.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

ACT, SECOND = "act", "second"  # the two kinds of generation call a turn can make


@dataclasses.dataclass
class Conversation:
    """One training row. response_ids, loss_mask and sampler_logprobs are aligned."""

    prompt_ids: list[int]
    response_ids: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    sampler_logprobs: list[float] = dataclasses.field(default_factory=list)
    traj_id: int = 0
    group_id: int = 0
    turn: int = 0
    is_final: bool = False
    blocks: list[str] = dataclasses.field(default_factory=list)  # decoded generated blocks
    ended_with_eos: bool = False

    def add_generated(self, tokens: Sequence[int], logprobs: Sequence[float]):
        self.response_ids += list(tokens)
        self.loss_mask += [1] * len(tokens)
        self.sampler_logprobs += [float(x) for x in logprobs]

    def add_injected(self, tokens: Sequence[int]):
        self.response_ids += list(tokens)
        self.loss_mask += [0] * len(tokens)
        self.sampler_logprobs += [0.0] * len(tokens)


@dataclasses.dataclass(frozen=True)
class CallRecord:
    """One generation call of an episode: its kind (act or second), turn, and token counts."""

    kind: str
    turn: int
    prompt_tokens: int      # the context the sampler was given
    generated_tokens: int   # what it wrote (ending token included)

    @property
    def context_tokens(self) -> int:
        """The call's largest context: its prompt plus everything it generated."""
        return self.prompt_tokens + self.generated_tokens


@dataclasses.dataclass
class Trajectory:
    """One episode. `memory` / `memories` / `memory_tokens` hold what each workflow carries from
    turn to turn (memsearcher: the <memory> text; mem1: the last act's internal state;
    memory_ops: the rendered bank; react: nothing). `state` is the workflow's own per-episode
    data (e.g. mem1's last act and observation tokens, memory_ops' bank)."""

    traj_id: int
    group_id: int
    question: str
    golds: list[str]
    conversations: list[Conversation] = dataclasses.field(default_factory=list)
    memory: str = ""
    memories: list[str] = dataclasses.field(default_factory=list)
    memory_tokens: list[int] = dataclasses.field(default_factory=list)  # token count of each kept memory
    done: bool = False
    end_reason: str = ""
    num_searches: int = 0
    refused_searches: int = 0  # tool calls over agent.max_searches_per_act: refused, never searched
    context_tokens: list[int] = dataclasses.field(default_factory=list)  # prompt tokens per act call
    calls: list[CallRecord] = dataclasses.field(default_factory=list)    # every generation call, in order
    state: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The turn budget (AgentConfig.episode_turns; 0: the loop's max_turns) and each question's subject,
    # the name a search for it mentions (None: any search counts): the hint line's two numbers.
    max_turns: int = 0
    subjects: list[str | None] = dataclasses.field(default_factory=list)
    # The questions the task asks, one per objective ("q1; q2" asks two); rl/information.py probes each.
    objectives: list[str] = dataclasses.field(default_factory=list)
    queries: list[str] = dataclasses.field(default_factory=list)  # every search query sent, in order
    passages: int = 0  # passages the searches returned (all of them stay in react's history)
    # Per opened turn: (conversation, start, end) of the context that turn's act prompt carries from
    # earlier turns (`Workflow.carried_span`); read it back with `carried_ids`.
    carried: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    # The version of the weights that sampled it: the learner's step count when they were made (the
    # trainer sets it; a rollout ahead of the learner, rl.max_staleness > 0, samples with older ones).
    policy_version: int = 0

    @property
    def final(self) -> Conversation:
        return self.conversations[-1]

    def finish(self, reason: str):
        self.done = True
        self.end_reason = reason
        self.final.is_final = True

    def record_call(self, kind: str, turn: int, prompt_tokens: int, generated_tokens: int):
        self.calls.append(CallRecord(kind, turn, int(prompt_tokens), int(generated_tokens)))
        if kind == ACT:
            self.context_tokens.append(int(prompt_tokens))

    def unsearched_questions(self) -> int:
        """Questions of the task no search query has mentioned yet: a question counts as searched once
        a query names its subject as a whole word (any case), or, for a question without a subject
        (data other than the synthetic world), once any search was made."""
        said = [_words(q) for q in self.queries]
        return sum(not (any(_words(s) in q for q in said) if s else said) for s in self.subjects)

    def record_searches(self, queries: Sequence[str], results: Sequence[Sequence[Any]]) -> None:
        """One act's search calls: their queries and the hit lists they returned."""
        self.num_searches += len(queries)
        self.queries += [str(q) for q in queries]
        self.passages += sum(len(hits) for hits in results)

    def carried_ids(self, turn: int) -> list[int]:
        """The tokens turn `turn`'s act prompt carried from earlier turns (`carried[turn]`'s span;
        a conversation only grows, so the span reads the same tokens later)."""
        conv_index, start, end = self.carried[turn]
        conv = self.conversations[conv_index]
        return (conv.prompt_ids + conv.response_ids)[start:end]

    # ------------------------------------------------------------------ token metrics (issue 23 item 6)
    @property
    def turns(self) -> int:
        """Act calls made (one per turn the episode ran)."""
        return sum(c.kind == ACT for c in self.calls)

    @property
    def act_prompt_tokens(self) -> list[int]:
        """Prompt tokens of each act call, turn by turn."""
        return [c.prompt_tokens for c in self.calls if c.kind == ACT]

    @property
    def second_prompt_tokens(self) -> list[int]:
        """Prompt tokens of each second call (memory update / operations), in order."""
        return [c.prompt_tokens for c in self.calls if c.kind == SECOND]

    @property
    def peak_tokens(self) -> int:
        """The largest context of any call in the episode (prompt + what that call generated)."""
        return max((c.context_tokens for c in self.calls), default=0)

    @property
    def tokens_processed(self) -> int:
        """Total tokens the model processed over the episode: every call's prompt plus its output."""
        return sum(c.context_tokens for c in self.calls)

    @property
    def prompt_tokens_processed(self) -> int:
        """Sum of every call's prompt tokens."""
        return sum(c.prompt_tokens for c in self.calls)


def _words(text: str) -> str:
    """`text`'s words, lower-cased, between single spaces (so `in` matches whole words)."""
    return " " + " ".join(re.findall(r"\w+", str(text).lower())) + " "
