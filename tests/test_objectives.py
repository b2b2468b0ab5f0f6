"""Multi-objective questions (MEM1's task): joining N questions, parsing the N-part answer, the
mean per-objective reward; one objective is scored exactly as a single question always was."""
from __future__ import annotations

import pytest
from hypothesis import example, given, settings, strategies as st

from memsearcher_jax.data.synthetic import check_objectives, generate_world, join_objectives, objectives_of
from memsearcher_jax.qa_metrics import (
    FORMAT_CREDIT,
    compute_reward,
    objective_golds,
    objective_scores,
    objectives_reward,
    split_answers,
    token_f1,
)


def final(answer: str) -> str:
    return "<think>done</think>\nThe answer is \\boxed{" + answer + "}.<|im_end|>"


@pytest.fixture(scope="module")
def world():
    return generate_world(seed=0, num_entities=40)


# ----------------------------------------------------------------------------- joining questions

def test_one_objective_gives_the_rows_as_they_are(world):
    joined = join_objectives(world.train, 1, seed=3)
    assert joined == world.train and all(a is b for a, b in zip(joined, world.train))
    assert objectives_of(world.train[0]) == [world.train[0]]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_n_objectives_join_n_distinct_rows_of_the_split(world, n):
    joined = join_objectives(world.heldout, n, seed=0)
    assert len(joined) == len(world.heldout)
    held_ids = {r["id"] for r in world.heldout}
    for i, q in enumerate(joined):
        parts = objectives_of(q)
        assert len(parts) == n and len({p["id"] for p in parts}) == n
        assert {p["id"] for p in parts} <= held_ids  # never a training question in a held-out one
        assert world.heldout[i] in parts  # row i anchors question i
        assert q["question"] == "; ".join(p["question"] for p in parts)
        assert q["golden_answers"] == [p["golden_answers"] for p in parts]
    assert len({q["id"] for q in joined}) == len(joined)


def test_join_is_deterministic_in_seed(world):
    a, b = join_objectives(world.train, 2, seed=5), join_objectives(world.train, 2, seed=5)
    assert a == b
    assert join_objectives(world.train, 2, seed=6) != a


def test_anchor_is_not_always_first(world):
    joined = join_objectives(world.train, 2, seed=0)
    firsts = sum(q["objectives"][0] is row for q, row in zip(joined, world.train))
    assert 0 < firsts < len(joined)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, None])
def test_objectives_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=r"world\.objectives"):
        check_objectives(bad)


def test_too_few_rows_names_the_key(world):
    with pytest.raises(ValueError, match=r"world\.objectives=4.*only 3"):
        join_objectives(world.train[:3], 4)


# ----------------------------------------------------------------------------- answer parsing

@pytest.mark.parametrize("answer, n, parts", [
    ("Paris", 1, ["Paris"]),
    ("Paris; London", 1, ["Paris; London"]),  # one objective: never split, as always
    (" Paris ; 1923 ", 2, ["Paris", "1923"]),
    ("Paris;1923", 2, ["Paris", "1923"]),
    ("Paris", 3, ["Paris", "", ""]),
    ("Paris;; 1923", 3, ["Paris", "", "1923"]),
    ("a; b; c; d", 2, ["a", "b; c; d"]),  # extra parts stay in the last one
    ("", 2, ["", ""]),
])
def test_split_answers(answer, n, parts):
    assert split_answers(answer, n) == parts


def test_split_answers_rejects_zero_objectives():
    with pytest.raises(ValueError, match="objectives"):
        split_answers("a", 0)


@pytest.mark.parametrize("golds, expected", [
    (["Paris"], [["Paris"]]),
    (["Lopa", "Lopa city"], [["Lopa", "Lopa city"]]),
    ([["Lopa", "Lopa city"], ["1923"]], [["Lopa", "Lopa city"], ["1923"]]),
])
def test_objective_golds(golds, expected):
    assert objective_golds(golds) == expected


@pytest.mark.parametrize("golds", [[], "Paris", None, [["a"], "b"], [["a"], []], [[1]]])
def test_malformed_golds_raise_naming_golds(golds):
    with pytest.raises(ValueError, match="golds"):
        compute_reward([final("a")], True, golds)


# ----------------------------------------------------------------------------- the reward

TWO = [["Lopa", "Lopa city"], ["1923"]]


