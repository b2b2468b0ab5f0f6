"""Prompts assembled in token space with Qwen chat markup (docs/method.md §1).

The fixed pieces (system prompts, role headers, instructions) are tokenized once; only the
question, memory and documents are tokenized per call. Text pieces are cut exactly at
special/added-token boundaries, so an assembled sequence equals tokenizing its rendered
string in one go (tests check this). Text from outside the builder (a question, a memory, a
document, an operations entry: `Untrusted`) encodes as plain text: a special token or a tag
written in it (`<|im_end|>`, `</tool_response>`, `<memory>`) stays characters, so a retrieved
page or a memory cannot end a turn or forge the context's structure. Tags are tokens only
where the builder's own templates put them.

MemSearcher turn (one conversation):
    context  = <|im_start|>system\\n{SYSTEM}<|im_end|>\\n
               <|im_start|>user\\n<question> q </question>\\n<memory> m </memory><|im_end|>\\n
               <|im_start|>assistant\\n<think>
    act      = ...</think> then \\boxed{..} or <tool_call>..</tool_call>s, ending <|im_end|>  (generated)
    obs      = \\n<|im_start|>user\\n<tool_response>\\n..\\n</tool_response>\\n... {UPDATE}<|im_end|>\\n
               <|im_start|>assistant\\n
    update   = ...<memory>..</memory><|im_end|>  (generated)

ReAct baseline (one growing conversation): the same system prompt minus memory, the
question, then after each act `\\n<|im_start|>user\\n{tool responses}<|im_end|>\\n<|im_start|>assistant\\n<think>`.
"""
from __future__ import annotations

import dataclasses
import json
import re
import weakref
from collections.abc import Sequence

from memsearcher_jax.agent.tools import DEFAULT_TOOL, SearchTool
from retrieval.base import ERROR_HIT_ID, Hit

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
THINK, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<think>", "<tool_response>", "</tool_response>"


@dataclasses.dataclass(frozen=True)
class Untrusted:
    """Text that did not come from the prompt builder (question, memory, document, ops entry):
    `PromptBuilder.encode_parts` encodes it as plain text, never as tag or special tokens."""

    text: str


def _is_markup(content: str, special: bool) -> bool:
    """An added token that marks structure: a special token or a tag `<...>`. Not a word the
    tokenizer added whole (the reading vocabulary's names and values), which stays one token."""
    return special or (len(content) > 2 and content.startswith("<") and content.endswith(">"))


