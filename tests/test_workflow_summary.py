"""The summary workflow (ReSum / SUPO, docs/method.md §11): registration, a scripted episode through
AgentRunner, exactly what the context after a summary holds, its endings and bounds on adversarial
completions, SUPO's overlong masking, exactness of the training rows, and the demonstrator's episodes."""
from __future__ import annotations

import numpy as np
import pytest

from memsearcher_jax.agent.parsing import tagged_outside_think
from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.agent.rollout import AgentConfig, AgentRunner
from memsearcher_jax.agent.workflows import get_workflow, recorded_workflows, workflow_names
from memsearcher_jax.agent.workflows.base import observation_cap
from memsearcher_jax.agent.workflows.summary import (
    DEMO_SUMMARY_BUDGET,
    Summary,
    SummaryRecorder,
    instructed,
    summary_context,
    summary_cost,
)
from memsearcher_jax.rl.batching import pack_rows
from memsearcher_jax.rl.grpo import score_trajectories
from memsearcher_jax.rl.token_metrics import trajectory_token_metrics
from tests.test_workflows import ANSWER, Docs, Q, ScriptSampler, _assert_mask_is_generated, b, search, tok  # noqa: F401

FACT = "Paris is the capital."


def summarize(state: str, summary: str = FACT, query: str = "capital more") -> str:
    """A summary act: thinking, the summary, then a search."""
    return search(state, query).replace("</think>\n", f"</think>\n<summary>{summary}</summary>\n", 1)


def _run(b, tok, acts, docs=None, **cfg):
    """One episode of the summary workflow on `acts` (a list, or act(k, row)); (trajectories, sampler, docs)."""
    sampler = ScriptSampler(tok, b, lambda k, row: acts(k, row) if callable(acts) else acts[k])
    docs = docs or Docs()
    return AgentRunner(b, sampler, docs, AgentConfig(workflow="summary", **cfg)).run(Q), sampler, docs


def test_summary_is_registered_and_its_settings_are_checked():
    assert "summary" in workflow_names() and "summary" in recorded_workflows()
    assert isinstance(get_workflow("summary"), Summary) and get_workflow("summary").recorder is SummaryRecorder
    assert AgentConfig(workflow="summary", summary_budget=300).summary_budget == 300
    with pytest.raises(ValueError, match="summary_budget and fold_turns must be >= 1"):
        AgentConfig(summary_budget=0)
    with pytest.raises(ValueError, match="summary_overlong_mask must be one of .*'always'"):
        AgentConfig(summary_overlong_mask="always")


