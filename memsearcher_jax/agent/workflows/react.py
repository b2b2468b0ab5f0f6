"""ReAct, the full-history baseline: ONE growing conversation per episode.

    context   system + <question> q </question>, then every act and every observation so far
    act       think, then tool calls or \\boxed{answer}
    observe   the tool responses as a user message, then `<think>` re-opened (masked)
Nothing is forgotten and there is no second call; the context grows every turn.
"""
from __future__ import annotations

from memsearcher_jax.agent.workflows.base import Workflow, register


@register
class ReAct(Workflow):
    name = "react"

    def start(self, t, b, cfg):
        self.new_conversation(t, b.react_context(t.question), 0)

    def open_turn(self, t, turn, b, cfg):
        pass  # the one conversation goes on

    def observe(self, t, results, b, cfg):
        t.final.add_injected(b.react_observation(results, cfg.max_observation_tokens))
