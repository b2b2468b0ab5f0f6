"""Issue 83 item 2: MEM1's hint line ("turns left: K; questions not yet searched: Q", agent.hint), shown
the same way by every workflow and scripted by the demonstrator, and the turn budget per question count
(agent.turns_per_question) in the turn loop."""
from __future__ import annotations

import dataclasses

import pytest

from memsearcher_jax.agent.prompts import HINT_MODES, PromptBuilder, hint_text
from memsearcher_jax.agent.rollout import AgentConfig, AgentRunner
from memsearcher_jax.agent.trajectory import Trajectory
from memsearcher_jax.agent.workflows.base import turn_hint
from memsearcher_jax.data.demos import DemoConfig, make_demonstrations
from memsearcher_jax.data.synthetic import join_objectives
from memsearcher_jax.data.tokenizer import load_tokenizer
from memsearcher_jax.data.world_cache import prepare_world
from memsearcher_jax.runtime.jsonl import read_jsonl
from retrieval.bm25 import BM25Retriever
from tests.test_demos import _ReplaySampler
from tests.test_workflows import Docs, ScriptSampler, search

WORKFLOWS = ("memsearcher", "react", "mem1", "memory_ops")
SECOND = {"memsearcher": "<memory>found</memory>", "memory_ops": "<ops>\nNOOP\n</ops>"}


@pytest.fixture(scope="module")
def reading():
    """The shipped base's tokenizer (memsearcher_jax/bases/reading_v8), as the default run reads."""
    from memsearcher_jax.bases import DEFAULT_BASE

    return load_tokenizer(DEFAULT_BASE)


def test_the_hint_line_in_words(reading):
    assert hint_text("turns_and_questions", 4, 2) == "turns left: 4; questions not yet searched: 2"
    assert hint_text("turns", 4, 2) == "turns left: 4"
    assert hint_text("none", 4, 2) == ""
    assert hint_text("turns", -1, 0) == "turns left: 0"
    with pytest.raises(ValueError, match=r"agent\.hint='both'"):
        PromptBuilder(reading, hint="both")


@pytest.mark.parametrize("mode", [m for m in HINT_MODES if m != "none"])
def test_the_hint_encodes_as_plain_text_with_the_shipped_base(reading, mode):
    b = PromptBuilder(reading, style="compact", hint=mode)
    hint = b.hint_line(12, 16)
    ids = b.encode(hint)
    markup = set(reading.all_special_ids) | {int(i) for i, t in reading.added_tokens_decoder.items()
                                              if t.special or (t.content.startswith("<") and t.content.endswith(">"))}
    assert ids and not set(ids) & markup, [reading.convert_ids_to_tokens(i) for i in ids if i in markup]
    assert b.decode(ids) == hint
    # In a context it is the same ids, on its own line right before the end of the user message.
    ctx = b.memsearcher_context("What is q?", "a fact", hint)
    tail = b.encode("\n" + hint) + [b.eos_id, *b.encode("\n"), b.im_start_id, *b.encode("assistant\n"), b.think_id]
    assert ctx[-len(tail):] == tail and b.encode("\n" + hint) == b.encode("\n") + ids


def test_questions_not_yet_searched():
    t = Trajectory(traj_id=0, group_id=0, question="q", golds=[], subjects=["Bolin", "Zumatek", "Bolin Dor"])
    assert t.unsearched_questions() == 3
    t.queries.append("Bolinx birth year")          # a name inside a longer word is not the name
    assert t.unsearched_questions() == 3
    t.queries.append("what year was BOLIN born?")  # whole words, any case
    assert t.unsearched_questions() == 2
    t.queries.append("founder of bolin dor")
    assert t.unsearched_questions() == 1
    plain = Trajectory(traj_id=0, group_id=0, question="q", golds=[], subjects=[None, None])
    assert plain.unsearched_questions() == 2      # no subject (not the synthetic world): any search counts
    plain.queries.append("anything")
    assert plain.unsearched_questions() == 0


ROW = {"question": "Where was Alpha born?; Who founded Beta?", "golden_answers": [["x"], ["y"]],
       "objectives": [{"question": "Where was Alpha born?", "subject": "Alpha"},
                      {"question": "Who founded Beta?", "subject": "Beta"}]}


def _acts(k, row):
    """Search Alpha, then something about neither, then Beta, then answer."""
    acts = [search("s", "Alpha city"), search("s", "a city"), search("s", "Beta founder")]
    return (acts + ["d</think>\n\\boxed{x; y}"])[k]


