"""bench/episode_report.py: the per-episode account of where a workflow's episodes fail, checked on
hand-made trajectories (a builder whose ids are characters)."""
from __future__ import annotations

import json
import types

import pytest

from memsearcher_jax.agent.trajectory import Conversation, Trajectory
from memsearcher_jax.errors import UserInputError
from tests.bench_loader import load_bench


def _report():
    return load_bench("episode_report")


CHARS = types.SimpleNamespace(decode=lambda ids: "".join(map(chr, ids)))
CALL = '<think>s</think>\n<tool_call>{"name": "wikipedia_search", "arguments": {"query": "%s", "top_n": 2}}</tool_call>'
ROW = {"question": "q1; q2", "objectives": [
    {"question": "q1", "hops": 1, "subject": "Lopa", "facts": ["Lopa was born in Rome."], "golden_answers": ["Rome"]},
    {"question": "q2", "hops": 2, "subject": "Tarvel", "facts": ["Tarvel works for Acme.", "Acme is in Oslo."],
     "golden_answers": ["Oslo"]}]}


def _turn(t, query, observation, memory, update=None):
    """One search turn; `update`: the update block as sampled (default: a well-formed one)."""
    conv = Conversation(prompt_ids=[1], ended_with_eos=True)
    conv.add_generated([65], [0.0])
    conv.add_injected([ord(c) for c in observation])
    conv.add_generated([66], [0.0])
    conv.blocks = [CALL % query, update or f"<memory>{memory}</memory>"]
    t.conversations.append(conv)
    if update is None:
        t.memories.append(memory)
    t.num_searches += 1


def test_episode_names_searched_retrieved_held_and_dropped_facts():
    rep = _report()
    t = Trajectory(traj_id=0, group_id=0, question=ROW["question"], golds=[["Rome"], ["Oslo"]])
    _turn(t, "Lopa born", "Doc 1 Lopa was born in Rome.", "Lopa was born in Rome.")
    # the second search finds Tarvel's first fact, and the update drops Lopa's fact it had
    _turn(t, "Tarvel works", "Doc 1 Tarvel works for Acme.", "Tarvel works for Acme.")
    final = Conversation(prompt_ids=[1], blocks=["<think>m</think>\n\\boxed{Rome; Acme}"])
    t.conversations.append(final)
    t.finish("answer")
    e = rep.episode(t, ROW, CHARS, "memsearcher")
    assert e["queries"] == ["Lopa born", "Tarvel works"] and e["answer"] == "Rome; Acme"
    o1, o2 = e["objectives"]
    assert (o1["em"], o1["searched_subject"], o1["retrieved"], o1["held"]) == (True, True, [True], [False])
    assert (o2["em"], o2["retrieved"], o2["held"]) == (False, [True, False], [True, False])
    assert e["updates"] == [{"had": 1, "kept": 1, "new": 1, "unsupported": 0}, {"had": 2, "kept": 1, "new": 1,
                                                                                 "unsupported": 0}]
    s = rep.summarize([e])
    assert s["obj_em"] == 0.5 and s["obj_all_retrieved"] == 0.5 and s["obj_all_held"] == 0.0
    assert s["update_keep_rate"] == 2 / 3 and s["end_reasons"] == {"answer": 1}
    # react holds what its context holds: every observation
    r = rep.episode(t, ROW, CHARS, "react")
    assert [o["held"] for o in r["objectives"]] == [[True], [True, False]] and r["updates"] == []


def _answered(rep, queries_and_obs, answer):
    """A memsearcher episode that searches each (query, observation) and answers `answer`."""
    t = Trajectory(traj_id=0, group_id=0, question=ROW["question"], golds=[["Rome"], ["Oslo"]])
    for q, ob in queries_and_obs:
        _turn(t, q, ob, ob)
    t.conversations.append(Conversation(prompt_ids=[1], blocks=[f"<think>m</think>\n\\boxed{{{answer}}}"],
                                        ended_with_eos=True))
    t.finish("answer")
    return rep.episode(t, ROW, CHARS, "memsearcher")