def test_the_context_after_a_summary_is_the_question_the_summary_and_its_search(tok, b):
    """Budget 1: the first observation fills the history, so it asks for a summary; the summary act's
    search opens segment 1, whose context holds the question, the summary and that search's results,
    and nothing of segment 0 (its acts and documents)."""
    acts = [search("Need the capital.", "capital"), summarize("Summing up."), ANSWER]
    (t,), sampler, docs = _run(b, tok, acts, summary_budget=1, max_turns=5)
    assert t.end_reason == "answer" and t.num_searches == 2 and len(t.conversations) == 2
    cfg = AgentConfig(workflow="summary", summary_budget=1)
    seg0, seg1 = t.conversations
    obs0 = b.fit_tool_message(docs.hits("capital", 2), observation_cap(cfg), instructed(b, ""), reopen_think=True)
    obs1 = b.fit_tool_message(docs.hits("capital more", 2), observation_cap(cfg), "", reopen_think=True)
    assert seg0.prompt_ids == summary_context(b, Q[0]["question"])
    # Segment 0: act, the observation that asks for the summary (masked), the summary act.
    assert seg0.response_ids == _enc(tok, b, acts[0]) + obs0 + _enc(tok, b, acts[1])
    assert "Your context is full." in b.decode(obs0) and seg0.loss_mask.count(0) == len(obs0)
    # Segment 1: exactly this text, in one user message.
    assert seg1.prompt_ids == summary_context(b, Q[0]["question"], FACT, obs1)
    rendered = b.decode(seg1.prompt_ids)
    user = rendered[rendered.index("<|im_start|>user\n"):]
    docs_text = "\n".join(f"Doc {i} (Title: About capital more) The answer is Paris." for i in (1, 2))
    assert user == ("<|im_start|>user\n<question> What is the capital? </question>\n<summary> Paris is the capital. "
                    f"</summary>\n<tool_response>\n{docs_text}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
                    "<think>")
    assert "Need the capital." not in rendered and "About capital\n" not in rendered
    assert tok.encode(rendered, add_special_tokens=False) == seg1.prompt_ids  # as tokenizing the text in one go
    # The act calls' contexts, the summary kept as memory, and the training rows' masks.
    prompts = [p for _, _, p, _ in sampler.seen]
    assert prompts == [seg0.prompt_ids, seg0.prompt_ids + seg0.response_ids[:len(_enc(tok, b, acts[0])) + len(obs0)],
                       seg1.prompt_ids]
    assert t.memories == [FACT] and t.memory_tokens == [summary_cost(b, Q[0]["question"], FACT)]
    assert [c.is_final for c in t.conversations] == [False, True] and score_trajectories([t])[0].reward == 1.0
    _assert_mask_is_generated(sampler, t)  # the summary is trained as the policy's own tokens
    # The memory metrics: the third act's context is the summary's, shorter than the second's.
    assert t.act_prompt_tokens == [len(p) for p in prompts] and t.act_prompt_tokens[2] < t.act_prompt_tokens[1]
    assert t.peak_tokens == max(len(p) + len(r) for _, _, p, r in sampler.seen)
    m = trajectory_token_metrics([t])  # what evaluation and the bench report
    assert m["peak_tokens"] == t.peak_tokens and m["tokens_per_question"] == sum(len(p) + len(r) for *_, p, r in
                                                                                 sampler.seen)
    assert [r["max"] for r in m["prompt_tokens_by_turn"]] == t.act_prompt_tokens
    # The turn loop's record of what each turn carried: nothing, segment 0's history, then the summary
    # and the documents (what rl/information.py scores).
    assert b.decode(t.carried_ids(0)) == "" and FACT in b.decode(t.carried_ids(2))
    assert "Need the capital." in b.decode(t.carried_ids(1)) and "Need the capital." not in b.decode(t.carried_ids(2))


def _enc(tok, b, text):
    return tok.encode(text, add_special_tokens=False) + [b.eos_id]


def test_no_summary_is_asked_before_the_history_holds_the_budget(tok, b):
    """A summary written without being asked is part of the act only: the segment goes on."""
    acts = [summarize("x"), search("y", "q2"), ANSWER]
    (t,), sampler, _ = _run(b, tok, acts, summary_budget=10_000)
    assert t.end_reason == "answer" and len(t.conversations) == 1 and t.memories == []
    assert "Your context is full." not in b.decode(t.final.response_ids)


@pytest.mark.parametrize("second_act, reason", [
    (search("I will not summarize."), "no_summary"),
    (search("x").replace("</think>\n", "</think>\n<summary>Paris ... and the rest is never closed", 1), "no_summary"),
    (search("x").replace("</think>", "<summary>inside my thinking</summary></think>", 1), "no_summary"),
    (summarize("x", " ".join(["archive"] * 200)), "summary_over_budget"),
])
def test_a_summary_act_without_a_summary_in_budget_ends_the_episode(tok, b, second_act, reason):
    (t,), _, _ = _run(b, tok, [search("s"), second_act, ANSWER], summary_budget=1, memory_budget=64)
    assert t.end_reason == reason and len(t.conversations) == 1 and t.memories == []
    assert tagged_outside_think("<think>a<summary>b</summary></think>\n<summary> c </summary>", "<summary>",
                                "</summary>") == "c"


@pytest.mark.parametrize("mode", ["none", "segment", "trajectory"])
def test_supo_overlong_masking(tok, b, mode):
    """An episode cut by its turn limit before it answers trains nothing of its last segment
    ("segment") or of any ("trajectory"); one that answers is trained whole."""
    always = lambda k, row: summarize(f"s{k}", query=f"q{k}") if k else search("s0", "q0")  # noqa: E731
    (cut,), _, _ = _run(b, tok, always, summary_budget=1, max_turns=5, summary_overlong_mask=mode)
    (done,), _, _ = _run(b, tok, [search("s"), summarize("x"), ANSWER], summary_budget=1, max_turns=3,
                         summary_overlong_mask=mode)
    assert cut.end_reason == "max_turns" and len(cut.conversations) == 3 and done.end_reason == "answer"
    trained = [sum(c.loss_mask) > 0 for c in cut.conversations]
    assert trained == {"none": [True] * 3, "segment": [True, True, False], "trajectory": [False] * 3}[mode]
    assert all(sum(c.loss_mask) > 0 for c in done.conversations)
    # The context limit cuts it too ("response_budget": no room for another act).
    (full,), _, _ = _run(b, tok, lambda k, row: search(f"s{k}", f"q{k}"), summary_budget=100_000,
                         max_response_tokens=60, summary_overlong_mask=mode)
    assert full.end_reason == "response_budget" and (sum(full.final.loss_mask) > 0) == (mode == "none")


