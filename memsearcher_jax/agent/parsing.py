"""Parse the agent's decoded outputs: tool calls, memory, boxed answers, tag balance.

Every function here takes arbitrary model text and NEVER raises: a rollout must not die
because a sampled string is odd. All scans are single passes with `str.find` or linear
regexes (no backtracking patterns), so cost stays linear in the input size.

Conventions (docs/method.md §1):
- an act block is `<think>...</think>` followed by either `\\boxed{answer}` or one or more
  `<tool_call>{"name": "wikipedia_search", "arguments": {"query": ..., "top_n": ...}}</tool_call>`.
  The text passed here must include the `<think>` that the prompt pre-filled
  (`PromptBuilder.decode_act` re-attaches it).
- a memory-update block holds `<memory>...</memory>`; the first non-empty span is the memory.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import re
from typing import Any

from memsearcher_jax.agent.tools import DEFAULT_TOOL, SearchTool

DEFAULT_TOP_N = 5
MAX_TOP_N = 10  # the recipe's server returns at most 10 passages
# A tool-call body longer than this is rejected before json.loads (a query is a few words).
MAX_TOOL_CALL_BODY_CHARS = 16_384

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
MEMORY_OPEN, MEMORY_CLOSE = "<memory>", "</memory>"

# Tokens of a brace scan: `\boxed{` opens a boxed group, bare braces open/close any group.
_BRACE_TOKENS = re.compile(r"\\boxed\{|[{}]")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One well-formed search call. `top_n` is already clamped to [1, max_top_n]."""

    name: str
    arguments: dict
    query: str
    top_n: int


@dataclasses.dataclass(frozen=True)
class MalformedCall:
    """A `<tool_call>` span that cannot be executed, with the reason why."""

    body: str  # at most the first 200 characters of the span's body
    reason: str


@dataclasses.dataclass(frozen=True)
class ToolCallParse:
    calls: list[ToolCall]
    malformed: list[MalformedCall]

    @property
    def ok(self) -> bool:
        return bool(self.calls) and not self.malformed


class ActKind(enum.StrEnum):
    ANSWER = "answer"
    TOOL_CALLS = "tool_calls"
    INVALID = "invalid"


def _as_str(text: Any) -> str:
    """Coerce any input to str so that the parsers never raise on type."""
    if isinstance(text, str):
        return text
    if isinstance(text, (bytes, bytearray)):
        return bytes(text).decode("utf-8", errors="replace")
    if text is None:
        return ""
    try:
        return str(text)
    except Exception:  # noqa: BLE001 - a hostile __str__ must not break a rollout
        return ""


def tag_spans(text: str, open_tag: str, close_tag: str) -> tuple[list[str], bool]:
    """Bodies of `open_tag ... close_tag` spans in order, and whether an open tag was left unclosed.

    The body runs to the first close tag after the open tag (no nesting).
    """
    text = _as_str(text)
    bodies: list[str] = []
    pos = 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            return bodies, False
        body_start = start + len(open_tag)
        end = text.find(close_tag, body_start)
        if end < 0:
            return bodies, True
        bodies.append(text[body_start:end])
        pos = end + len(close_tag)


def tags_balanced(text: str, tag: str) -> bool:
    """True iff `<tag>`/`</tag>` occurrences form a balanced sequence (a text without them is balanced).

    Reading left to right, a close tag never comes before its open tag and every open tag is
    closed. `tag` is the bare name (`think`) or the open tag itself (`<think>`).
    """
    text, tag = _as_str(text), _as_str(tag)
    name = tag[1:-1] if tag.startswith("<") and tag.endswith(">") else tag
    if not name or name.startswith("/"):
        return False
    open_tag, close_tag = f"<{name}>", f"</{name}>"
    # Keep the next open and close positions and re-search only the one consumed, so the
    # scan stays linear (a tag cannot start inside the other tag's text).
    depth = 0
    o = text.find(open_tag)
    c = text.find(close_tag)
    while o >= 0 or c >= 0:
        if c < 0 or (0 <= o < c):
            depth += 1
            o = text.find(open_tag, o + len(open_tag))
        else:
            depth -= 1
            if depth < 0:
                return False
            c = text.find(close_tag, c + len(close_tag))
    return depth == 0


