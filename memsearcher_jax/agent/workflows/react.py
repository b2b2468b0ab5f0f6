"""ReAct, the full-history baseline: ONE growing conversation per episode.

    context   system + <question> q </question> (+ the hint line), then every act and observation so far
    act       think, then tool calls or \\boxed{answer}
    observe   the tool responses (+ the next turn's hint line) as a user message, then `<think>`
              re-opened (masked)
Nothing is forgotten and there is no second call; the context grows every turn.
"""
from __future__ import annotations

from memsearcher_jax.agent.workflows.base import ScriptRecorder, Workflow, observation_cap, register, turn_hint


class ReActRecorder(ScriptRecorder):
    """One conversation: each act appended (mask 1), each observation appended (mask 0), no
    memory update; the demonstration reports no memories (the script's notes are not recorded)."""

    def new_turn(self):
        if not self.t.conversations:
            self.new_conversation(self.b.react_context(self.t.question, turn_hint(self.b, self.t, 0)))
        return self.t.final

    def observe_and_update(self, conv, hits, memory, new_fact, note):
        conv.add_injected(self.b.react_observation([hits], hint=turn_hint(self.b, self.t, self.turn)))
        self.t.num_searches += 1

    def recorded_memories(self, script_memories):
        return []


@register
class ReAct(Workflow):
    name = "react"
    recorder = ReActRecorder

    def start(self, t, b, cfg):
        self.new_conversation(t, b.react_context(t.question, turn_hint(b, t, 0)), 0)

    def response_tokens(self, cfg):
        # The one conversation holds every turn's act and observation.
        return cfg.max_turns * (cfg.max_new_tokens + observation_cap(cfg))

    def open_turn(self, t, turn, b, cfg):
        pass  # the one conversation goes on

    def observe(self, t, results, b, cfg):
        # The next act's hint: t.turns acts were made, so the next turn is number t.turns.
        t.final.add_injected(b.fit_tool_message(results, observation_cap(cfg), turn_hint(b, t, t.turns),
                                                reopen_think=True))  # react_observation, held to the cap
