"""A bank of numbered memory entries edited by operations (Memory-R1 / Mem-alpha style).

    context_t = system + <question> q </question> + <memory> [id] entry lines </memory>
                (+ <errors> the last turn's refused operations </errors>) (+ the hint line)
    act       think, then tool calls or \\boxed{answer}
    observe   the tool responses and the operations instruction, appended (masked)
    second    <ops> one operation per line </ops>:
                  ADD text          a new entry (ids count up and are never reused)
                  UPDATE id text    replace entry id's text
                  DELETE id         remove entry id
                  NOOP              change nothing
Operations apply in order. A malformed one (unknown verb, missing text, an id not in the bank,
no <ops> block at all) is refused and shown to the model as an error line in the next context;
the episode goes on. Budget: the bank's lines may hold at most agent.memory_budget tokens; an
ADD or UPDATE that would exceed it is refused the same way, so the bank never exceeds it.
The error lines shown are bounded too: at most MAX_ERROR_LINES of them (each quoting at most
QUOTE_CHARS characters of the operation), then a count of the rest, and the whole block at most
ERROR_TOKENS tokens of the context, sized so that MAX_ERROR_LINES of the longest lines fit; so a
context carries at most memory_budget + ERROR_TOKENS tokens (`MemoryOps.carried_tokens`, the
planner's bound). The bank, the errors and the question
encode as plain text: a tag written in an entry stays characters.
One conversation per turn, as in memsearcher.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from memsearcher_jax.agent.parsing import tag_spans
from memsearcher_jax.agent.prompts import Untrusted, compact_system_prompt, tool_block
from memsearcher_jax.agent.workflows.base import ScriptRecorder, Workflow, observation_cap, register, turn_hint

OPS_OPEN, OPS_CLOSE = "<ops>", "</ops>"
VERBS = ("ADD", "UPDATE", "DELETE", "NOOP")
_LINE = re.compile(r"\s*([A-Za-z]+)\b\s*(.*)", re.DOTALL)
_ID_REST = re.compile(r"\[?(\d{1,9})\]?\s*:?\s*(.*)", re.DOTALL)

MAX_ERROR_LINES = 3     # error lines shown in the next context; the rest are counted
QUOTE_CHARS = 40        # characters of a malformed operation an error line quotes
UNKNOWN_OPERATION = "unknown operation; use ADD text, UPDATE id text, DELETE id or NOOP"  # the longest message


def not_shown_line(rest: int) -> str:
    """The line counting the error lines the next context leaves out."""
    return f"({rest} more refused operation{'s' * (rest > 1)} not shown)"


def errors_block(errors: list[str]) -> str:
    """The errors block as the next context writes it."""
    return "\n<errors>\n" + "\n".join(errors) + "\n</errors>"


# Tokens the errors block may add to the next context: room for MAX_ERROR_LINES of the longest line a
# printable-ASCII operation gets (its quote, then the longest message) and the count of the rest, at one
# token per character, the most a tokenizer spends on ASCII (byte-level BPE: one per byte). The shipped
# base spends 73 on a common line, over the 64 this once was, and showed only the count. A quote of
# other characters may cost more: fewer lines are shown then, and the count says how many were left out.
ERROR_TOKENS = len(errors_block([f"{'x' * QUOTE_CHARS!r}: {UNKNOWN_OPERATION}"] * MAX_ERROR_LINES
                                + [not_shown_line(10 ** 6)]))

OPS_INSTRUCTION = ("Read the search results above. Edit your memory with operations inside <ops> </ops>, one per "
                   "line: ADD text, UPDATE id text, DELETE id, or NOOP. Keep what helps answer the question.")
COMPACT_OPS_INSTRUCTION = "Edit memory: <ops>ADD text|UPDATE id text|DELETE id|NOOP</ops>."


@dataclasses.dataclass(frozen=True)
class Operation:
    verb: str                 # one of VERBS
    entry_id: int | None = None
    text: str = ""


def memory_ops_system_prompt(default_top_n: int, tool) -> str:
    return (
        "You answer questions by searching Wikipedia. Each turn you see the question and your memory: "
        "numbered entries kept from earlier searches.\n\n"
        + tool_block(default_top_n, tool)
        + "\n# Steps\n"
        "1. Think inside <think> </think>.\n"
        "2. If your memory is enough, give the final answer as \\boxed{answer}, a few words only. "
        "Otherwise search with tool calls.\n"
        "3. After the results arrive, edit your memory inside <ops> </ops>, one operation per line: "
        "ADD text, UPDATE id text, DELETE id, or NOOP."
    )


def render_bank(entries: list[tuple[int, str]]) -> str:
    """The bank as `[id] text` lines (empty string for an empty bank)."""
    return "\n".join(f"[{i}] {text}" for i, text in entries)


def memory_ops_context(b, question: str, entries: list[tuple[int, str]], errors: list[str],
                       hint: str = "") -> list[int]:
    system = (memory_ops_system_prompt(b.default_top_n, b.tool) if b.style == "full" else compact_system_prompt(b.tool))
    bank = render_bank(entries)
    user = ["<question> ", Untrusted(question.strip()), " </question>\n<memory>\n",
            Untrusted(bank + "\n" if bank else ""), "</memory>"]
    if errors:  # errors_block's text, its lines untrusted
        user += ["\n<errors>\n", Untrusted("\n".join(errors)), "\n</errors>"]
    return b.chat_context(system, *user, *b.hint_parts(hint))


def shown_errors(b, question: str, entries: list[tuple[int, str]], errors: list[str], limit: int) -> list[str]:
    """The error lines the next context shows: at most MAX_ERROR_LINES of `errors`, then a count
    of the rest, fewer lines until the block adds at most `limit` tokens to that context."""
    base = len(memory_ops_context(b, question, entries, []))
    for keep in range(min(len(errors), MAX_ERROR_LINES), -1, -1):
        rest = len(errors) - keep
        lines = errors[:keep] + ([not_shown_line(rest)] if rest else [])
        if len(memory_ops_context(b, question, entries, lines)) - base <= limit:
            return lines
    return []


def ops_observation(b, results, max_tokens: int = 0) -> list[int]:
    """The tool responses and the operations instruction; max_tokens > 0: held to that many tokens in
    all (`PromptBuilder.fit_tool_message`)."""
    instruction = OPS_INSTRUCTION if b.style == "full" else COMPACT_OPS_INSTRUCTION
    return b.fit_tool_message(results, max_tokens, instruction) if max_tokens > 0 else b.tool_message(results, 0,
                                                                                                     instruction)


def parse_operations(text: str) -> tuple[list[Operation], list[str]]:
    """The operations of the first `<ops>` block, and an error line for each malformed one.
    Never raises."""
    bodies, unclosed = tag_spans(text, OPS_OPEN, OPS_CLOSE)
    if not bodies:
        return [], ["no <ops> </ops> block" + (" (unclosed <ops>)" if unclosed else "") + "; memory unchanged"]
    ops, errors = [], []
    for line in bodies[0].splitlines():
        if not line.strip():
            continue
        shown = line.strip()[:QUOTE_CHARS]
        m = _LINE.fullmatch(line)
        verb = m.group(1).upper() if m else ""
        rest = m.group(2).strip() if m else ""
        if verb not in VERBS:
            errors.append(f"{shown!r}: {UNKNOWN_OPERATION}")
        elif verb == "NOOP":
            ops.append(Operation("NOOP"))
        elif verb == "ADD":
            text_ = rest[1:].strip() if rest.startswith(":") else rest
            ops.append(Operation("ADD", None, text_)) if text_ else errors.append(f"{shown!r}: ADD needs text")
        else:
            idm = _ID_REST.fullmatch(rest)
            if not idm:
                errors.append(f"{shown!r}: {verb} needs an entry id")
            elif verb == "UPDATE" and not idm.group(2).strip():
                errors.append(f"{shown!r}: UPDATE needs an id and the new text")
            else:
                ops.append(Operation(verb, int(idm.group(1)), idm.group(2).strip() if verb == "UPDATE" else ""))
    return ops, errors


def apply_operations(entries: list[tuple[int, str]], next_id: int, ops: list[Operation], budget: int,
                     count_tokens: Callable[[str], int]) -> tuple[list[tuple[int, str]], int, list[str]]:
    """Apply `ops` in order. Returns (entries, next id, error lines); a refused op changes nothing.
    `count_tokens(render_bank(entries))` must stay <= budget."""
    entries, errors = list(entries), []
    for op in ops:
        ids = [i for i, _ in entries]
        if op.verb == "NOOP":
            continue
        if op.verb in ("UPDATE", "DELETE") and op.entry_id not in ids:
            errors.append(f"{op.verb} {op.entry_id}: no entry {op.entry_id}")
            continue
        if op.verb == "DELETE":
            entries = [(i, x) for i, x in entries if i != op.entry_id]
            continue
        if op.verb == "ADD":
            trial, label = entries + [(next_id, op.text)], "ADD"
        else:
            trial, label = [(i, op.text if i == op.entry_id else x) for i, x in entries], f"UPDATE {op.entry_id}"
        n = count_tokens(render_bank(trial))
        if n > budget:
            errors.append(f"{label} refused: the memory would hold {n} tokens, over its budget of {budget}")
            continue
        entries = trial
        next_id += op.verb == "ADD"
    return entries, next_id, errors


class MemoryOpsRecorder(ScriptRecorder):
    """A scripted turn: the bank in the context, and after each observation `ADD` of the newly
    found supporting sentence; a search that found nothing adds the script's no-result note,
    which the next found sentence replaces (`UPDATE`). The demonstration reports the banks."""

    def new_turn(self):
        s = self.t.state
        s.setdefault("entries", [])
        return self.new_conversation(memory_ops_context(self.b, self.t.question, s["entries"], [],
                                                        turn_hint(self.b, self.t, self.turn)))

    def observe_and_update(self, conv, hits, memory, new_fact, note):
        s = self.t.state
        entries, note_id = s["entries"], s.get("note_id")
        if new_fact and note_id:  # the fact replaces the no-result note
            op, entries, s["note_id"] = f"UPDATE {note_id} {new_fact}", [(i, new_fact if i == note_id else x)
                                                                         for i, x in entries], None
        else:
            text = new_fact or note
            op, entries = f"ADD {text}", entries + [(len(entries) + 1, text)]
            s["note_id"] = None if new_fact else len(entries)
        s["entries"] = entries
        self.second(conv, ops_observation(self.b, [hits]), f"<ops>\n{op}\n</ops>")
        self.t.memory = render_bank(s["entries"])
        self.t.memories.append(self.t.memory)
        self.t.memory_tokens.append(self.b.count_tokens(self.t.memory))
        self.t.num_searches += 1

    def recorded_memories(self, script_memories):
        return list(self.t.memories)


@register
class MemoryOps(Workflow):
    name = "memory_ops"
    second_call = True
    recorder = MemoryOpsRecorder

    def carried_tokens(self, cfg):
        # The bank, plus the errors block (shown_errors holds the two to this together).
        return cfg.memory_budget + ERROR_TOKENS

    def start(self, t, b, cfg):
        t.state.update(entries=[], next_id=1, errors=[], op_errors=0)

    def open_turn(self, t, turn, b, cfg):
        s = t.state
        self.new_conversation(t, memory_ops_context(b, t.question, s["entries"], s["errors"], turn_hint(b, t, turn)),
                              turn)

    def observe(self, t, results, b, cfg):
        t.final.add_injected(ops_observation(b, results, observation_cap(cfg)))

    def after_second(self, t, text, b, cfg):
        s = t.state
        ops, errors = parse_operations(text)
        s["entries"], s["next_id"], refused = apply_operations(s["entries"], s["next_id"], ops, cfg.memory_budget,
                                                               b.count_tokens)
        # Shown once, in the next context, within what carried_tokens allows: the bank's own
        # tokens there (its lines and their newline) and the errors together.
        bank = len(memory_ops_context(b, t.question, s["entries"], [])) - len(memory_ops_context(b, t.question, [], []))
        limit = min(ERROR_TOKENS, self.carried_tokens(cfg) - bank)
        s["errors"] = shown_errors(b, t.question, s["entries"], errors + refused, limit)
        s["op_errors"] += len(errors) + len(refused)
        t.memory = render_bank(s["entries"])
        t.memories.append(t.memory)
        t.memory_tokens.append(b.count_tokens(t.memory))
