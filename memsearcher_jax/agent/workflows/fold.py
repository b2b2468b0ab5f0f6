"""Context folding (Context-Folding / FoldGRPO, arXiv 2510.11967; AgentFold, arXiv 2510.24699; docs/method.md §12).

The agent works on one sub-task at a time (a question of a multi-question task, or a hop) in a
branch, and folds each finished branch into a short return text:

    main      system + <question> q </question> + <return> r_1 </return> ... (every branch returned so far)
    branch    an act that searches from the main context opens one (its <branch> task </branch>, if
              written, names it); its acts and observations go on after the main context, as in react
    return    an act that writes <return> r </return> after its thinking, then searches (opening the
              next branch) or answers: the branch's turns are dropped, r joins the main context, and
              the next context is the main context, the new branch's task and its search's results,
              in one user message (+ the hint line)
What the agent sees of a returned branch is its return text alone. Bounds: a branch holds at most
agent.fold_turns acts; the last must return (or answer), else the episode ends ("no_return"). The
returns and the open branch's task may add at most agent.memory_budget tokens to the context, tags
included, else the episode ends ("fold_over_budget"): a context carries at most memory_budget +
observation_cap tokens (`Fold.carried_tokens`), a branch's row at most fold_turns acts and
fold_turns - 1 observations (`Fold.response_tokens`). One conversation per branch, all under the
trajectory's advantage; the return and branch texts are part of acts, trained as the policy's own
tokens. Returns, tasks, the question and documents encode as plain text (tags stay characters).
"""
from __future__ import annotations

from collections.abc import Sequence

from memsearcher_jax.agent.parsing import tagged_outside_think
from memsearcher_jax.agent.prompts import Untrusted, compact_system_prompt, react_system_prompt
from memsearcher_jax.agent.workflows.base import ScriptRecorder, Workflow, observation_cap, register, turn_hint
from memsearcher_jax.agent.workflows.summary import carried_context, question_parts

BRANCH_OPEN, BRANCH_CLOSE = "<branch>", "</branch>"
RETURN_OPEN, RETURN_CLOSE = "<return>", "</return>"


def fold_system_prompt(default_top_n: int, tool) -> str:
    return (react_system_prompt(default_top_n, tool)
            + "\n3. Work on one question (or one step) at a time, in a branch: after your thinking, write "
              "<branch> the sub-question </branch> before its first search. When the branch is done, write "
              "<return> what it found </return> after your thinking, then search (the next branch) or answer. "
              "A returned branch leaves only its return text in your context; a branch lasts a few turns.")


def fold_parts(question: str, returns: Sequence[str], task: str | None = None) -> tuple:
    """The main context's user message (the question, every return so far), then the open branch's task."""
    parts = [*question_parts(question)]
    for r in returns:
        parts += ["\n<return> ", Untrusted(r.strip()), " </return>"]
    if task:
        parts += ["\n<branch> ", Untrusted(task.strip()), " </branch>"]
    return tuple(parts)


def fold_context(b, question: str, returns: Sequence[str] = (), task: str | None = None,
                 observation: Sequence[int] = (), hint: str = "") -> list[int]:
    """The main context (episode start: no observation), or a branch opened by a return act: the
    returns, its task and its search's observation (`fit_tool_message`, hint line inside)."""
    system = fold_system_prompt(b.default_top_n, b.tool) if b.style == "full" else compact_system_prompt(b.tool)
    return carried_context(b, system, fold_parts(question, returns, task), observation, hint)


def fold_cost(b, question: str, returns: Sequence[str], task: str | None = None) -> int:
    """Tokens the returns and the task add to a branch's context (tags and the line break after them
    included), the number held to agent.memory_budget."""
    carried = b.encode_parts(*fold_parts(question, returns, task), "\n")
    return len(carried) - len(b.encode_parts(*question_parts(question)))


