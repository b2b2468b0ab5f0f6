"""Parsing of agent outputs: hand cases, then fuzzing that nothing raises and stays linear."""
from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings, strategies as st

from memsearcher_jax.agent.parsing import (
    ActKind,
    MalformedCall,
    ToolCall,
    classify_act,
    extract_boxed,
    extract_memory,
    outside_think,
    parse_tool_calls,
    parse_tool_calls_detailed,
    tags_balanced,
    tool_call_bodies_valid,
)


def call(query, top_n=None, name="wikipedia_search"):
    args = {"query": query} if top_n is None else {"query": query, "top_n": top_n}
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


# ---------------------------------------------------------------- tool calls

def test_parse_two_calls_in_order_with_defaults_and_clamping():
    text = "<think>hm</think>" + call("capital of France") + "\n" + call("Eiffel tower", top_n=3)
    calls = parse_tool_calls(text)
    assert [c.query for c in calls] == ["capital of France", "Eiffel tower"]
    assert [c.top_n for c in calls] == [5, 3]
    assert calls[0].name == "wikipedia_search" and calls[0].arguments == {"query": "capital of France"}


@pytest.mark.parametrize(
    "top_n, expected",
    [(0, 1), (-4, 1), (50, 10), ("7", 7), ("seven", 5), (True, 5), (None, 5), (2.9, 2), (float("nan"), 5), ([3], 5)],
)
def test_top_n_is_validated_and_clamped(top_n, expected):
    body = json.dumps({"name": "wikipedia_search", "arguments": {"query": "q", "top_n": top_n}})
    calls = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert len(calls) == 1 and calls[0].top_n == expected


def test_default_top_n_and_max_are_configurable():
    assert parse_tool_calls(call("q"), default_top_n=2)[0].top_n == 2
    assert parse_tool_calls(call("q", top_n=8), max_top_n=4)[0].top_n == 4


@pytest.mark.parametrize(
    "body, reason_part",
    [
        ('{"name": "wikipedia_search", "arguments": {"query": "x"}', "JSON"),  # missing brace
        ('{"name": "wikipedia_search"}', "JSON"),  # no arguments
        ('{"arguments": {"query": "x"}}', "JSON"),  # no name
        ('["wikipedia_search", "x"]', "JSON"),
        ('{"name": "google", "arguments": {"query": "x"}}', "unknown tool"),
        ('{"name": "wikipedia_search", "arguments": "x"}', "not a JSON object"),
        ('{"name": "wikipedia_search", "arguments": {"query": "  "}}', "query"),
        ('{"name": "wikipedia_search", "arguments": {"query": 5}}', "query"),
    ],
)
def test_malformed_calls_are_reported_with_reason(body, reason_part):
    parsed = parse_tool_calls_detailed(f"<tool_call>{body}</tool_call>" + call("ok"))
    assert [c.query for c in parsed.calls] == ["ok"]
    assert len(parsed.malformed) == 1 and reason_part in parsed.malformed[0].reason
    assert not parsed.ok


def test_unclosed_tool_call_is_malformed():
    parsed = parse_tool_calls_detailed(call("a") + '<tool_call>{"name": "wikipedia_search"')
    assert len(parsed.calls) == 1
    assert parsed.malformed[-1].reason == "unclosed <tool_call>"
    assert not tool_call_bodies_valid(call("a") + "<tool_call>{")


def test_tool_call_bodies_valid_only_needs_name_and_arguments():
    # The reward's format rule is weaker than executability: any name, any arguments.
    assert tool_call_bodies_valid('<tool_call>{"name": "x", "arguments": 1}</tool_call>')
    assert not tool_call_bodies_valid('<tool_call>{"name": "x"}</tool_call>')
    assert tool_call_bodies_valid("no calls at all")


# ---------------------------------------------------------------- memory

@pytest.mark.parametrize(
    "text, expected",
    [
        ("<memory> Paris is the capital. </memory>", "Paris is the capital."),
        ("<memory>   </memory> then <memory>\nsecond\n</memory>", "second"),
        ("<memory>first</memory><memory>second</memory>", "first"),
        ("no memory here", None),
        ("<memory>unclosed", None),
        ("<memory></memory>", None),
        ("</memory> <memory>a</memory>", "a"),
        ("<memory>x <memory> inner </memory>", "inner"),
        ("<think>t</think>\n<memory>multi\nline</memory>", "multi\nline"),
    ],
)
def test_extract_memory(text, expected):
    assert extract_memory(text) == expected


