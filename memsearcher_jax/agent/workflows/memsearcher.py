"""MemSearcher (docs/method.md §1): each turn is rebuilt from the question and a rewritten memory.

    context_t = system + <question> q </question> + <memory> m_{t-1} </memory> (+ the hint line)
    act       think, then tool calls or \\boxed{answer}
    observe   the tool responses and the memory-update instruction, appended (masked)
    second    <memory> m_t </memory>; its first non-empty span is carried. A missing memory or
              one over agent.memory_budget tokens ends the episode.
One conversation per turn.
"""
from __future__ import annotations

from memsearcher_jax.agent.parsing import extract_memory
from memsearcher_jax.agent.workflows.base import ScriptRecorder, Workflow, observation_cap, register, turn_hint


class MemSearcherRecorder(ScriptRecorder):
    """A scripted turn: a new conversation on question + memory; after the search, the second
    call rewrites the memory to the script's."""

    def new_turn(self):
        return self.new_conversation(self.b.memsearcher_context(self.t.question, self.t.memory,
                                                                turn_hint(self.b, self.t, self.turn)))

    def observe_and_update(self, conv, hits, memory, new_fact, note):
        self.second(conv, self.b.observation([hits]), f"<memory>{memory}</memory>")
        self.t.memory = memory
        self.t.memories.append(memory)
        self.t.memory_tokens.append(self.b.memory_tokens(memory))
        self.t.num_searches += 1


@register
class MemSearcher(Workflow):
    name = "memsearcher"
    second_call = True
    recorder = MemSearcherRecorder

    def carried_tokens(self, cfg):
        return cfg.memory_budget

    def open_turn(self, t, turn, b, cfg):
        self.new_conversation(t, b.memsearcher_context(t.question, t.memory, turn_hint(b, t, turn)), turn)

    def act_budget(self, t, cfg):
        # At least one token, as the loop always gave this workflow (its context is bounded by
        # the memory budget, so the prompt alone never fills max_context_tokens in practice).
        return max(1, super().act_budget(t, cfg))

    def observe(self, t, results, b, cfg):
        t.final.add_injected(b.observation(results, observation_cap(cfg)))  # held to the cap, markup included

    def after_second(self, t, text, b, cfg):
        memory = extract_memory(text)
        if memory is None:
            t.finish("no_memory")
        elif (n_memory := b.memory_tokens(memory)) > cfg.memory_budget:
            t.finish("memory_over_budget")
        else:
            t.memory = memory
            t.memories.append(memory)
            t.memory_tokens.append(n_memory)