class FoldRecorder(ScriptRecorder):
    """A scripted episode as fold records it: one branch per question of the task. The first search of a
    question opens its branch (`<branch>` the question); the act that turns to the next question returns
    the branch (`<return>` the facts it found) and branches again; the answer comes from the last branch.
    The demonstration reports the main context's returns after each fold."""

    def next_question(self, index, question):
        s = self.t.state
        s["task"], s["returning"] = question, bool(s.get("open"))

    def new_turn(self):
        s = self.t.state
        if not self.t.conversations:
            self.new_conversation(fold_context(self.b, self.t.question, hint=turn_hint(self.b, self.t, 0)))
        elif s.get("pending"):
            self.new_conversation(s.pop("pending"))
        return self.t.final

    def act_text(self, think, action):
        s = self.t.state
        if action.startswith("\\boxed{"):  # the answer, from the last branch
            return super().act_text(think, action)
        fold = f"<return>{self.found()}</return>\n" if s.get("returning") else ""
        branch = f"<branch>{s['task']}</branch>\n" if s.get("task") else ""
        return f"{think}</think>\n{fold}{branch}{action}"

    def observe_and_update(self, conv, hits, memory, new_fact, note):
        s, b, t = self.t.state, self.b, self.t
        obs = b.tool_message([hits], 0, turn_hint(b, t, self.turn), reopen_think=True)
        if s.get("returning"):  # this act returned the last branch: its search opens the next one
            s.setdefault("returns", []).append(self.found())
            t.memory = "\n".join(s["returns"])
            t.memories.append(t.memory)
            t.memory_tokens.append(fold_cost(b, t.question, s["returns"], s["task"]))
            s["pending"], s["facts"] = fold_context(b, t.question, s["returns"], s["task"], obs), []
        else:
            conv.add_injected(obs)
        s.update(open=True, returning=False, task=None, note=note)
        s.setdefault("facts", []).extend([new_fact] if new_fact else [])
        t.num_searches += 1

    def found(self) -> str:
        """The return text: the facts the open branch found, or its last no-result note."""
        return " ".join(self.t.state.get("facts", [])) or self.t.state.get("note", "")

    def recorded_memories(self, script_memories):
        return list(self.t.memories)


@register
class Fold(Workflow):
    name = "fold"
    recorder = FoldRecorder

    def carried_tokens(self, cfg):
        # The returns and the task (memory_budget, tags included) and the opening search's observation.
        return cfg.memory_budget + observation_cap(cfg)

    def response_tokens(self, cfg):
        # A branch: fold_turns acts, an observation after each but the last (which returns or answers).
        return cfg.fold_turns * cfg.max_new_tokens + (cfg.fold_turns - 1) * observation_cap(cfg)

    def start(self, t, b, cfg):
        t.state.update(returns=[], pending=None)
        self.new_conversation(t, fold_context(b, t.question, hint=turn_hint(b, t, 0)), 0)

    def open_turn(self, t, turn, b, cfg):
        if t.state["pending"] is not None:  # a return act searched: the next branch
            self.new_conversation(t, t.state["pending"], turn)
            t.state["pending"] = None

    def observe(self, t, results, b, cfg):
        s, act = t.state, t.final.blocks[-1]
        obs = b.fit_tool_message(results, observation_cap(cfg), turn_hint(b, t, t.turns), reopen_think=True)
        returned = tagged_outside_think(act, RETURN_OPEN, RETURN_CLOSE)
        if returned is None and len(t.final.blocks) >= cfg.fold_turns:
            return t.finish("no_return")  # the branch's last act neither returned nor answered
        if returned is None:
            return t.final.add_injected(obs)  # the branch goes on
        returns, task = [*s["returns"], returned], tagged_outside_think(act, BRANCH_OPEN, BRANCH_CLOSE)
        if (cost := fold_cost(b, t.question, returns, task)) > cfg.memory_budget:
            return t.finish("fold_over_budget")
        s["returns"] = returns
        t.memory = "\n".join(returns)
        t.memories.append(t.memory)
        t.memory_tokens.append(cost)
        s["pending"] = fold_context(b, t.question, returns, task, obs)