# ---------------------------------------------------------------- boxed

@pytest.mark.parametrize(
    "text, expected",
    [
        (r"The answer is \boxed{Paris}.", "Paris"),
        (r"\boxed{a} and later \boxed{b}", "b"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{{nested {deep}} x}", "{nested {deep}} x"),
        (r"\boxed{a} then \boxed{b", "a"),  # unclosed last one: earlier complete one wins
        ("\\boxed{", None),
        (r"no box", None),
        (r"\boxed{}", ""),
        (r"}} \boxed{x}}}", "x"),
        (r"{ \boxed{x}", "x"),
        (r"\boxed{\boxed{x}}", r"\boxed{x}"),
        (r"\boxed {x}", None),
        ("\\boxed{日本 🗻}", "日本 🗻"),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


# ---------------------------------------------------------------- tags

@pytest.mark.parametrize(
    "text, tag, expected",
    [
        ("<think>a</think>", "think", True),
        ("no tags", "think", True),
        ("<think>a", "think", False),
        ("a</think>", "think", False),
        ("</think><think>", "think", False),
        ("<think><think></think></think>", "think", True),
        ("<think></think><think></think>", "<think>", True),
        ("<tool_call>{}</tool_call><tool_call>", "tool_call", False),
        ("<think>a</think>", "", False),
    ],
)
def test_tags_balanced(text, tag, expected):
    assert tags_balanced(text, tag) is expected


# ---------------------------------------------------------------- classify

@pytest.mark.parametrize(
    "text, kind",
    [
        (r"<think>easy</think>\boxed{Paris}", ActKind.ANSWER),
        ("<think>search</think>" + call("q"), ActKind.TOOL_CALLS),
        ("<think>search</think>" + call("q") + call("r"), ActKind.TOOL_CALLS),
        ("<think>both</think>" + call("q") + r"\boxed{x}", ActKind.TOOL_CALLS),
        ("<think>nothing</think> I do not know", ActKind.INVALID),
        (r"<think>never closed \boxed{x}", ActKind.INVALID),
        (r"\boxed{x}", ActKind.INVALID),  # the pre-filled <think> block is missing
        ("<think>x</think>" + call("q") + '<tool_call>{"bad"}</tool_call>', ActKind.INVALID),
        ("<think>x</think><tool_call>" + call("q")[len("<tool_call>"):-len("</tool_call>")], ActKind.INVALID),
        ("<think>" + call("inside think") + r"</think>", ActKind.INVALID),
        (r"<think>\boxed{in think}</think>", ActKind.INVALID),
        (r"<think>a</think></think>\boxed{x}", ActKind.INVALID),
        (r"<think>a</think>\boxed{x}<think>b</think>", ActKind.ANSWER),
        ("<think>a</think>" + call("q") + "<think>more</think>", ActKind.TOOL_CALLS),
        ("<think>a</think><tool_<think>b</think>call>" + call("q")[len("<tool_call>"):], ActKind.INVALID),
    ],
)
def test_classify_act(text, kind):
    assert classify_act(text) is kind


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>a</think>b", "\nb"),
        ("x<think>a<think>b</think>c</think>y", "x\ny"),
        ("x<think>never closed", "x"),
        ("x</think>y", "x\ny"),
        ("plain", "plain"),
    ],
)
def test_outside_think(text, expected):
    assert outside_think(text) == expected


def test_act_kind_values_are_the_spec_names():
    assert {k.value for k in ActKind} == {"answer", "tool_calls", "invalid"}


# ---------------------------------------------------------------- fuzz

FRAGMENTS = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<memory>", "</memory>", "\\boxed{", "{", "}",
    '{"name": "wikipedia_search", "arguments": {"query": "q", "top_n": 3}}', '"', ":", ",", "[", "]",
    "\\", "\n", " ", "a", "é", "🗻", "\x00", "\ud800", "<|im_end|>", "null", "1e999",
]


def check_all(text):
    """Every parser on `text`: nothing raises and results have the documented types."""
    parsed = parse_tool_calls_detailed(text)
    for c in parsed.calls:
        assert isinstance(c, ToolCall) and c.name == "wikipedia_search"
        assert isinstance(c.query, str) and c.query and c.query == c.query.strip()
        assert isinstance(c.top_n, int) and 1 <= c.top_n <= 10
        assert isinstance(c.arguments, dict)
    assert all(isinstance(m, MalformedCall) and m.reason for m in parsed.malformed)
    assert parse_tool_calls(text) == parsed.calls
    mem = extract_memory(text)
    assert mem is None or (isinstance(mem, str) and mem and mem == mem.strip())
    boxed = extract_boxed(text)
    assert boxed is None or (isinstance(boxed, str) and ("\\boxed{" + boxed + "}") in text)
    for tag in ("think", "tool_call", "memory"):
        assert isinstance(tags_balanced(text, tag), bool)
    assert classify_act(text) in set(ActKind)
    assert isinstance(tool_call_bodies_valid(text), bool)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=8), max_size=40))
