"""docs/method.md §3 reward: normalisation, F1/EM, the format gate, and the 0.1 format credit."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from memsearcher_jax.qa_metrics import (
    FORMAT_CREDIT,
    RewardResult,
    compute_reward,
    exact_match,
    normalize_answer,
    token_f1,
)

CALL = ("<tool_call>" + json.dumps({"name": "wikipedia_search", "arguments": {"query": "q", "top_n": 5}})
        + "</tool_call>")


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  A  cat,   an apple!  ", "cat apple"),
        ("Theatre of the Absurd", "theatre of absurd"),
        ("U.S.A.", "usa"),
        ("rock-n-roll", "rocknroll"),
        ("Anne and THE the", "anne and"),
        ("", ""),
        ("Café\tMÜNCHEN\n", "café münchen"),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def f1_by_hand(pred_tokens, gold_tokens):
    common = sum(min(pred_tokens.count(t), gold_tokens.count(t)) for t in set(pred_tokens))
    if common == 0:
        return 0.0
    p, r = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * p * r / (p + r)


@pytest.mark.parametrize(
    "pred, golds, f1",
    [
        ("Paris", ["paris"], 1.0),
        ("the city of Paris", ["Paris"], f1_by_hand(["city", "of", "paris"], ["paris"])),
        ("Barack Obama", ["Obama", "Barack Hussein Obama"],
         f1_by_hand(["barack", "obama"], ["barack", "hussein", "obama"])),
        ("a b b", ["b b c"], f1_by_hand(["b", "b"], ["b", "b", "c"])),  # "a" is an article
        ("London", ["Paris"], 0.0),
        ("yes", ["no"], 0.0),
        ("yes", ["Yes."], 1.0),
        ("yes it is", ["yes"], 0.0),  # gold is yes/no: only an exact match counts
        ("no", ["no way"], 0.0),  # prediction is yes/no and differs
        ("noanswer", ["noanswer"], 1.0),
        ("anything", [], 0.0),
    ],
)
def test_token_f1(pred, golds, f1):
    assert token_f1(pred, golds) == pytest.approx(f1)


def test_exact_match():
    assert exact_match("The Beatles!", ["beatles", "x"])
    assert not exact_match("Beatles band", ["beatles"])
    assert not exact_match("x", [])


def final(answer):
    return "<think>I know it.</think>\\boxed{" + answer + "}"


def test_correct_answer_gets_f1_and_em():
    r = compute_reward([final("Paris")], True, ["paris", "City of Paris"])
    assert r == RewardResult(reward=1.0, em=1.0, f1=1.0, format_ok=True, answer="Paris", failure=None)


def test_partial_answer_gets_f1():
    r = compute_reward([final("Paris France")], True, ["Paris"])
    assert r.reward == pytest.approx(2 / 3) and r.em == 0.0 and r.format_ok


def test_wrong_but_well_formed_answer_gets_format_credit():
    r = compute_reward([final("London")], True, ["Paris"])
    assert r.reward == FORMAT_CREDIT == 0.1 and r.f1 == 0.0 and r.format_ok and r.answer == "London"


def test_yes_no_mismatch_gets_format_credit_only():
    r = compute_reward([final("yes")], True, ["no"])
    assert r.reward == 0.1 and r.f1 == 0.0


def test_nested_braces_answer():
    r = compute_reward([final("{Paris}")], True, ["Paris"])
    assert r.answer == "{Paris}" and r.reward == 1.0


def test_memory_workflow_final_conversation_with_memory_block_first():
    # Blocks of a final conversation in order; the answer is in the last (act) block.
    blocks = ["<memory>Paris is the capital of France.</memory>", final("Paris")]
    assert compute_reward(blocks, True, ["Paris"]).reward == 1.0


@pytest.mark.parametrize(
    "blocks, eos, failure_part",
    [
        ([final("Paris")], False, "end-of-turn"),
        ([], True, "no assistant blocks"),
        (["<think>unclosed \\boxed{Paris}"], True, "<think>"),
        (["I know.</think>\\boxed{Paris}"], True, "<think>"),  # pre-filled <think> not re-attached
        (["<think>a</think><tool_call>{}\\boxed{Paris}"], True, "<tool_call>"),
        (["<think>a</think></tool_call>\\boxed{Paris}"], True, "<tool_call>"),
        (["<think>a</think><tool_call>not json</tool_call>\\boxed{Paris}"], True, "JSON"),
        (['<think>a</think><tool_call>{"name": "wikipedia_search"}</tool_call>\\boxed{Paris}'], True, "JSON"),
        (["<think>a</think>" + CALL], True, "boxed"),  # searched but never answered
        (["<think>a</think> Paris"], True, "boxed"),
        (["<think>a</think>\\boxed{Paris"], True, "boxed"),
        ([final("Paris"), "<memory>ends on memory</memory>"], True, "boxed"),
        (["<think>bad", final("Paris")], True, "block 0"),  # any block's tags count
    ],
)
def test_format_gate_gives_zero(blocks, eos, failure_part):
    r = compute_reward(blocks, eos, ["Paris"])
    assert r.reward == 0.0 and not r.format_ok and r.em == 0.0 and r.f1 == 0.0
    assert failure_part in r.failure


def test_valid_tool_call_in_last_block_with_answer_is_well_formed():
    # Format is only about tags and JSON: a call body with name+arguments is fine.
    r = compute_reward(["<think>a</think>" + CALL + "\\boxed{Paris}"], True, ["Paris"])
    assert r.format_ok and r.reward == 1.0


def test_last_boxed_is_the_answer():
    r = compute_reward(["<think>\\boxed{London}</think>\\boxed{Paris}"], True, ["Paris"])
    assert r.answer == "Paris" and r.reward == 1.0


@pytest.mark.parametrize("golds", [[], "Paris", None])
def test_bad_golds_raise_naming_golds(golds):
    with pytest.raises(ValueError, match="golds"):
        compute_reward([final("Paris")], True, golds)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30), st.lists(st.text(max_size=20), min_size=1, max_size=3), st.booleans())
def test_reward_is_zero_point_one_or_f1_in_range(answer, golds, eos):
    r = compute_reward([final(answer.replace("}", "").replace("{", "").replace("<", ""))], eos, golds)
    assert 0.0 <= r.reward <= 1.0
    if not eos:
        assert r.reward == 0.0
    elif r.f1 > 0:
        assert r.reward == r.f1
    else:
        assert r.reward == 0.1
    assert r.em in (0.0, 1.0)
    # EM implies F1 = 1 unless both sides normalise to nothing.
    if r.em == 1.0 and normalize_answer(r.answer or ""):
        assert r.f1 == pytest.approx(1.0)