def test_failures_are_counted_by_reason_and_a_memory_closed_by_think_is_named():
    rep = _report()
    ok = _answered(rep, [("Lopa born", "Lopa was born in Rome."), ("Tarvel works", "Tarvel works for Acme."),
                         ("Acme", "Acme is in Oslo.")], "Rome; Oslo")
    assert (ok["reward"], ok["failure"], ok["memory_closed_by_think"]) == (1.0, None, False)
    # a sampled update written as a think: the episode ends there, reward 0
    t = Trajectory(traj_id=1, group_id=1, question=ROW["question"], golds=[["Rome"], ["Oslo"]])
    _turn(t, "Lopa born", "Lopa was born in Rome.", "Lopa was born in Rome.")
    _turn(t, "Lopa born", "Lopa was born in Rome.", None, update="<memory>Tarvel: no result.</think>")
    t.finish("no_memory")
    bad = rep.episode(t, ROW, CHARS, "memsearcher")
    assert bad["failure"] == "block 1: unbalanced <think> tags" and bad["reward"] == 0.0
    assert bad["memory_closed_by_think"] and bad["repeated_queries"] == 1
    # out of turns after a well-formed update: a failure, but not a memory closed by </think>
    t = Trajectory(traj_id=2, group_id=2, question=ROW["question"], golds=[["Rome"], ["Oslo"]])
    _turn(t, "Tarvel works", "Tarvel works for Acme.", "Tarvel works for Acme.")
    t.finish("max_turns")
    cut = rep.episode(t, ROW, CHARS, "memsearcher")
    assert cut["failure"] == "last block has no \\boxed{} answer" and not cut["memory_closed_by_think"]
    assert rep.memory_closed_by_think("<memory>X: no result.</think>")
    assert rep.memory_closed_by_think("<memory>The memory has the answer.</think>\\boxed{Rome}")
    assert not rep.memory_closed_by_think("<memory>Lopa was born in Rome.</memory>")
    assert not rep.memory_closed_by_think("<think>s</think>")
    s = rep.summarize([ok, bad, cut])
    assert s["failed"] == 2 and s["memory_closed_by_think"] == 1 and s["reward"] == pytest.approx(1 / 3)
    assert s["failures"] == {"unbalanced <think> tags": {"episodes": 1, "searches": 2.0, "reward": 0.0},
                             "last block has no \\boxed{} answer": {"episodes": 1, "searches": 1.0, "reward": 0.0}}
    assert s["repeated_queries"] == pytest.approx(1 / 3)
    # Distinct answer parts are counted over the episodes that answered: the one cut off at the turn
    # limit has no answer (its parts would read as alike), the think-closed one none either.
    assert cut["answer"] is None and bad["answer"] is None
    alike = _answered(rep, [("Lopa born", "Lopa was born in Rome.")], "Rome; Rome")
    assert s["answer_parts_distinct"] == 1.0
    assert rep.summarize([ok, alike, cut])["answer_parts_distinct"] == 0.5
    assert rep.summarize([cut])["answer_parts_distinct"] is None