# The numbers worked by hand: "1923 rome" against "1923" has P 1/2, R 1, F1 2/3; "lopa town" against
# "lopa" the same (against "lopa city" F1 1/2, the lower alias). The reward of N >= 2 is
# 0.1 + 0.9 x mean F1: 0.1 + 0.9 x 1/2 = 0.55, 0.1 + 0.9 x 5/6 = 0.85.
@pytest.mark.parametrize("answer, em, f1, reward", [
    ("Lopa; 1923", 1.0, 1.0, 1.0),
    ("Lopa city;1923", 1.0, 1.0, 1.0),  # an alias, no space after the separator
    ("  lopa ;  1923 ", 1.0, 1.0, 1.0),  # whitespace and case
    ("1923; Lopa", 0.0, 0.0, 0.1),  # order matters: part k answers question k
    ("Lopa", 0.5, 0.5, 0.55),  # the second part missing
    ("; 1923", 0.5, 0.5, 0.55),  # the first part empty
    ("Lopa; 1923; Rome", 0.5, 5 / 6, 0.85),  # an extra part lowers the last objective
    ("Lopa town; 1923", 0.5, 5 / 6, 0.85),  # partial credit per objective
])
def test_two_objective_scores(answer, em, f1, reward):
    r = compute_reward([final(answer)], True, TWO)
    assert r.format_ok and r.answer == answer
    assert r.em == pytest.approx(em) and r.f1 == pytest.approx(f1)
    assert r.reward == pytest.approx(reward)


@pytest.mark.parametrize("n", range(1, 65))
def test_an_all_right_answer_scores_exactly_one_and_rft_keeps_it(n):
    """At 9, 18, 36 or 41 questions 0.9 x N / N is 0.9999999999999999: the reward must be 1.0 itself,
    and the RFT control (which keeps rewards that reach 1) must keep the trajectory."""
    from memsearcher_jax.app.rft import kept_trajectories

    golds = [[f"city {k}"] for k in range(n)]
    r = compute_reward([final("; ".join(f"city {k}" for k in range(n)))], True, golds)
    assert (r.em, r.f1, r.reward) == (1.0, 1.0, 1.0)
    assert kept_trajectories(["t"], [r]) == ["t"]


def test_partial_progress_never_scores_below_all_wrong():
    # The paper's rule on the mean F1 (F1 if F1 > 0 else 0.1) scored these 0.0999 and 0.083 against
    # 0.1 for all wrong: GRPO was pushed away from a part half right.
    golds = [["Lopa"], ["1923"]]
    partial, wrong = (compute_reward([final(a)], True, golds).reward for a in ("Lopa a b c d e f g h i; 1800",
                                                                                 "Rome; 1800"))
    assert wrong == pytest.approx(FORMAT_CREDIT) and partial > wrong
    eight = [[f"city {k}"] for k in range(8)]
    half = compute_reward([final("; ".join(["city"] + ["x"] * 7))], True, eight).reward
    assert half > compute_reward([final("; ".join(["x"] * 8))], True, eight).reward == pytest.approx(FORMAT_CREDIT)
    assert compute_reward([final("; ".join(f"city {k}" for k in range(8)))], True, eight).reward == 1.0


WORDS = ["lopa", "rome", "city", "1923", "1800", "new", "york", "the", "a", "yes", "no", "x"]
phrase = st.lists(st.sampled_from(WORDS), max_size=12).map(" ".join)
alias = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(golds=st.lists(st.lists(alias, min_size=1, max_size=2), min_size=2, max_size=64), data=st.data())
@example(golds=[["lopa"], ["1923"]], data=None)  # the counter-example, run on every check
@example(golds=[["rome", "lopa city"], ["lopa"]], data="tie")  # two F1s of 2/11 that differ in the last bit
def test_reward_rises_with_every_objectives_f1(golds, data):
    """N >= 2: changing one objective's part of a partial answer changes the reward in the direction
    (and, strictly, whenever) its F1 changes; the other objectives' parts stay as they are."""
    n = len(golds)
    if data is None:
        parts, k, other = ["rome", "1800"], 0, "lopa x x x x x x x x x"
    elif data == "tie":
        parts, k, other = [" ".join(["lopa"] * 9), "x"], 0, " ".join(["lopa"] * 9 + ["rome"])
    else:
        parts = data.draw(st.lists(phrase, min_size=n, max_size=n))
        k, other = data.draw(st.integers(0, n - 1)), data.draw(phrase)
    changed = parts[:k] + [other] + parts[k + 1:]
    before, after = (compute_reward([final("; ".join(p))], True, golds) for p in (parts, changed))
    f1_before, f1_after = token_f1(parts[k], golds[k]), token_f1(other, golds[k])
    assert before.format_ok and after.format_ok
    # F1s equal in exact arithmetic can differ in the last bit (2/11 reached two ways): a tie then.
    if f1_after > f1_before + 1e-12:
        assert after.reward > before.reward
    elif f1_after < f1_before - 1e-12:
        assert after.reward < before.reward
    else:
        assert after.reward == pytest.approx(before.reward)
    assert FORMAT_CREDIT <= after.reward <= 1.0