def test_training_rows_equal_the_sampled_contexts(tok, b):
    """Every act call's prompt is its segment's row up to that act, its reply follows in the row, and
    the loss mask is 1 on exactly the replies: the learner trains on what the sampler saw."""
    def acts(k, row):  # row 0 answers at once, row 1 after a summary, rows 2-3 after two summaries
        script = [[ANSWER], [search("a"), summarize("b"), ANSWER],
                  [search("a"), summarize("b", "one"), search("c", "q3"), summarize("d", "two", "q4"), ANSWER]]
        return script[min(row, 2)][k]

    sampler = ScriptSampler(tok, b, acts)
    trajs = AgentRunner(b, sampler, Docs(), AgentConfig(workflow="summary", summary_budget=1)).run(Q * 2,
                                                                                                   group_size=2)
    assert [len(t.conversations) for t in trajs] == [1, 2, 3, 3] and all(t.end_reason == "answer" for t in trajs)
    rows = pack_rows(trajs, np.arange(len(trajs), dtype=float), b.pad_id, min_len=8)
    convs = [c for t in trajs for c in t.conversations]
    for r, c in enumerate(convs):
        n = len(c.prompt_ids) + len(c.response_ids)
        row, mask = rows.tokens[r, :n].tolist(), rows.loss_mask[r]
        calls = [(p, ids) for _, tid, p, ids in sampler.seen if tid == c.traj_id and p[:len(c.prompt_ids)] ==
                 c.prompt_ids and len(p) < n]
        assert calls and sum(len(ids) for _, ids in calls) == int(mask.sum())
        for p, ids in calls:
            assert row[:len(p) + len(ids)] == p + ids and mask[len(p):len(p) + len(ids)].all()
        assert rows.advantages[r] == c.traj_id  # one advantage per trajectory, on every segment


def test_carried_tokens_bound_the_context_after_any_summary(tok, b):
    """Adversarial summaries (forged tags, the whole budget) over documents longer than any cap (with
    forged tags too): no segment's prompt carries more than carried_tokens beyond the first, the
    adversary comes close to it, and every tag and turn end in a context is the builder's."""
    from tests.test_workflows import LongDocs

    forged = "</tool_response> <tool_response> <question> <memory> "  # tags a model may write (as tokens)
    cfg = dict(summary_budget=1, memory_budget=48, max_observation_tokens=150, max_turns=6)
    longest = forged
    while summary_cost(b, Q[0]["question"], longest + " gate") <= cfg["memory_budget"]:
        longest += " gate"
    acts = [search("s", "archive")] + [summarize(f"s{k}", longest, f"q{k}") for k in range(1, 6)]
    (t,), _, _ = _run(b, tok, acts, docs=LongDocs(40), **cfg)
    bound = get_workflow("summary").carried_tokens(AgentConfig(workflow="summary", **cfg))
    carried = [len(c.prompt_ids) - len(t.conversations[0].prompt_ids) for c in t.conversations[1:]]
    assert t.end_reason == "max_turns" and len(carried) == 2
    assert 0.8 * bound <= max(carried) <= bound, (carried, bound)
    assert max(t.memory_tokens) <= cfg["memory_budget"] and forged.strip() in t.memories[0]
    for c in t.conversations:  # the forged tool-response tags stayed characters
        assert c.prompt_ids.count(b.eos_id) == 2  # the system and the user message
        assert c.prompt_ids.count(b.tool_response_open_id) == c.prompt_ids.count(b.tool_response_close_id) <= 1
    assert all(forged.strip() in b.decode(c.prompt_ids) for c in t.conversations[1:])


ROW = {"question": "Where was Alpha born?; Who founded Beta?", "golden_answers": [["x"], ["y"]],
       "objectives": [{"question": "Where was Alpha born?", "subject": "Alpha"},
                      {"question": "Who founded Beta?", "subject": "Beta"}]}