def _clamp_top_n(value: Any, default: int, max_top_n: int) -> int:
    """An int in [1, max_top_n]; a missing or unusable value gives `default`."""
    if isinstance(value, bool) or value is None:
        n = default
    elif isinstance(value, int):
        n = value
    elif isinstance(value, float):
        n = int(value) if value == value and abs(value) < 1e9 else default
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit() and len(value) < 10:
        n = int(value.strip())
    else:
        n = default
    return max(1, min(int(max_top_n), n))


def parse_call_body(body: str) -> dict | None:
    """The JSON object of a tool-call body if it has `name` and `arguments`, else None."""
    body = _as_str(body)
    if len(body) > MAX_TOOL_CALL_BODY_CHARS:
        return None
    try:
        obj = json.loads(body)
    except Exception:  # noqa: BLE001 - ValueError, RecursionError (deep nesting), huge ints ...
        return None
    if not isinstance(obj, dict) or "name" not in obj or "arguments" not in obj:
        return None
    return obj


def parse_tool_calls_detailed(
    text: str, *, default_top_n: int = DEFAULT_TOP_N, max_top_n: int = MAX_TOP_N, tool: SearchTool = DEFAULT_TOOL
) -> ToolCallParse:
    """All `<tool_call>` spans of `text`, split into executable calls and malformed ones.

    A call is executable when its body is a JSON object with the tool's name (default
    `"wikipedia_search"`) and `arguments` holding a non-empty string query (`tool.query_arg`).
    The passage count (`tool.top_n_arg`) is optional: a missing or
    unusable value gives `default_top_n`, and any value is clamped to [1, max_top_n].
    An unclosed `<tool_call>` is reported as malformed.
    """
    text = _as_str(text)
    bodies, unclosed = tag_spans(text, TOOL_OPEN, TOOL_CLOSE)
    calls: list[ToolCall] = []
    malformed: list[MalformedCall] = []
    for body in bodies:
        obj = parse_call_body(body)
        if obj is None:
            malformed.append(MalformedCall(body[:200], "body is not a JSON object with name and arguments"))
            continue
        name, args = obj["name"], obj["arguments"]
        if name != tool.name:
            malformed.append(MalformedCall(body[:200], f"unknown tool name {str(name)[:50]!r}, expected {tool.name!r}"))
            continue
        if not isinstance(args, dict):
            malformed.append(MalformedCall(body[:200], "arguments is not a JSON object"))
            continue
        query = args.get(tool.query_arg)
        if not isinstance(query, str) or not query.strip():
            malformed.append(MalformedCall(body[:200], f"arguments.{tool.query_arg} is missing, empty or not a string"))
            continue
        top_n = _clamp_top_n(args.get(tool.top_n_arg), default_top_n, max_top_n)
        calls.append(ToolCall(name=name, arguments=args, query=query.strip(), top_n=top_n))
    if unclosed:
        start = text.rfind(TOOL_OPEN) + len(TOOL_OPEN)
        malformed.append(MalformedCall(text[start:start + 200], "unclosed <tool_call>"))
    return ToolCallParse(calls=calls, malformed=malformed)


def parse_tool_calls(text: str, *, default_top_n: int = DEFAULT_TOP_N, max_top_n: int = MAX_TOP_N,
                     tool: SearchTool = DEFAULT_TOOL) -> list[ToolCall]:
    """The executable calls of `text` (see `parse_tool_calls_detailed` for the malformed ones)."""
    return parse_tool_calls_detailed(text, default_top_n=default_top_n, max_top_n=max_top_n, tool=tool).calls


def tool_call_bodies_valid(text: str) -> bool:
    """docs/method.md §3 format rule: every `<tool_call>` body is JSON with `name` and `arguments`."""
    bodies, unclosed = tag_spans(text, TOOL_OPEN, TOOL_CLOSE)
    return not unclosed and all(parse_call_body(b) is not None for b in bodies)


