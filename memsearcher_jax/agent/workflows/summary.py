"""Summary when the history fills (ReSum, arXiv 2509.13313; SUPO, arXiv 2510.06727; docs/method.md §11).

    segment 0 system + <question> q </question> (+ the hint line), then acts and observations as in react
    summary   once a segment's history (its response: acts and observations) holds agent.summary_budget
              tokens, the observation that got it there ends with the summary instruction (then the
              hint line), and the next act writes, after its thinking, <summary> s </summary> and
              then its search or answer (every act of the loop searches or answers)
    segment k system + <question> q </question> <summary> s </summary> + the tool responses of the
              summary act's searches, in one user message (+ the hint line), then the same again
A summary act without a closed, non-empty summary ends the episode ("no_summary"), one that adds
more than agent.memory_budget tokens to the next context, tags included, too ("summary_over_budget"):
so a context carries at most memory_budget + observation_cap tokens (`Summary.carried_tokens`), and
a segment's history at most summary_budget - 1 + 2 act budgets + one observation (`response_tokens`).
One conversation per segment; the summary is part of an act, so it is trained as the policy's own
tokens, and every segment carries the trajectory's advantage (ReSum). agent.summary_overlong_mask
("segment" | "trajectory") takes SUPO's option: an episode the turn or context limit cuts before it
answers trains nothing of its last segment, or of any. The summary, the question and the documents
encode as plain text: a tag written in them stays characters.
"""
from __future__ import annotations

from collections.abc import Sequence

from memsearcher_jax.agent.parsing import tagged_outside_think
from memsearcher_jax.agent.prompts import Untrusted, compact_system_prompt, react_system_prompt
from memsearcher_jax.agent.workflows.base import ScriptRecorder, Workflow, observation_cap, register, turn_hint

SUMMARY_OPEN, SUMMARY_CLOSE = "<summary>", "</summary>"
OVERLONG_MASKS = ("none", "segment", "trajectory")
SUMMARY_INSTRUCTION = ("Your context is full. After your thinking, write <summary> everything found so far that "
                       "helps answer the question </summary>, then search or answer: the next context keeps only "
                       "the question, your summary and the results of that search.")
COMPACT_SUMMARY_INSTRUCTION = "Context full: write <summary></summary>, then act."
# The demonstrator's budget (configs/default.py's agent.summary_budget): a ScriptRecorder is given no
# agent config, so demonstrations summarize where a rollout at this budget would (tests hold the two equal).
DEMO_SUMMARY_BUDGET = 256


def summary_system_prompt(default_top_n: int, tool) -> str:
    return (react_system_prompt(default_top_n, tool)
            + "\n3. When told that your context is full, write everything found so far that helps answer the "
              "question inside <summary> </summary> after your thinking, then search or answer. Only the "
              "question, your summary and the results of that search are kept.")


def system_prompt(b) -> str:
    return summary_system_prompt(b.default_top_n, b.tool) if b.style == "full" else compact_system_prompt(b.tool)


def carried_context(b, system: str, parts: Sequence, observation: Sequence[int] = (), hint: str = "") -> list[int]:
    """A context that carries text from earlier turns (summary, fold): the system prompt and one user
    message of `parts` (the question and what is carried, each as `Untrusted` text), then the hint
    line, the assistant header and `<think>`; or, with `observation` (a `fit_tool_message` that
    re-opens `<think>`, its hint inside), its tool responses in that same user message."""
    if not observation:
        return b.chat_context(system, *parts, *b.hint_parts(hint))
    lead = len(b.encode("\n")) + 1 + len(b.encode("user\n"))  # the observation's own "\n<|im_start|>user\n"
    return [*b.system_ids(system), b.im_start_id, *b.encode("user\n"), *b.encode_parts(*parts, "\n"),
            *observation[lead:]]


def question_parts(question: str) -> tuple:
    return ("<question> ", Untrusted(question.strip()), " </question>")


def summary_parts(summary: str | None) -> tuple:
    return () if summary is None else ("\n<summary> ", Untrusted(summary.strip()), " </summary>")


def summary_context(b, question: str, summary: str | None = None, observation: Sequence[int] = (),
                    hint: str = "") -> list[int]:
    """Segment 0's context (no summary, no observation) or segment k's (the summary, and the summary
    act's observation from `fit_tool_message`, hint line inside)."""
    return carried_context(b, system_prompt(b), question_parts(question) + summary_parts(summary), observation, hint)


def summary_cost(b, question: str, summary: str) -> int:
    """Tokens the summary adds to the next context (its tags and the line break after it included),
    the number held to agent.memory_budget."""
    q = question_parts(question)
    return len(b.encode_parts(*q, *summary_parts(summary), "\n")) - len(b.encode_parts(*q))


