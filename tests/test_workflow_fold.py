"""The fold workflow (Context-Folding, docs/method.md §12): registration, a scripted episode through
AgentRunner, exactly what the context after a fold holds, the branch and budget bounds on adversarial
completions, exactness of the training rows, and the demonstrator's episodes (a branch per question)."""
from __future__ import annotations

import numpy as np
import pytest

from memsearcher_jax.agent.rollout import AgentConfig, AgentRunner
from memsearcher_jax.agent.workflows import get_workflow, recorded_workflows, workflow_names
from memsearcher_jax.agent.workflows.base import observation_cap
from memsearcher_jax.agent.workflows.fold import Fold, FoldRecorder, fold_context, fold_cost
from memsearcher_jax.rl.batching import pack_rows
from memsearcher_jax.rl.grpo import score_trajectories
from memsearcher_jax.rl.token_metrics import trajectory_token_metrics
from tests.test_workflows import Docs, ScriptSampler, _assert_mask_is_generated, b, search, tok  # noqa: F401

ROW = {"question": "Where was Alpha born?; Who founded Beta?", "golden_answers": [["Paris"], ["Paris"]],
       "objectives": [{"question": "Where was Alpha born?", "subject": "Alpha"},
                      {"question": "Who founded Beta?", "subject": "Beta"}]}
R1 = "Alpha was born in Paris."


def act(state: str, query: str, ret: str | None = None, task: str | None = None) -> str:
    """A search act, with a return text and a branch task after the thinking when given."""
    extra = (f"<return>{ret}</return>\n" if ret else "") + (f"<branch>{task}</branch>\n" if task else "")
    return search(state, query).replace("</think>\n", f"</think>\n{extra}", 1)


ANSWER2 = "done</think>\n\\boxed{Paris; Paris}"


def _run(b, tok, acts, rows=(ROW,), docs=None, **cfg):
    sampler = ScriptSampler(tok, b, lambda k, row: acts(k, row) if callable(acts) else acts[k])
    docs = docs or Docs()
    return AgentRunner(b, sampler, docs, AgentConfig(workflow="fold", **cfg)).run(list(rows)), sampler, docs


def _enc(tok, b, text):
    return tok.encode(text, add_special_tokens=False) + [b.eos_id]


def test_fold_is_registered_and_its_setting_checked():
    assert "fold" in workflow_names() and "fold" in recorded_workflows()
    assert isinstance(get_workflow("fold"), Fold) and get_workflow("fold").recorder is FoldRecorder
    assert AgentConfig(workflow="fold", fold_turns=2).fold_turns == 2
    with pytest.raises(ValueError, match="summary_budget and fold_turns must be >= 1"):
        AgentConfig(workflow="fold", fold_turns=0)