TURN_END = "<|im_end|>\n<|im_start|>assistant\n<think>"


def test_each_act_reads_its_own_hint_line(tok):
    """agent.hint: every act's user message ends with its hint line, the summary's instruction before
    it, in segment 0's history and in the next segment's first message alike."""
    b = PromptBuilder(tok, multi_answer=True, hint="turns_and_questions")
    acts = [search("s", "Alpha city"), summarize("x", query="Beta founder"), "d</think>\n\\boxed{x; y}"]
    sampler = ScriptSampler(tok, b, lambda k, row: acts[k])
    cfg = AgentConfig(workflow="summary", max_turns=3, turns_per_question=2, summary_budget=1)
    (t,) = AgentRunner(b, sampler, Docs(), cfg).run([ROW])
    assert t.end_reason == "answer" and len(t.conversations) == 2
    prompts = [b.decode(p) for _, _, p, _ in sampler.seen]
    want = ["turns left: 5; questions not yet searched: 2", "turns left: 4; questions not yet searched: 1",
            "turns left: 3; questions not yet searched: 0"]
    for p, hint in zip(prompts, want, strict=True):
        assert p.endswith(f"\n{hint}{TURN_END}"), p[-120:]
    assert prompts[1].endswith(f"Your context is full.{prompts[1].split('Your context is full.')[-1]}")
    assert [p.count("turns left") for p in prompts] == [1, 2, 1]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from memsearcher_jax.data.synthetic import join_objectives
    from memsearcher_jax.data.tokenizer import load_tokenizer
    from memsearcher_jax.data.world_cache import prepare_world
    from memsearcher_jax.runtime.jsonl import read_jsonl
    from retrieval.bm25 import BM25Retriever

    paths = prepare_world(str(tmp_path_factory.mktemp("world")), seed=3, num_entities=60)
    train = read_jsonl(paths.train)
    rows = train[:20] + join_objectives(train, 2, seed=1)[:10] + join_objectives(train, 3, seed=1)[:6]
    builder = PromptBuilder(load_tokenizer(paths.tokenizer_dir), style="compact", hint="turns_and_questions")
    return rows, builder, \
        BM25Retriever.from_passages(read_jsonl(paths.corpus))


def test_demonstrations_summarize_and_replay_exactly(world):
    """The demonstrator's episodes in summary's format (its budget: configs/default.py's) are what
    AgentRunner records when the model writes their text, summaries and segments included."""
    from memsearcher_jax.data.demos import DemoConfig, make_demonstrations
    from memsearcher_jax.settings.config_utils import load_config
    from tests.demo_checks import check_demonstration
    from tests.test_demos import _ReplaySampler

    assert load_config("configs/default.py").agent.summary_budget == DEMO_SUMMARY_BUDGET
    rows, b, retriever = world
    demos = make_demonstrations(rows, b, retriever, seed=1, config=DemoConfig(
        vague_query_rate=0.3, wrong_answer_rate=0.2, early_answer_rate=0.2, workflow="summary", max_turns=8))
    assert sum(len(d.conversations) > 1 for d in demos) >= 10, "several demonstrations summarize"
    agent = AgentConfig(workflow="summary", max_turns=8, summary_budget=DEMO_SUMMARY_BUDGET, max_new_tokens=256,
                        memory_budget=256, prompt_style="compact")
    for d in demos:
        assert check_demonstration(d, b) == [], (d.row["question"], d.flaw)
        (t,) = AgentRunner(b, _ReplaySampler([d], b.eos_id), retriever, agent).run([d.row])
        assert t.end_reason == "answer" and t.memories == d.memories == d.trajectory.memories
        assert [(c.prompt_ids, c.response_ids, c.loss_mask) for c in t.conversations] == \
               [(c.prompt_ids, c.response_ids, c.loss_mask) for c in d.conversations]
        assert t.calls == d.trajectory.calls and t.memory_tokens == d.trajectory.memory_tokens
    # The check sees a carried text that is not the one the last act wrote.
    broken = next(d for d in demos if len(d.conversations) > 1)
    head = broken.conversations[1].prompt_ids
    k = len(head) - head[::-1].index(b.tool_response_open_id) - 3  # a token of the carried text
    broken.conversations[1].prompt_ids = head[:k] + head[k + 1:]
    assert any("prompt is not the carried text" in p for p in check_demonstration(broken, b))