@pytest.mark.parametrize("workflow", WORKFLOWS)
def test_every_workflow_ends_each_acts_user_message_with_the_hint(reading, workflow):
    b = PromptBuilder(reading, style="compact", multi_answer=True, hint="turns_and_questions")
    sampler = ScriptSampler(reading, b, _acts, second=lambda k, row: SECOND.get(workflow, ""))
    cfg = AgentConfig(workflow=workflow, max_turns=3, turns_per_question=2, max_new_tokens=64)
    (t,) = AgentRunner(b, sampler, Docs(), cfg).run([ROW])
    assert t.end_reason == "answer" and t.max_turns == 5  # 3 turns for one question, 2 more for the second
    prompts = [p for kind, _, p, _ in sampler.seen if kind == "act"]
    end = [b.eos_id, *b.encode("\n"), b.im_start_id, *b.encode("assistant\n"), b.think_id]
    want = ["turns left: 5; questions not yet searched: 2", "turns left: 4; questions not yet searched: 1",
            "turns left: 3; questions not yet searched: 1", "turns left: 2; questions not yet searched: 0"]
    for p, hint in zip(prompts, want, strict=True):
        tail = b.encode("\n" + hint) + end
        assert p[-len(tail):] == tail, (workflow, b.decode(p[-40:]))
    # Each act reads one hint, its own: the memory designs rebuild the context, mem1 drops the last
    # turn's, react keeps the earlier ones in its history.
    last = b.decode(prompts[-1])
    assert last.count("turns left") == (4 if workflow == "react" else 1)
    # The hint is never trained on: the loss mask covers exactly the generated tokens.
    trained = [tk for c in t.conversations for tk, m in zip(c.response_ids, c.loss_mask) if m]
    assert trained == [tk for _, _, _, ids in sampler.seen for tk in ids]


def test_the_turn_budget_grows_with_the_question_count(reading):
    rows = [{"question": "q1", "golden_answers": ["a"]},
            {"question": "q1; q2; q3", "golden_answers": [["a"], ["b"], ["c"]],
             "objectives": [{"question": f"q{i}"} for i in (1, 2, 3)]}]
    b = PromptBuilder(reading)
    always_search = ScriptSampler(b.tokenizer, b, lambda k, row: search("s", f"q{k}"),
                                  second=lambda k, row: "<memory>m</memory>")
    trajs = AgentRunner(b, always_search, Docs(), AgentConfig(max_turns=2, turns_per_question=1)).run(rows)
    assert [(t.max_turns, t.turns, t.end_reason) for t in trajs] == [(2, 2, "max_turns"), (4, 4, "max_turns")]
    off = AgentRunner(b, ScriptSampler(b.tokenizer, b, lambda k, row: search("s", f"q{k}"),
                                       second=lambda k, row: "<memory>m</memory>"), Docs(), AgentConfig(max_turns=2))
    assert [t.turns for t in off.run(rows)] == [2, 2]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    paths = prepare_world(str(tmp_path_factory.mktemp("world")), seed=4, num_entities=40)
    train = read_jsonl(paths.train)
    rows = [r for n in (1, 2, 3) for r in join_objectives(train, n, seed=2)[:5]]
    return rows, load_tokenizer(paths.tokenizer_dir), BM25Retriever.from_passages(read_jsonl(paths.corpus))


@pytest.mark.parametrize("workflow", WORKFLOWS)
def test_the_demonstrator_scripts_the_hint_the_rollout_shows(world, workflow):
    """The warm start's episodes, hint and budget per count included, are what AgentRunner records
    when the model writes the script's text (tests/test_demos.py's replay)."""
    rows, tok, retriever = world
    b = PromptBuilder(tok, style="compact", multi_answer=True, hint="turns_and_questions")
    config = DemoConfig(vague_query_rate=0.3, wrong_answer_rate=0.2, early_answer_rate=0.2, max_turns=4,
                        turns_per_question=2, workflow=workflow)
    demos = make_demonstrations(rows, b, retriever, seed=1, config=config)
    agent = AgentConfig(workflow=workflow, max_turns=4, turns_per_question=2, max_new_tokens=256)
    for d in demos:
        (t,) = AgentRunner(b, _ReplaySampler([d], b.eos_id), retriever, agent).run([d.row])
        assert t.end_reason == "answer" and t.max_turns == d.trajectory.max_turns == 2 * len(d.answers) + 2
        assert [(c.prompt_ids, c.response_ids, c.loss_mask) for c in t.conversations] == \
               [(c.prompt_ids, c.response_ids, c.loss_mask) for c in d.conversations]
    first = b.decode(demos[-1].conversations[0].prompt_ids)
    assert "turns left: 8; questions not yet searched: 3" in first  # a 3-question demo's first act


def test_the_hint_is_off_by_default(world):
    rows, tok, retriever = world
    b = PromptBuilder(tok)
    assert b.hint == "none"
    t = Trajectory(traj_id=0, group_id=0, question="q", golds=[], max_turns=4, subjects=["x"])
    assert turn_hint(b, t, 0) == ""
    demo = make_demonstrations(rows[-1:], b, retriever, config=dataclasses.replace(DemoConfig(), max_turns=8))[0]
    assert "turns left" not in b.decode(demo.conversations[0].prompt_ids)