@settings(max_examples=200, deadline=None)
@given(answer=phrase, golds=st.lists(alias, min_size=1, max_size=3), nested=st.booleans())
def test_one_objective_reward_is_the_papers(answer, golds, nested):
    """N = 1: R = F1 if F1 > 0 else 0.1, exactly (docs/method.md §3), flat or nested golds."""
    f1 = token_f1(answer, golds)
    r = compute_reward([final(answer)], True, [golds] if nested else golds)
    assert r.reward == (f1 if f1 > 0 else FORMAT_CREDIT) == objectives_reward([f1])
    assert compute_reward([final(answer)], False, golds).reward == 0.0


def test_objectives_reward_needs_an_f1():
    with pytest.raises(ValueError, match="f1s"):
        objectives_reward([])


def test_format_rules_unchanged_with_several_objectives():
    assert compute_reward([final("Lopa; 1923")], False, TWO).reward == 0.0  # no end-of-turn token
    r = compute_reward(["<think>no answer</think>"], True, TWO)
    assert r.reward == 0.0 and not r.format_ok and "boxed" in r.failure


def test_yes_no_exactness_per_objective():
    em, f1 = objective_scores("no; 1923", [["yes"], ["1923"]])
    assert em == 0.5 and f1 == 0.5


def test_eight_objectives_mean():
    golds = [[str(1900 + k)] for k in range(8)]
    answer = "; ".join(str(1900 + k) if k % 4 else "wrong" for k in range(8))
    em, f1 = objective_scores(answer, golds)
    assert em == pytest.approx(6 / 8) and f1 == pytest.approx(6 / 8)


def test_joined_gold_answers_score_one(world):
    """The canonical answer of a joined question (each objective's first alias) earns 1."""
    for q in join_objectives(world.heldout, 4, seed=1)[:20]:
        answer = "; ".join(g[0] for g in q["golden_answers"])
        r = compute_reward([final(answer)], True, q["golden_answers"])
        assert (r.em, r.f1, r.reward) == (1.0, 1.0, 1.0)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="{}<"), max_size=30),
       st.lists(st.text(max_size=15), min_size=1, max_size=3))
def test_one_objective_flat_and_nested_golds_agree(answer, golds):
    """[aliases] and [[aliases]] are the same single question: the same EM and F1 as always."""
    flat = compute_reward([final(answer)], True, golds)
    nested = compute_reward([final(answer)], True, [golds])
    assert (flat.em, flat.f1, flat.reward) == (nested.em, nested.f1, nested.reward)
    assert flat.f1 == token_f1(answer, golds)


# ----------------------------------------------------------------------------- config: train and eval

def _cfg(**world):
    from memsearcher_jax.settings.config_utils import load_config

    cfg = load_config("configs/default.py", [])
    cfg.world.update(world)
    return cfg


@pytest.mark.parametrize("bad", [0, -2])
def test_validate_names_world_objectives(bad):
    from memsearcher_jax.app.experiment import TrainConfigError, validate

    with pytest.raises(TrainConfigError, match=r"world\.objectives must be an integer >= 1"):
        validate(_cfg(objectives=bad))
    with pytest.raises(TrainConfigError, match=r"world\.objectives=2 joins questions of the synthetic world"):
        validate(_cfg(objectives=2, enabled=False), training=False)


