"""bench/episode_report.py: the per-episode account of where a workflow's episodes fail, checked on
hand-made trajectories (a builder whose ids are characters)."""
from __future__ import annotations

import importlib.util
import os
import sys
import types

from memsearcher_jax.agent.trajectory import Conversation, Trajectory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _report():
    sys.path.insert(0, ROOT)
    spec = importlib.util.spec_from_file_location("episode_report", os.path.join(ROOT, "bench", "episode_report.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CHARS = types.SimpleNamespace(decode=lambda ids: "".join(map(chr, ids)))
CALL = '<think>s</think>\n<tool_call>{"name": "wikipedia_search", "arguments": {"query": "%s", "top_n": 2}}</tool_call>'
ROW = {"question": "q1; q2", "objectives": [
    {"question": "q1", "hops": 1, "subject": "Lopa", "facts": ["Lopa was born in Rome."], "golden_answers": ["Rome"]},
    {"question": "q2", "hops": 2, "subject": "Tarvel", "facts": ["Tarvel works for Acme.", "Acme is in Oslo."],
     "golden_answers": ["Oslo"]}]}


def _turn(t, query, observation, memory):
    conv = Conversation(prompt_ids=[1])
    conv.add_generated([65], [0.0])
    conv.add_injected([ord(c) for c in observation])
    conv.add_generated([66], [0.0])
    conv.blocks = [CALL % query, f"<memory>{memory}</memory>"]
    t.conversations.append(conv)
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
    assert e["updates"] == [{"had": 1, "kept": 1}, {"had": 2, "kept": 1}]
    s = rep.summarize([e])
    assert s["obj_em"] == 0.5 and s["obj_all_retrieved"] == 0.5 and s["obj_all_held"] == 0.0
    assert s["update_keep_rate"] == 2 / 3 and s["end_reasons"] == {"answer": 1}
    # react holds what its context holds: every observation
    r = rep.episode(t, ROW, CHARS, "react")
    assert [o["held"] for o in r["objectives"]] == [[True], [True, False]] and r["updates"] == []