def test_a_memory_sentence_read_from_no_observation_is_counted_as_unsupported():
    """The update writes the second subject with a value its observation never showed ("Tarvel works
    for Rome." where the document said Acme): unsupported. A kept sentence and a no-result note
    (either wording) are not new reads and count for nothing."""
    rep = _report()
    t = Trajectory(traj_id=0, group_id=0, question=ROW["question"], golds=[["Rome"], ["Oslo"]])
    _turn(t, "Lopa born", "Doc 1 Lopa was born in Rome.", "Lopa was born in Rome.")
    _turn(t, "Tarvel works", "Doc 1 Tarvel works for Acme.", "Lopa was born in Rome. Tarvel works for Rome.")
    _turn(t, "Acme based", "Doc 1 Zed is in Oslo.", "Lopa was born in Rome. Tarvel works for Rome. Acme: no result.")
    _turn(t, "Acme city", "Doc 1 Zed is in Oslo.",
          "Lopa was born in Rome. Tarvel works for Rome. Nothing found about Acme yet. Acme is in Oslo.")
    t.conversations.append(Conversation(prompt_ids=[1], blocks=["<think>m</think>\n\\boxed{Rome; Oslo}"]))
    t.finish("answer")
    e = rep.episode(t, ROW, CHARS, "memsearcher")
    assert [(u["new"], u["unsupported"]) for u in e["updates"]] == [(1, 0), (1, 1), (0, 0), (1, 1)]
    assert rep.summarize([e])["update_unsupported_rate"] == pytest.approx(2 / 3)
    assert rep.sentences(" A b. C d.  ") == ["A b.", "C d."]
    assert rep.NO_RESULT.fullmatch("Nothing found about Acme yet.") and rep.NO_RESULT.fullmatch("Acme: no result.")
    assert not rep.NO_RESULT.fullmatch("Acme is in Oslo.")
    assert rep.summarize([rep.episode(t, ROW, CHARS, "react")])["update_unsupported_rate"] is None


def test_objectives_split_by_hops_searched_and_each_hop_retrieved():
    rep = _report()
    # both questions searched, the 2-hop one's second fact found
    full = _answered(rep, [("Lopa born", "Lopa was born in Rome."), ("Tarvel works", "Tarvel works for Acme."),
                           ("Acme", "Acme is in Oslo.")], "Rome; Oslo")
    # only the 1-hop question searched
    half = _answered(rep, [("Lopa born", "Lopa was born in Rome.")], "Rome; Rome")
    hops = rep.summarize([full, half])["by_hops"]
    assert hops == {"1-hop": {"objectives": 2, "searched": 1.0, "retrieved": [1.0]},
                    "2-hop": {"objectives": 2, "searched": 0.5, "retrieved": [0.5, 0.5]}}
    one = rep.summarize([_answered(rep, [("Tarvel works", "Tarvel works for Acme.")], "Rome; Acme")])["by_hops"]
    assert one["1-hop"]["searched"] == 0.0 and one["2-hop"]["retrieved"] == [1.0, 0.0]


def test_greedy_and_sampled_reports_never_share_a_file():
    rep = _report()
    greedy = rep.report_name("memsearcher", "grpo", 2, sampled=False, seed=123)
    assert greedy == "memsearcher-grpo-N2.jsonl"  # the name earlier greedy reports have
    sampled = {rep.report_name("memsearcher", "grpo", 2, sampled=True, seed=s) for s in (123, 7)}
    assert len(sampled) == 2 and greedy not in sampled and all(n.endswith("-sampled-seed123.jsonl")
                                                                or n.endswith("-sampled-seed7.jsonl") for n in sampled)


def test_sampled_refuses_a_greedy_run_and_unknown_models_before_loading(tmp_path):
    rep = _report()
    cfg = {"agent": {"temperature": 0.0}, "train": {"output_dir": ""}}
    (tmp_path / "settings.json").write_text(json.dumps({"workflow_configs": {"memsearcher": cfg}}))
    out = tmp_path / "out"
    with pytest.raises(UserInputError, match="agent.temperature=0.0"):
        rep.main(["--run", str(tmp_path), "--workflows", "memsearcher", "--sampled", "--out", str(out)])
    with pytest.raises(UserInputError, match="--models best"):
        rep.main(["--run", str(tmp_path), "--workflows", "memsearcher", "--models", "best"])
    with pytest.raises(UserInputError, match="holds no such workflow"):
        rep.main(["--run", str(tmp_path), "--workflows", "react"])
    assert not out.exists()  # refused before anything was written