def test_fuzz_fragment_soup_never_raises(parts):
    check_all("".join(parts))


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_fuzz_arbitrary_text_never_raises(text):
    check_all(text)


@settings(max_examples=100, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10,
))
def test_fuzz_json_arguments_never_raise(arguments):
    body = json.dumps({"name": "wikipedia_search", "arguments": arguments})
    parsed = parse_tool_calls_detailed(f"<think>x</think><tool_call>{body}</tool_call>")
    assert len(parsed.calls) + len(parsed.malformed) == 1
    valid = isinstance(arguments, dict) and isinstance(arguments.get("query"), str) and arguments["query"].strip()
    assert bool(parsed.calls) == bool(valid)


ADVERSARIAL = [
    "<tool_call>" + "[" * 100_000 + "</tool_call>",  # json recursion bomb
    "<tool_call>" + '{"a":' * 50_000 + "1" + "}" * 50_000 + "</tool_call>",
    '<tool_call>{"name": "wikipedia_search", "arguments": {"query": "q", "top_n": ' + "9" * 5000 + "}}</tool_call>",
    '<tool_call>{"name": "wikipedia_search", "arguments": {"query": "q", "top_n": 1e999}}</tool_call>',
    '<tool_call>{"name": "wikipedia_search", "arguments": {"query": "q", "top_n": -1e999}}</tool_call>',
    "\\boxed{" * 200_000,
    "{" * 300_000 + "\\boxed{x}",
    "}" * 300_000,
    "<think>" * 100_000 + "</think>" * 99_999,
    "</think>" * 100_000,
    "<memory>" * 100_000,
    "<memory></memory>" * 60_000,
    "<tool_call>" * 90_000,
    "</tool_call><tool_call>" * 45_000,
    "a" * 1_000_000,
    "é🗻" * 300_000,
]


@pytest.mark.parametrize("i", range(len(ADVERSARIAL)))
def test_adversarial_inputs_never_raise_and_stay_fast(i):
    text = ADVERSARIAL[i]
    t0 = time.perf_counter()
    check_all(text)
    # Linear scans of ~1 MB take well under a second; a quadratic scan would take minutes.
    assert time.perf_counter() - t0 < 5.0


def test_adversarial_results_are_sane():
    assert extract_boxed("\\boxed{" * 1000) is None
    assert extract_boxed("{" * 1000 + "\\boxed{x}") == "x"
    assert not tags_balanced("<think>" * 10 + "</think>" * 9, "think")
    assert extract_memory("<memory>" * 10) is None
    assert parse_tool_calls(ADVERSARIAL[0]) == [] and len(parse_tool_calls_detailed(ADVERSARIAL[0]).malformed) == 1
    # Python's json refuses ints over 4300 digits: the call is reported, not executed.
    assert parse_tool_calls(ADVERSARIAL[2]) == [] and len(parse_tool_calls_detailed(ADVERSARIAL[2]).malformed) == 1
    # An infinite top_n is unusable and falls back to the default; the call still runs.
    assert parse_tool_calls(ADVERSARIAL[3])[0].top_n == 5


def test_non_string_inputs_do_not_raise():
    for bad in (None, b"<memory>x</memory>", 12, ["<think>"]):
        assert classify_act(bad) is ActKind.INVALID
        assert isinstance(parse_tool_calls(bad), list)
    assert extract_memory(b"<memory>x</memory>") == "x"
