"""MEM1-style internal state: each turn sees the question, its last act and that act's results only.

    context_0 = system + <question> q </question> (+ the hint line) + assistant <think>
    context_t = context_0 without the hint + act_{t-1} (its tokens as generated) + observation_{t-1}
                (+ the hint line, inside the observation's cap) + <think>
    act       <think> internal state: everything worth keeping </think>, then tool calls or \\boxed{}
Everything older than the last act and observation is dropped, so the model must carry what it
needs inside its thinking. One conversation per turn whose prompt is exactly the act call's
context and whose response is the act alone: the training row is the context the sampler saw,
and only generated tokens are in the loss (MEM1's release trains one stitched sequence under
an attention mask that shows a step less than its rollout did).

The carried observation is held to `observation_cap` tokens in all (agent.max_observation_tokens,
or max_response_tokens; markup included: `PromptBuilder.fit_tool_message`, a cut says so), as
every workflow's is, so a context never carries more than `Mem1.carried_tokens`, the planner's bound.

Actions use the project's format (`<tool_call>` JSON, `\\boxed{}`), not MEM1's
`<search>` / `<answer>` tags, so that the reward, the parser and the demonstrator are the same
for every workflow and only the memory design differs between them.
"""
from __future__ import annotations

from memsearcher_jax.agent.parsing import tag_spans
from memsearcher_jax.agent.prompts import Untrusted, compact_system_prompt, tool_block
from memsearcher_jax.agent.workflows.base import ScriptRecorder, Workflow, observation_cap, register, turn_hint


def mem1_system_prompt(default_top_n: int, tool) -> str:
    return (
        "You answer questions by searching Wikipedia. Each turn you see only the question, your previous "
        "turn and its search results: everything older is gone.\n\n"
        + tool_block(default_top_n, tool)
        + "\n# Steps\n"
        "1. Think inside <think> </think>. Start by restating every fact found so far that helps answer "
        "the question: only what you write there is kept.\n"
        "2. If you know enough, give the final answer as \\boxed{answer}, a few words only. "
        "Otherwise search with tool calls; the results come back in the next message."
    )


def mem1_first_context(b, question: str, hint: str = "") -> list[int]:
    system = (mem1_system_prompt(b.default_top_n, b.tool) if b.style == "full" else compact_system_prompt(b.tool))
    return b.chat_context(system, "<question> ", Untrusted(question.strip()), " </question>", *b.hint_parts(hint))


def mem1_context(b, question: str, last_act: list[int], last_observation: list[int], hint: str = "") -> list[int]:
    """The act call's context: the first context, then the last act and its observation (if any).
    `hint`: the first turn's hint line; later turns read theirs at the end of the observation."""
    return [*mem1_first_context(b, question, "" if last_act else hint), *last_act, *last_observation]


def internal_state(act_text: str) -> str:
    """The first thinking span of an act block (its `<think>` re-attached), stripped."""
    bodies, _ = tag_spans(act_text, "<think>", "</think>")
    return bodies[0].strip() if bodies else ""


class Mem1Recorder(ScriptRecorder):
    """A scripted turn: one conversation per turn holding the act only, its prompt the question +
    the last act + its observation. The script's memory (the facts found so far) opens each act's
    thinking: the internal state the next turn relies on; the demonstration reports those states."""

    def new_turn(self):
        s = self.t.state
        return self.new_conversation(mem1_context(self.b, self.t.question, s.get("last_act", []),
                                                  s.get("last_observation", []), turn_hint(self.b, self.t, 0)))

    def act_text(self, think, action):
        state = self.t.state.get("carry", "")
        return f"{state} {think}</think>\n{action}" if state else f"{think}</think>\n{action}"

    def observe_and_update(self, conv, hits, memory, new_fact, note):
        s = self.t.state
        s["last_act"] = list(conv.response_ids)
        s["last_observation"] = self.b.tool_message([hits], 0, turn_hint(self.b, self.t, self.turn), reopen_think=True)
        s["carry"] = memory
        self.t.memory = internal_state(conv.blocks[-1])
        self.t.memories.append(self.t.memory)
        self.t.memory_tokens.append(len(s["last_act"]))
        self.t.num_searches += 1

    def recorded_memories(self, script_memories):
        return list(self.t.memories)


@register
class Mem1(Workflow):
    name = "mem1"
    recorder = Mem1Recorder

    def carried_tokens(self, cfg):
        # The last act, and its observation (held to observation_cap by observe).
        return cfg.max_new_tokens + observation_cap(cfg)

    def response_tokens(self, cfg):
        return cfg.max_new_tokens  # the act alone: its observation goes to the next turn's prompt

    def open_turn(self, t, turn, b, cfg):
        prompt = mem1_context(b, t.question, t.state.get("last_act", []), t.state.get("last_observation", []),
                              turn_hint(b, t, 0))
        self.new_conversation(t, prompt, turn)

    def observe(self, t, results, b, cfg):
        # The act's conversation is complete; what the next turn sees is kept on the trajectory.
        act = list(t.final.response_ids)
        t.state["last_act"] = act
        # The next act's hint closes the observation, within its cap (t.turns acts were made so far).
        t.state["last_observation"] = b.fit_tool_message(results, observation_cap(cfg), turn_hint(b, t, t.turns),
                                                         reopen_think=True)
        t.memory = internal_state(t.final.blocks[-1])
        t.memories.append(t.memory)
        t.memory_tokens.append(len(act))
