"""bench/episode_report.py: the per-episode account of where a workflow's episodes fail, checked on
hand-made trajectories (a builder whose ids are characters)."""
from __future__ import annotations

import json
import os
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


# ----------------------------------------------------------------------------- --out: the rules of every writer

def _paper_run(tmp_path, workflows=("memsearcher", "react"), trained=("memsearcher",)):
    """A bench/paper_tables.py --out directory: settings.json with each workflow's config, and a run
    directory (marker, warm start, checkpoint) for each workflow of `trained` only."""
    from memsearcher_jax.rules.run_dir import RUN_MARKER

    run = tmp_path / "paper"
    run.mkdir()
    cfg = {"agent": {"temperature": 1.0}, "train": {"output_dir": ""}, "model": {"dtype": "float32",
                                                                                  "param_dtype": "float32"}}
    (run / "settings.json").write_text(json.dumps({"workflow_configs": {w: cfg for w in workflows}}))
    for w in trained:
        (run / w / "warmstart").mkdir(parents=True)
        (run / w / "warmstart" / "config.json").write_text("{}")
        (run / w / "checkpoints" / "1").mkdir(parents=True)
        (run / w / RUN_MARKER).write_text(json.dumps({"written_by": "memsearcher-jax train"}))
    return run


def _no_load(monkeypatch, rep):
    """The first expensive step fails the test: refusals must come before it."""
    def started(*a, **k):
        raise AssertionError("episode_report started working before refusing")
    monkeypatch.setattr(rep, "build_setup", started)


def _tree(root) -> dict:
    return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(root) for f in files}


def test_out_refuses_a_file_your_directory_and_a_runs_directory_before_loading(tmp_path, monkeypatch):
    """--out follows every writer's rules (run_dir.check_marked_out): a file or a path under one, a
    non-empty directory no earlier episode_report wrote (a report of the same name and a summary.md
    of the user's would be replaced and appended to), a training run's directory (its --fresh
    would then refuse), and the --run directory itself are refused before anything loads."""
    rep = _report()
    _no_load(monkeypatch, rep)
    run = _paper_run(tmp_path)
    afile = tmp_path / "report.txt"
    afile.write_text("mine")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "memsearcher-grpo-N2.jsonl").write_text("my report\n")
    (mine / "summary.md").write_text("my summary\n")
    before = _tree(tmp_path)
    base = ["--run", str(run), "--workflows", "memsearcher"]
    for out, says in ((afile, "is a file"), (afile / "sub", "is a file"), (mine, "no earlier episode_report"),
                      (run / "memsearcher", "inside the run directory"),
                      (run / "memsearcher" / "reports", "inside the run directory"), (run, "the --run directory")):
        with pytest.raises(UserInputError, match=says):
            rep.main(base + ["--out", str(out)])
    assert _tree(tmp_path) == before


def test_a_workflow_or_model_the_run_lacks_is_named_before_loading(tmp_path, monkeypatch):
    """--workflows react on a run that trained memsearcher only (its settings.json still holds
    react's config): one message naming the missing warm start, not a traceback from the loader;
    the same for a GRPO model without a checkpoint."""
    rep = _report()
    _no_load(monkeypatch, rep)
    run = _paper_run(tmp_path)
    with pytest.raises(UserInputError, match=f"{run / 'react' / 'warmstart'}.*paper_tables.py"):
        rep.main(["--run", str(run), "--workflows", "memsearcher,react", "--models", "warm_start"])
    import shutil
    shutil.rmtree(run / "memsearcher" / "checkpoints")
    with pytest.raises(UserInputError, match=f"--models grpo.*{run / 'memsearcher'}.*no GRPO checkpoint"):
        rep.main(["--run", str(run), "--workflows", "memsearcher", "--models", "grpo"])
    assert not (run / "episode_report").exists()


def test_the_command_exits_2_with_one_line(tmp_path):
    """As a user runs it: `python bench/episode_report.py --out FILE` is one line and exit 2."""
    import subprocess
    import sys

    from tests.bench_loader import ROOT

    run = _paper_run(tmp_path)
    afile = tmp_path / "report.txt"
    afile.write_text("mine")
    got = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "episode_report.py"), "--run", str(run),
                          "--workflows", "memsearcher", "--out", str(afile)], capture_output=True, text=True,
                         timeout=300)
    assert got.returncode == 2 and got.stderr.startswith("episode_report: --out") and "is a file" in got.stderr
    assert "Traceback" not in got.stderr and len(got.stderr.strip().splitlines()) == 1, got.stderr
    assert afile.read_text() == "mine"