# One markup-free copy of each tokenizer's backend (it takes seconds to build for a 150k vocabulary).
_PLAIN_BACKENDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plain_backend(tokenizer):
    """(backend, id map): the tokenizer's `tokenizers` backend without its markup added tokens,
    what the text would be had those tokens never been added, and the map from the ids it gives
    the other added tokens (renumbered on loading) to the tokenizer's own. None for a tokenizer
    without a backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    if tokenizer not in _PLAIN_BACKENDS:
        from tokenizers import Tokenizer

        spec = json.loads(backend.to_str())
        kept = [a for a in spec.get("added_tokens") or [] if not _is_markup(a["content"], a.get("special", False))]
        spec["added_tokens"] = kept
        plain = Tokenizer.from_str(json.dumps(spec))
        plain.no_truncation()
        plain.no_padding()
        _PLAIN_BACKENDS[tokenizer] = (plain, {plain.token_to_id(a["content"]): a["id"] for a in kept})
    return _PLAIN_BACKENDS[tokenizer]


def tool_schema(default_top_n: int, tool: SearchTool = DEFAULT_TOOL) -> dict:
    """The search tool as an OpenAI-style JSON function schema."""
    return tool.schema(default_top_n)


def tool_block(default_top_n: int, tool: SearchTool = DEFAULT_TOOL) -> str:
    example = json.dumps({"name": tool.name, "arguments": {tool.query_arg: "...", tool.top_n_arg: default_top_n}})
    return (
        "# Tools\n<tools>\n" + json.dumps(tool.schema(default_top_n)) + "\n</tools>\n\n"
        "To search, write one or more tool calls, each as\n<tool_call>" + example + "</tool_call>\n"
    )


def memsearcher_system_prompt(default_top_n: int = 5, tool: SearchTool = DEFAULT_TOOL) -> str:
    return (
        "You answer questions by searching Wikipedia. Each turn you see the question and your memory: "
        "the notes you kept from earlier searches.\n\n"
        + tool_block(default_top_n, tool)
        + "\n# Steps\n"
        "1. Think inside <think> </think>.\n"
        "2. If your memory is enough, give the final answer as \\boxed{answer}, a few words only. "
        "Otherwise search with tool calls.\n"
        "3. After the results arrive, write your updated memory inside <memory> </memory>: "
        "keep every fact that helps answer the question, drop the rest."
    )


def react_system_prompt(default_top_n: int = 5, tool: SearchTool = DEFAULT_TOOL) -> str:
    return (
        "You answer questions by searching Wikipedia.\n\n"
        + tool_block(default_top_n, tool)
        + "\n# Steps\n"
        "1. Think inside <think> </think>.\n"
        "2. If you know enough, give the final answer as \\boxed{answer}, a few words only. "
        "Otherwise search with tool calls; the results come back in the next message."
    )


# The N-answer format of multi-objective questions (MEM1's task), added to every workflow's system
# prompt when the task has them (`PromptBuilder(multi_answer=True)`): the reward scores the boxed
# answer's ";"-separated parts against the questions in order, so the prompt must say so.
MULTI_ANSWER_RULE = ("The question may hold several questions separated by \"; \": answer every one in a single "
                     "\\boxed{answer 1; answer 2; ...}, in the order they are asked.")
COMPACT_MULTI_ANSWER_RULE = "Several questions q1; q2: answer \\boxed{a1; a2}."


MEMORY_UPDATE_INSTRUCTION = (
    "Read the search results above. Update your memory with what helps answer the question "
    "and return the full updated memory inside <memory> </memory>."
)

# A compact prompt style for tiny models trained from scratch (the embedded default): the same
# tool, tags and workflow, stated in a few tokens so that short contexts train fast on a CPU.
def compact_system_prompt(tool: SearchTool = DEFAULT_TOOL) -> str:
    return (f"Answer by searching. Tool: {tool.name}({tool.query_arg}, {tool.top_n_arg}). Think in <think></think>, "
            "call <tool_call>{json}</tool_call>, answer \\boxed{}.")


COMPACT_SYSTEM_PROMPT = compact_system_prompt()
COMPACT_UPDATE_INSTRUCTION = "Update <memory></memory>."
PROMPT_STYLES = ("full", "compact")
# MEM1's hint (`agent.hint`), the last line of the user message every act reads: "turns" states the
# turns left (this one included), "turns_and_questions" also the questions no search has named yet.
HINT_MODES = ("none", "turns", "turns_and_questions")


def hint_text(mode: str, turns_left: int, unsearched: int) -> str:
    """The hint line in plain words (no tag, no special token): "" for mode "none"."""
    if mode == "none":
        return ""
    turns = f"turns left: {max(int(turns_left), 0)}"
    return turns if mode == "turns" else f"{turns}; questions not yet searched: {int(unsearched)}"
NO_RESULTS = "No results found."
REFUSED_HIT_ID = "__refused__"  # the note standing for an act's calls over agent.max_searches_per_act


def refused_searches(refused: int, limit: int) -> list[Hit]:
    """The response to an act's `refused` calls over `limit` (none of them searched): one short note."""
    return [Hit(REFUSED_HIT_ID, f"{refused} more search{'es' * (refused > 1)} refused: at most {limit} searches "
                                "per turn")]