def extract_memory(text: str) -> str | None:
    """The first non-empty `<memory>...</memory>` span, stripped; None if there is none.

    If a span holds a stray second `<memory>`, the innermost open tag before the close wins.
    """
    text = _as_str(text)
    pos = 0
    while True:
        start = text.find(MEMORY_OPEN, pos)
        if start < 0:
            return None
        end = text.find(MEMORY_CLOSE, start + len(MEMORY_OPEN))
        if end < 0:
            return None
        inner_open = text.rfind(MEMORY_OPEN, start, end)
        body = text[inner_open + len(MEMORY_OPEN):end].strip()
        if body:
            return body
        pos = end + len(MEMORY_CLOSE)


def extract_boxed(text: str) -> str | None:
    """Contents of the last complete `\\boxed{...}` (braces matched, nesting allowed), else None.

    "Last" means the one whose closing brace comes last, so in `\\boxed{\\boxed{x}}` the outer
    one wins. An unclosed `\\boxed{` (for example at the end of a cut-off output) is ignored and
    an earlier complete one is returned. One linear pass with a stack.
    """
    text = _as_str(text)
    stack: list[int] = []  # content start for \boxed{, -1 for a bare {
    last: tuple[int, int] | None = None
    for m in _BRACE_TOKENS.finditer(text):
        tok = m.group()
        if tok == "}":
            if stack:
                start = stack.pop()
                if start >= 0:
                    last = (start, m.start())
        elif tok == "{":
            stack.append(-1)
        else:
            stack.append(m.end())
    return None if last is None else text[last[0]:last[1]]


_THINK_TAGS = re.compile(r"</?think>")


def outside_think(text: str) -> str:
    """The text of an act block outside all `<think>...</think>` spans (nesting-aware, linear).

    An unclosed `<think>` hides the rest of the text; a stray `</think>` is dropped. Pieces
    are joined with newlines so that no tag can be formed across a removed span.
    """
    text = _as_str(text)
    parts, depth, pos = [], 0, 0
    for m in _THINK_TAGS.finditer(text):
        if depth == 0:
            parts.append(text[pos:m.start()])
        depth = depth + 1 if m.group() == THINK_OPEN else max(depth - 1, 0)
        pos = m.end()
    if depth == 0:
        parts.append(text[pos:])
    return "\n".join(parts)


def tagged_outside_think(text: str, open_tag: str, close_tag: str) -> str | None:
    """The first closed, non-empty `open_tag ... close_tag` span of an act block outside every
    thinking span, stripped; None if there is none (a summary or a fold's return text, written
    after the thinking: agent/workflows/summary.py, fold.py)."""
    bodies, _ = tag_spans(outside_think(text), open_tag, close_tag)
    return next((body.strip() for body in bodies if body.strip()), None)


def classify_act(text: str) -> ActKind:
    """Classify an act block (pre-filled `<think>` included) per docs/method.md §1.

    - INVALID if the `<think>` or `<tool_call>` tags are unbalanced, if there is no
      `</think>`, or if any tool call outside the thinking is malformed;
    - TOOL_CALLS if at least one executable call is outside the thinking (tool calls take
      precedence over a boxed answer in the same block: the episode goes on searching);
    - ANSWER if a complete `\\boxed{...}` is outside the thinking;
    - INVALID otherwise (no call and no answer).
    Calls or answers inside the thinking do not count.
    """
    text = _as_str(text)
    if not tags_balanced(text, "think") or not tags_balanced(text, "tool_call") or THINK_CLOSE not in text:
        return ActKind.INVALID
    tail = outside_think(text)
    parsed = parse_tool_calls_detailed(tail)
    if parsed.malformed:
        return ActKind.INVALID
    if parsed.calls:
        return ActKind.TOOL_CALLS
    if extract_boxed(tail) is not None:
        return ActKind.ANSWER
    return ActKind.INVALID