def instructed(b, hint: str) -> str:
    """The summary instruction, then the hint line: the end of the observation that asks for a summary."""
    text = SUMMARY_INSTRUCTION if b.style == "full" else COMPACT_SUMMARY_INSTRUCTION
    return f"{text}\n{hint}" if hint else text


def mask_cut(t, mode: str) -> None:
    """SUPO's overlong masking: the loss mask of the episode's last segment ("segment") or of all of
    them ("trajectory") set to 0; "none" leaves it."""
    for conv in {"segment": t.conversations[-1:], "trajectory": t.conversations}.get(mode, []):
        conv.loss_mask[:] = [0] * len(conv.loss_mask)


class SummaryRecorder(ScriptRecorder):
    """A scripted episode as summary records it: react's growing conversation until its history holds
    `budget` tokens; the next act writes the script's memory (the facts found so far) as its summary,
    and its search opens the next segment. The demonstration reports the summaries."""

    budget = DEMO_SUMMARY_BUDGET

    def new_turn(self):
        s = self.t.state
        if not self.t.conversations:
            self.new_conversation(summary_context(self.b, self.t.question, hint=turn_hint(self.b, self.t, 0)))
        elif s.get("pending"):
            self.new_conversation(s.pop("pending"))
        return self.t.final

    def act_text(self, think, action):
        if self.t.state.get("asked"):
            return f"{think}</think>\n<summary>{self.t.state['notes']}</summary>\n{action}"
        return super().act_text(think, action)

    def observe_and_update(self, conv, hits, memory, new_fact, note):
        s, b, t = self.t.state, self.b, self.t
        hint = turn_hint(b, t, self.turn)
        obs = b.tool_message([hits], 0, hint, reopen_think=True)
        if s.get("asked"):  # this act summarized: its search opens the next segment
            summary = s["notes"].strip()
            t.memory = summary
            t.memories.append(summary)
            t.memory_tokens.append(summary_cost(b, t.question, summary))
            s["pending"], s["asked"] = summary_context(b, t.question, summary, obs), False
        else:
            if len(conv.response_ids) + len(obs) >= self.budget:
                obs, s["asked"] = b.tool_message([hits], 0, instructed(b, hint), reopen_think=True), True
            conv.add_injected(obs)
        s["notes"] = memory
        t.num_searches += 1

    def recorded_memories(self, script_memories):
        return list(self.t.memories)


@register
class Summary(Workflow):
    name = "summary"
    recorder = SummaryRecorder

    def carried_tokens(self, cfg):
        # The summary (memory_budget, tags included) and the summary act's observation.
        return cfg.memory_budget + observation_cap(cfg)

    def response_tokens(self, cfg):
        # History under summary_budget, then the act and observation that cross it, then the summary act.
        return cfg.summary_budget + 2 * cfg.max_new_tokens + observation_cap(cfg)

    def start(self, t, b, cfg):
        t.state.update(asked=False, pending=None)
        self.new_conversation(t, summary_context(b, t.question, hint=turn_hint(b, t, 0)), 0)

    def open_turn(self, t, turn, b, cfg):
        if t.state["pending"] is not None:  # a summary act searched: a new segment
            self.new_conversation(t, t.state["pending"], turn)
            t.state["pending"] = None

    def act_budget(self, t, cfg):
        n = super().act_budget(t, cfg)
        if n < 1:  # the loop ends the episode on the context limit ("response_budget")
            mask_cut(t, cfg.summary_overlong_mask)
        return n

    def observe(self, t, results, b, cfg):
        s = t.state
        hint = turn_hint(b, t, t.turns)  # the next act's: t.turns acts were made so far
        if s["asked"]:
            summary = tagged_outside_think(t.final.blocks[-1], SUMMARY_OPEN, SUMMARY_CLOSE)
            if summary is None:
                return t.finish("no_summary")
            if (cost := summary_cost(b, t.question, summary)) > cfg.memory_budget:
                return t.finish("summary_over_budget")
            t.memory = summary
            t.memories.append(summary)
            t.memory_tokens.append(cost)
            obs = b.fit_tool_message(results, observation_cap(cfg), hint, reopen_think=True)
            s["pending"], s["asked"] = summary_context(b, t.question, summary, obs), False
        else:
            obs = b.fit_tool_message(results, observation_cap(cfg), hint, reopen_think=True)
            if len(t.final.response_ids) + len(obs) >= cfg.summary_budget:  # full: the next act summarizes
                obs = b.fit_tool_message(results, observation_cap(cfg), instructed(b, hint), reopen_think=True)
                s["asked"] = True
            t.final.add_injected(obs)
        if t.turns >= t.max_turns:  # the loop ends the episode on its turn limit next
            mask_cut(t, cfg.summary_overlong_mask)