def format_hits(hits: Sequence[Hit]) -> str:
    """Documents as `Doc i (Title: title) text`, one per line; an error hit as its message; a
    refusal (`refused_searches`) as its note."""
    if not hits:
        return NO_RESULTS
    lines = []
    for i, hit in enumerate(hits, 1):
        if hit.id == REFUSED_HIT_ID:
            lines.append(hit.contents)
            continue
        if hit.id == ERROR_HIT_ID:
            lines.append(f"Search failed: {hit.contents}")
            continue
        title, _, text = hit.contents.partition("\n")
        lines.append(f"Doc {i} (Title: {title.strip()}) {text.strip()}".rstrip())
    return "\n".join(lines)


class PromptBuilder:
    """Builds token-id prompts for the MemSearcher and ReAct workflows.

    tokenizer: a Hugging Face Qwen tokenizer (chat markup `<|im_start|>`/`<|im_end|>`,
    `<think>` and `<tool_response>` as single tokens).
    tool: the search tool the prompt describes (`agent.tools`; default wikipedia_search).
    stop_ids: the ids a generation ends on. `<|im_end|>` always; add the model's own
    end-of-sequence ids (Qwen2.5-Instruct's generation_config lists `<|endoftext|>` too): a
    response that ends on any of them is ended, and nothing after it is generated or trained.
    multi_answer: every system prompt also states the N-answer format (`MULTI_ANSWER_RULE`).
    hint: `HINT_MODES`; the workflows and the demonstrator end each act's user message with
    `hint_line` (docs/method.md §8).
    """

    def __init__(self, tokenizer, *, default_top_n: int = 5, style: str = "full", stop_ids=(),
                 tool: SearchTool = DEFAULT_TOOL, multi_answer: bool = False, hint: str = "none"):
        if style not in PROMPT_STYLES:
            raise ValueError(f"prompt style {style!r}; expected one of {PROMPT_STYLES}")
        if hint not in HINT_MODES:
            raise ValueError(f"agent.hint={hint!r}; expected one of {HINT_MODES}")
        self.hint = hint
        self.tokenizer = tokenizer
        self.default_top_n = default_top_n
        self.style = style
        self.tool = tool
        self.multi_answer = multi_answer
        self.im_start_id = self._single_id(IM_START)
        self.eos_id = self._single_id(IM_END)  # the end-of-turn token generation stops on
        self.pad_id = self._single_id(ENDOFTEXT)
        self.think_id = self._single_id(THINK)
        self.tool_response_open_id = self._single_id(TOOL_RESPONSE_OPEN)
        self.tool_response_close_id = self._single_id(TOOL_RESPONSE_CLOSE)
        self.stop_ids: tuple[int, ...] = tuple(dict.fromkeys([self.eos_id, *(int(i) for i in stop_ids)]))
        vocab = len(tokenizer)
        bad = [i for i in self.stop_ids if not 0 <= i < vocab]
        if bad:
            raise ValueError(f"stop ids {bad} are outside the tokenizer's vocabulary [0, {vocab})")

        s, e, nl = self.im_start_id, self.eos_id, self.encode("\n")
        mem_sys, react_sys, update = (
            (memsearcher_system_prompt(default_top_n, tool), react_system_prompt(default_top_n, tool),
             MEMORY_UPDATE_INSTRUCTION)
            if style == "full" else (compact_system_prompt(tool),) * 2 + (COMPACT_UPDATE_INSTRUCTION,))
        self._mem_system = [s, *self.encode("system\n" + self.with_answer_rule(mem_sys)), e, *nl]
        self._react_system = [s, *self.encode("system\n" + self.with_answer_rule(react_sys)), e, *nl]
        self._user_header = [s, *self.encode("user\n")]
        self._turn_end_newline = [e, *nl]
        self._assistant_header = [s, *self.encode("assistant\n")]
        self._newline = nl
        # Tags: the added tokens `<...>` that are not special (special ones are split anyway).
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self._tags = {tk.content: int(i) for i, tk in added.items()
                      if not getattr(tk, "special", False) and _is_markup(tk.content, False)}
        self._tag_re = (re.compile("|".join(re.escape(t) for t in sorted(self._tags, key=len, reverse=True)))
                        if self._tags else None)
        self._system_cache: dict[str, list[int]] = {}
        self._obs_user_header = [*nl, *self._user_header]
        self._update_instruction = self.encode(update)
        self._update_text = update
        # Asserts the pieces do not merge across boundaries: "user\n" + "<question>" etc.
        for piece in ("system\n", "user\n", "assistant\n"):
            if self.encode(piece + "<x")[: len(self.encode(piece))] != self.encode(piece):
                raise ValueError(f"tokenizer merges {piece!r} with the following text; token-space assembly "
                                 "would differ")

    # ------------------------------------------------------------------ helpers
    def _single_id(self, token: str) -> int:
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"tokenizer must encode {token!r} as one token (Qwen chat markup), got {ids}")
        return ids[0]

    def encode(self, text: str) -> list[int]:
        """The builder's own text to ids: tags in it become tag tokens, special-token strings stay
        plain text. Text from elsewhere goes through `encode_plain` / `encode_parts`."""
        if not text:
            return []
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def _has_tag(self, text: str) -> bool:
        if self._tag_re is None:
            return False
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        normalizer = getattr(backend, "normalizer", None)
        return bool(self._tag_re.search(text) or (normalizer and self._tag_re.search(normalizer.normalize_str(text))))

    def encode_plain(self, text: str) -> list[int]:
        """Text from outside the builder to ids: tags and special tokens in it stay characters
        (other added tokens, such as the reading vocabulary's names, stay whole). Text without a
        tag encodes exactly as `encode` does."""
        if not self._has_tag(text):
            return self.encode(text)
        plain = _plain_backend(self.tokenizer)
        if plain is not None:
            backend, ids_of = plain
            return [ids_of.get(i, i) for i in backend.encode(text, add_special_tokens=False).ids]
        ids, pos = [], 0  # a tokenizer without a backend: each tag written as "<" + the rest
        for m in self._tag_re.finditer(text):
            ids += self.encode(text[pos:m.start()]) + self.encode(m.group()[0]) + self.encode(m.group()[1:])
            pos = m.end()
        return ids + self.encode(text[pos:])

    def encode_parts(self, *parts: str | Untrusted) -> list[int]:
        """The builder's own text (str: its tags become tag tokens) and `Untrusted` text (plain)
        concatenated, as ids. Without a tag in the untrusted parts this equals encoding the
        joined string in one go: the text between two tags is encoded as one piece either way."""
        ids: list[int] = []
        gap: list[str] = []
        for part in parts:
            if isinstance(part, Untrusted):
                gap.append(part.text)
                continue
            pos = 0
            for m in self._tag_re.finditer(part) if self._tag_re is not None else ():
                gap.append(part[pos:m.start()])
                ids += self.encode_plain("".join(gap)) + [self._tags[m.group()]]
                gap, pos = [], m.end()
            gap.append(part[pos:])
        return ids + self.encode_plain("".join(gap))

    def _tool_responses(self, results: Sequence[Sequence[Hit]], max_tokens: int = 0) -> list[int]:
        """`<tool_response>\n{docs}\n</tool_response>` blocks joined by newlines, one per call.

        max_tokens > 0: each call's documents get an equal share of that many tokens; a longer
        one is cut and says so (`[truncated to N tokens]`), so one observation never exceeds the
        cap by more than the tags and notes."""
        share = max_tokens // max(len(results), 1) if max_tokens > 0 else 0
        return self._join_responses([self._response_body(hits) for hits in results], share)

    def _response_body(self, hits: Sequence[Hit]) -> list[int]:
        return self.encode_plain("\n" + format_hits(hits) + "\n")  # documents are untrusted

    def _join_responses(self, bodies: Sequence[list[int]], share: int) -> list[int]:
        ids: list[int] = []
        for k, body in enumerate(bodies):
            if k:
                ids += self._newline
            if share and len(body) > share:
                note = self.encode(f"\n[truncated to {share} tokens]\n")
                body = body[:max(share - len(note), 0)] + note
            ids += [self.tool_response_open_id, *body, self.tool_response_close_id]
        return ids

    # ------------------------------------------------------------------ generic pieces (any workflow)
    def with_answer_rule(self, system: str) -> str:
        """`system`, followed by the N-answer format when the builder states it (multi_answer)."""
        if not self.multi_answer:
            return system
        rule = MULTI_ANSWER_RULE if self.style == "full" else COMPACT_MULTI_ANSWER_RULE
        return f"{system}\n{rule}" if self.style == "full" else f"{system} {rule}"

    def hint_line(self, turns_left: int, unsearched: int) -> str:
        """The hint line this builder shows (`hint_text` in its mode; "" when it shows none)."""
        return hint_text(self.hint, turns_left, unsearched)

    @staticmethod
    def hint_parts(hint: str) -> tuple[str, ...]:
        """The hint on its own line at the end of a user message (nothing for no hint)."""
        return ("\n" + hint,) if hint else ()

    def system_ids(self, system: str) -> list[int]:
        """`<|im_start|>system\\n{system}<|im_end|>\\n` (with the answer rule, if any), tokenized once per
        distinct text."""
        if system not in self._system_cache:
            self._system_cache[system] = [self.im_start_id, *self.encode("system\n" + self.with_answer_rule(system)),
                                          self.eos_id, *self._newline]
        return self._system_cache[system]

    def chat_context(self, system: str, *user: str | Untrusted) -> list[int]:
        """A system message, one user message (`encode_parts(*user)`), then the assistant header
        with `<think>` pre-filled."""
        return [*self.system_ids(system), *self._user_header, *self.encode_parts(*user), *self._turn_end_newline,
                *self._assistant_header, self.think_id]

    def tool_message(self, results: Sequence[Sequence[Hit]], max_tokens: int = 0, instruction: str = "",
                     reopen_think: bool = False) -> list[int]:
        """Tokens injected after an act (which ended with its stop token): the tool responses as a
        user message (then `instruction` on its own line, if any), the assistant header, and
        `<think>` when the next call is an act."""
        tail = [*self._newline, *self.encode(instruction)] if instruction else []
        return [*self._obs_user_header, *self._tool_responses(results, max_tokens), *tail, *self._turn_end_newline,
                *self._assistant_header, *([self.think_id] if reopen_think else [])]

    def fit_tool_message(self, results: Sequence[Sequence[Hit]], total: int, instruction: str = "",
                         reopen_think: bool = False) -> list[int]:
        """`tool_message` held to at most `total` tokens in all, markup and notes included: the
        documents get the largest equal share that fits, each cut one saying so. When not even
        the notes fit, one note replaces the responses; below the bare markup (about 12 tokens)
        the bare markup is returned."""
        tail = [*self._newline, *self.encode(instruction)] if instruction else []
        end = [*tail, *self._turn_end_newline, *self._assistant_header, *([self.think_id] if reopen_think else [])]
        bodies = [self._response_body(hits) for hits in results]
        room = total - len(self._obs_user_header) - len(end)

        def fits(share: int) -> bool:
            return len(self._join_responses(bodies, share)) <= room

        if fits(0):
            return [*self._obs_user_header, *self._join_responses(bodies, 0), *end]
        # The largest share that fits (the length grows with the share above the note's size).
        lo, hi = 0, max((len(b) for b in bodies), default=0)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        if lo:
            responses = self._join_responses(bodies, lo)
        else:
            note = [self.tool_response_open_id,
                    *self.encode(f"\n[{len(results)} search results left out: over the {total}-token limit]\n"),
                    self.tool_response_close_id]
            responses = note if len(note) <= room else []
        return [*self._obs_user_header, *responses, *end]

    # ------------------------------------------------------------------ MemSearcher
    def memsearcher_context(self, question: str, memory: str = "", hint: str = "") -> list[int]:
        """System + `<question> q </question>\\n<memory> m </memory>` (+ `\\n` hint) + assistant header + `<think>`."""
        q, m = question.strip(), (memory or "").strip()
        memory_parts = ("<memory> ", Untrusted(m), " </memory>") if m else ("<memory> </memory>",)
        user = self.encode_parts("<question> ", Untrusted(q), " </question>\n", *memory_parts, *self.hint_parts(hint))
        return [*self._mem_system, *self._user_header, *user, *self._turn_end_newline,
                *self._assistant_header, self.think_id]

    def observation(self, results: Sequence[Sequence[Hit]], max_tokens: int = 0) -> list[int]:
        """Tokens injected after the act (which ended with <|im_end|>): tool responses, the
        memory-update instruction, and the assistant header. `results`: one hit list per call;
        max_tokens > 0: the whole observation held to that many tokens, markup included, its
        documents cut to fit (`fit_tool_message`; 0: no cap)."""
        if max_tokens > 0:
            return self.fit_tool_message(results, max_tokens, self._update_text)
        return [*self._obs_user_header, *self._tool_responses(results, max_tokens), *self._newline,
                *self._update_instruction, *self._turn_end_newline, *self._assistant_header]

    # ------------------------------------------------------------------ ReAct baseline
    def react_context(self, question: str, hint: str = "") -> list[int]:
        """System + `<question> q </question>` (+ `\\n` hint) + assistant header + `<think>`."""
        question_ids = self.encode_parts("<question> ", Untrusted(question.strip()), " </question>",
                                         *self.hint_parts(hint))
        return [*self._react_system, *self._user_header, *question_ids,
                *self._turn_end_newline, *self._assistant_header, self.think_id]

    def react_observation(self, results: Sequence[Sequence[Hit]], max_tokens: int = 0, hint: str = "") -> list[int]:
        """Tokens appended after an act: the tool responses (then the hint on its own line) as a user
        message, then `<think>` again."""
        return self.tool_message(results, max_tokens, hint, reopen_think=True)

    # ------------------------------------------------------------------ decoding
    def decode(self, ids: Sequence[int]) -> str:
        """Ids to text, special tokens kept as text (`<|im_end|>` shows)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def split_generation(self, ids: Sequence[int]) -> tuple[list[int], bool]:
        """Generated ids -> (ids up to but excluding the first stop id or pad, ended).

        ended is True iff generation stopped on one of `stop_ids`; a pad that is not a stop
        id, or a length cut-off, gives False.
        """
        ids = [int(i) for i in ids]
        for k, t in enumerate(ids):
            if t in self.stop_ids:
                return ids[:k], True
            if t == self.pad_id:
                return ids[:k], False
        return ids, False

    def ends_turn(self, tokens: Sequence[int], finish_reason: str) -> bool:
        """Whether a sampler completion ended on a stop id (not on its budget)."""
        return finish_reason == "stop" and bool(tokens) and int(tokens[-1]) in self.stop_ids

    def decode_act(self, ids: Sequence[int]) -> str:
        """An act generation as text with the pre-filled `<think>` re-attached and the stop token
        removed: the form `classify_act` and `compute_reward` expect."""
        body, _ = self.split_generation(ids)
        return THINK + self.decode(body)

    def decode_update(self, ids: Sequence[int]) -> str:
        """A memory-update generation as text, stop token removed."""
        body, _ = self.split_generation(ids)
        return self.decode(body)

    def count_tokens(self, text: str) -> int:
        """Token count of untrusted `text` tokenized on its own (as plain text)."""
        return len(self.encode_plain(text))

    def memory_tokens(self, memory: str) -> int:
        """How many tokens `memory` adds to the next context, compared with an empty memory
        (the number to hold against the memory budget)."""
        m = (memory or "").strip()
        if not m:
            return 0
        return len(self.encode_parts("<memory> ", Untrusted(m), " </memory>")) - len(self.encode("<memory> </memory>"))