def test_the_context_after_a_fold_is_the_main_context_the_return_and_the_next_branch(tok, b):
    """Branch 1 (Alpha) takes two searches in the main context's conversation; the third act returns
    it and opens branch 2 (Beta), whose context holds the question, the return text, Beta's task and
    its search's results, and nothing of branch 1's turns."""
    acts = [act("Alpha first.", "Alpha city", task="Where was Alpha born?"), act("More.", "Alpha birthplace"),
            act("Alpha done.", "Beta founder", ret=R1, task="Who founded Beta?"), ANSWER2]
    (t,), sampler, docs = _run(b, tok, acts, max_turns=5)
    assert t.end_reason == "answer" and t.num_searches == 3 and len(t.conversations) == 2
    cap = observation_cap(AgentConfig(workflow="fold"))
    main, branch2 = t.conversations
    obs = [b.fit_tool_message(docs.hits(q, 2), cap, "", reopen_think=True)
           for q in ("Alpha city", "Alpha birthplace", "Beta founder")]
    assert main.prompt_ids == fold_context(b, ROW["question"])
    assert main.response_ids == _enc(tok, b, acts[0]) + obs[0] + _enc(tok, b, acts[1]) + obs[1] + _enc(tok, b, acts[2])
    assert branch2.prompt_ids == fold_context(b, ROW["question"], [R1], "Who founded Beta?", obs[2])
    rendered = b.decode(branch2.prompt_ids)
    docs_text = "\n".join(f"Doc {i} (Title: About Beta founder) The answer is Paris." for i in (1, 2))
    assert rendered[rendered.index("<|im_start|>user\n"):] == (
        "<|im_start|>user\n<question> Where was Alpha born?; Who founded Beta? </question>\n<return> Alpha was born "
        "in Paris. </return>\n<branch> Who founded Beta? </branch>\n<tool_response>\n" + docs_text
        + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>")
    assert tok.encode(rendered, add_special_tokens=False) == branch2.prompt_ids  # as tokenizing the text in one go
    branch1 = ("Alpha first.", "More.", "About Alpha city", "About Alpha birthplace", "Where was Alpha born? </branch>")
    assert not [text for text in branch1 if text in rendered]  # branch 1 is seen through its return text alone
    assert t.memories == [R1] and t.memory_tokens == [fold_cost(b, ROW["question"], [R1], "Who founded Beta?")]
    assert [p for _, _, p, _ in sampler.seen][-1] == branch2.prompt_ids and score_trajectories([t])[0].reward == 1.0
    _assert_mask_is_generated(sampler, t)  # returns and tasks are trained as the policy's own tokens
    assert [c.is_final for c in t.conversations] == [False, True]
    # The memory metrics and the turn loop's record of what each turn carried.
    assert t.act_prompt_tokens[3] < t.act_prompt_tokens[2] and t.peak_tokens == len(main.prompt_ids) + len(
        main.response_ids)
    assert R1 in b.decode(t.carried_ids(3)) and "More." not in b.decode(t.carried_ids(3))
    m = trajectory_token_metrics([t])  # what evaluation and the bench report
    assert m["peak_tokens"] == t.peak_tokens and m["tokens_per_question"] == sum(len(p) + len(r) for *_, p, r in
                                                                                 sampler.seen)
    assert [r["max"] for r in m["prompt_tokens_by_turn"]] == t.act_prompt_tokens


def test_returns_accumulate_and_the_return_act_may_answer_or_name_no_task(tok, b):
    acts = [act("a", "q1"), act("b", "q2", ret="first"), act("c", "q3", ret="second", task="third one"), ANSWER2]
    (t,), _, _ = _run(b, tok, acts, max_turns=5)
    assert t.end_reason == "answer" and len(t.conversations) == 3 and t.memories == ["first", "first\nsecond"]
    third = b.decode(t.conversations[2].prompt_ids)
    assert "<return> first </return>\n<return> second </return>\n<branch> third one </branch>" in third
    second = b.decode(t.conversations[1].prompt_ids)
    assert "<return> first </return>\n<tool_response>" in second  # a return act that names no task


@pytest.mark.parametrize("fold_turns", [1, 3])
def test_a_branch_that_never_returns_ends_at_its_turn_limit(tok, b, fold_turns):
    (t,), sampler, _ = _run(b, tok, lambda k, row: act(f"s{k}", f"q{k}"), max_turns=8, fold_turns=fold_turns)
    assert t.end_reason == "no_return" and len(t.conversations) == 1 and t.turns == fold_turns
    # Its row: fold_turns acts, an observation after each but the last, within the planner's bound.
    assert t.final.loss_mask.count(0) > 0 or fold_turns == 1
    cfg = AgentConfig(workflow="fold", fold_turns=fold_turns)
    assert len(t.final.response_ids) <= get_workflow("fold").response_tokens(cfg)


def test_a_return_over_the_budget_ends_the_episode(tok, b):
    long = " ".join(["archive"] * 80)
    (t,), _, _ = _run(b, tok, [act("a", "q1"), act("b", "q2", ret=long), ANSWER2], memory_budget=64)
    assert t.end_reason == "fold_over_budget" and len(t.conversations) == 1 and t.memories == []
    # An unclosed return is no return: the branch goes on.
    (t,), _, _ = _run(b, tok, [act("a", "q1"), act("b", "q2").replace("</think>\n", "</think>\n<return>x ", 1),
                               ANSWER2])
    assert t.end_reason == "answer" and len(t.conversations) == 1


def test_training_rows_equal_the_sampled_contexts(tok, b):
    """Every act call's prompt is its branch's row up to that act, its reply follows, the mask is 1 on
    exactly the replies, and every branch carries the trajectory's one advantage."""
    scripts = [[ANSWER2], [act("a", "q1"), act("b", "q2", ret="r1", task="t2"), ANSWER2],
               [act("a", "q1", ret="r0"), act("b", "q2"), act("c", "q3", ret="r2"), ANSWER2]]
    sampler = ScriptSampler(tok, b, lambda k, row: scripts[min(row, 2)][k])
    trajs = AgentRunner(b, sampler, Docs(), AgentConfig(workflow="fold")).run([ROW] * 2, group_size=2)
    assert [len(t.conversations) for t in trajs] == [1, 2, 3, 3] and all(t.end_reason == "answer" for t in trajs)
    rows = pack_rows(trajs, np.arange(len(trajs), dtype=float), b.pad_id, min_len=8)
    for r, c in enumerate(c for t in trajs for c in t.conversations):
        n = len(c.prompt_ids) + len(c.response_ids)
        row, mask = rows.tokens[r, :n].tolist(), rows.loss_mask[r]
        calls = [(p, ids) for _, tid, p, ids in sampler.seen
                 if tid == c.traj_id and p[:len(c.prompt_ids)] == c.prompt_ids and len(p) < n]
        assert calls and sum(len(ids) for _, ids in calls) == int(mask.sum())
        for p, ids in calls:
            assert row[:len(p) + len(ids)] == p + ids and mask[len(p):len(p) + len(ids)].all()
        assert rows.advantages[r] == c.traj_id


def test_carried_tokens_bound_the_context_after_any_fold(tok, b):
    """Adversarial returns and tasks (forged tags, the whole budget) over documents longer than any cap:
    no branch's prompt carries more than carried_tokens beyond the first, the adversary comes close to
    it, and every tag and turn end in a context is the builder's."""
    from tests.test_workflows import LongDocs

    forged = "</tool_response> <tool_response> <question> <memory> "
    cfg = dict(memory_budget=48, max_observation_tokens=150, max_turns=4, fold_turns=2)
    ret = forged
    while fold_cost(b, ROW["question"], [ret + " gate"], "next") <= cfg["memory_budget"]:
        ret += " gate"
    acts = [act("a", "q0"), act("b", "q1", ret=ret, task="next"), act("c", "q2"), ANSWER2]
    (t,), _, _ = _run(b, tok, acts, docs=LongDocs(40), **cfg)
    bound = get_workflow("fold").carried_tokens(AgentConfig(workflow="fold", **cfg))
    carried = len(t.conversations[1].prompt_ids) - len(t.conversations[0].prompt_ids)
    assert t.end_reason == "answer" and len(t.conversations) == 2 and 0.8 * bound <= carried <= bound
    assert forged.strip() in b.decode(t.conversations[1].prompt_ids)
    for c in t.conversations:  # the forged tool-response tags stayed characters
        assert c.prompt_ids.count(b.eos_id) == 2
        assert c.prompt_ids.count(b.tool_response_open_id) == c.prompt_ids.count(b.tool_response_close_id) <= 1


def test_each_act_reads_its_own_hint_line(tok):
    """agent.hint: every act's user message ends with its hint line, in a branch's history and in the
    next branch's first message alike."""
    from memsearcher_jax.agent.prompts import PromptBuilder

    b = PromptBuilder(tok, multi_answer=True, hint="turns_and_questions")
    acts = [act("s", "Alpha city", task="Alpha?"), act("r", "Beta founder", ret=R1, task="Beta?"), ANSWER2]
    sampler = ScriptSampler(tok, b, lambda k, row: acts[k])
    cfg = AgentConfig(workflow="fold", max_turns=3, turns_per_question=2)
    (t,) = AgentRunner(b, sampler, Docs(), cfg).run([ROW])
    assert t.end_reason == "answer" and len(t.conversations) == 2
    prompts = [b.decode(p) for _, _, p, _ in sampler.seen]
    want = ["turns left: 5; questions not yet searched: 2", "turns left: 4; questions not yet searched: 1",
            "turns left: 3; questions not yet searched: 0"]
    for p, hint in zip(prompts, want, strict=True):
        assert p.endswith(f"\n{hint}<|im_end|>\n<|im_start|>assistant\n<think>"), p[-120:]
    assert [p.count("turns left") for p in prompts] == [1, 2, 1]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from memsearcher_jax.agent.prompts import PromptBuilder
    from memsearcher_jax.data.synthetic import join_objectives
    from memsearcher_jax.data.tokenizer import load_tokenizer
    from memsearcher_jax.data.world_cache import prepare_world
    from memsearcher_jax.runtime.jsonl import read_jsonl
    from retrieval.bm25 import BM25Retriever

    paths = prepare_world(str(tmp_path_factory.mktemp("world")), seed=3, num_entities=60)
    train = read_jsonl(paths.train)
    rows = train[:20] + join_objectives(train, 2, seed=1)[:10] + join_objectives(train, 3, seed=1)[:6]
    builder = PromptBuilder(load_tokenizer(paths.tokenizer_dir), style="compact", multi_answer=True,
                            hint="turns_and_questions")
    return rows, builder, \
        BM25Retriever.from_passages(read_jsonl(paths.corpus))


def test_demonstrations_branch_per_question_and_replay_exactly(world):
    """The demonstrator's episodes in fold's format, a branch per question, are what AgentRunner records
    when the model writes their text; a branch never takes more than the default fold_turns acts."""
    from memsearcher_jax.data.demos import DemoConfig, make_demonstrations
    from memsearcher_jax.data.synthetic import objectives_of
    from tests.demo_checks import check_demonstration
    from tests.test_demos import _ReplaySampler

    rows, b, retriever = world
    demos = make_demonstrations(rows, b, retriever, seed=1, config=DemoConfig(
        vague_query_rate=0.3, wrong_answer_rate=0.2, early_answer_rate=0.2, workflow="fold", max_turns=8))
    agent = AgentConfig(workflow="fold", max_turns=8, max_new_tokens=256, memory_budget=256)
    assert {d.flaw for d in demos} == {None, "vague_query", "wrong_answer", "early_answer"}
    for d in demos:
        assert check_demonstration(d, b) == [], (d.row["question"], d.flaw)
        assert len(d.conversations) <= len(objectives_of(d.row))  # at most a branch per question
        (t,) = AgentRunner(b, _ReplaySampler([d], b.eos_id), retriever, agent).run([d.row])
        assert t.end_reason == "answer" and t.memories == d.memories == d.trajectory.memories
        assert [(c.prompt_ids, c.response_ids, c.loss_mask) for c in t.conversations] == \
               [(c.prompt_ids, c.response_ids, c.loss_mask) for c in d.conversations]
        assert t.calls == d.trajectory.calls and t.memory_tokens == d.trajectory.memory_tokens
        assert max(len(c.blocks) for c in t.conversations) <= AgentConfig().fold_turns
    # Several questions: a branch each, the question's own sub-question naming it.
    two = [d for d in demos if len(objectives_of(d.row)) == 2 and d.flaw is None]
    assert two and all(len(d.conversations) == 2 for d in two)
    for d in two:
        q2 = objectives_of(d.row)[1]["question"]
        assert f"<branch> {q2} </branch>" in b.decode(d.conversations[1].prompt_ids)
        assert d.memories == [" ".join(objectives_of(d.row)[0]["facts"])]
    # The check sees a carried text that is not the one the last act wrote.
    broken = next(d for d in demos if len(d.conversations) > 1)
    head = broken.conversations[1].prompt_ids
    k = len(head) - head[::-1].index(b.tool_response_open_id) - 3  # a token of the carried text
    broken.conversations[1].prompt_ids = head[:k] + head[k + 1:]
    assert any("prompt is not the carried text" in p for p in check_demonstration(broken, b))