def test_setup_asks_world_objectives_questions_in_train_and_eval():
    from memsearcher_jax.app.experiment import build_setup, with_objectives

    two = build_setup(_cfg(objectives=2))
    assert all(len(q["objectives"]) == 2 for q in two.train_questions + two.eval_questions)
    assert all(p["id"].startswith("heldout-") for q in two.eval_questions for p in q["objectives"])
    one = with_objectives(two, 1)
    assert all("objectives" not in q for q in one.eval_questions + one.train_questions)
    eight = with_objectives(two, 8)
    assert [len(q["golden_answers"]) for q in eight.eval_questions] == [8] * len(one.eval_questions)
    assert two.retriever is eight.retriever and two.tokenizer is eight.tokenizer


def test_demo_objectives_mix_counts_in_equal_shares():
    from memsearcher_jax.app.experiment import build_setup, demo_questions
    from memsearcher_jax.runtime.jsonl import read_jsonl

    cfg = _cfg(objectives=2)
    setup = build_setup(cfg)
    assert demo_questions(cfg, setup) == setup.train_questions[: cfg.sft.num_demos]  # "": the training set
    cfg.sft.demo_objectives, cfg.sft.num_demos = "1,2", 9
    rows = demo_questions(cfg, setup)
    assert [len(objectives_of(r)) for r in rows] == [1, 2, 1, 2, 1, 2, 1, 2, 1]
    assert [r["id"] for r in rows[::2]] == [q["id"] for q in read_jsonl(setup.world.train)[:5]]
    assert rows[1] == setup.train_questions[0]  # the pairs are the very questions GRPO trains on


def test_mix_objectives_interleaves_equal_shares(world):
    from memsearcher_jax.data.synthetic import mix_objectives

    mixed = mix_objectives(world.train, (1, 2, 4), seed=3)
    assert len(mixed) == 3 * len(world.train)
    assert [len(objectives_of(q)) for q in mixed[:7]] == [1, 2, 4, 1, 2, 4, 1]  # any prefix keeps the shares
    assert mixed[1::3] == join_objectives(world.train, 2, seed=3) and mixed[0::3] == world.train
    assert mix_objectives(world.train, (2,), seed=3) == join_objectives(world.train, 2, seed=3)


def test_grpo_trains_on_the_objectives_mix_and_evaluates_world_objectives():
    from memsearcher_jax.app.experiment import (
        build_setup,
        demo_objective_counts,
        multi_answer_prompt,
        train_objective_counts,
    )

    cfg = _cfg(objectives=1, objectives_mix="1,2,3")
    setup = build_setup(cfg)
    assert [len(objectives_of(q)) for q in setup.train_questions[:6]] == [1, 2, 3, 1, 2, 3]
    assert all("objectives" not in q for q in setup.eval_questions)  # evaluation: world.objectives
    # the demonstrations follow the training mix unless sft.demo_objectives says otherwise, and
    # the prompt states the N-answer format
    assert train_objective_counts(cfg) == demo_objective_counts(cfg) == (1, 2, 3) and multi_answer_prompt(cfg)
    assert train_objective_counts(_cfg(objectives=2)) == (2,)


@pytest.mark.parametrize("bad", ["0,2", "one"])
def test_validate_names_world_objectives_mix(bad):
    from memsearcher_jax.app.experiment import TrainConfigError, validate

    with pytest.raises(TrainConfigError, match=r"world\.objectives_mix must be comma-separated integers >= 1"):
        validate(_cfg(objectives_mix=bad))
    with pytest.raises(TrainConfigError, match=r"world\.objectives_mix='1,2' joins questions of the synthetic"):
        validate(_cfg(objectives_mix="1,2", enabled=False), training=False)


@pytest.mark.parametrize("bad", ["0,2", "one", "1,,2"])
def test_validate_names_sft_demo_objectives(bad):
    from memsearcher_jax.app.experiment import TrainConfigError, validate

    cfg = _cfg()
    cfg.sft.demo_objectives = bad
    with pytest.raises(TrainConfigError, match=r"sft\.demo_objectives must be comma-separated integers >= 1"):
        validate(cfg)
    cfg = _cfg(enabled=False)
    cfg.sft.demo_objectives = "1,2"
    with pytest.raises(TrainConfigError, match=r"sft\.demo_objectives='1,2'"):
        validate(cfg, training=False)


def test_eval_cli_objectives_flag_is_validated_before_any_load(capsys):
    from memsearcher_jax.bases import DEFAULT_BASE
    from memsearcher_jax.cli import main

    assert main(["eval", "--model", DEFAULT_BASE, "--objectives", "0"]) == 2
    assert "world.objectives must be an integer >= 1" in capsys.readouterr().err
