"""bench/paper_tables.py: the four tables assembled from hand-made results, the per-workflow
configs it trains, and its report files."""
from __future__ import annotations

import json
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import paper_tables as pt  # noqa: E402

from memsearcher_jax.errors import UserInputError  # noqa: E402
from memsearcher_jax.rules.run_dir import RUN_MARKER  # noqa: E402


def _m(em, f1, peak, per_q, by_turn=()):
    return {"em": em, "f1": f1, "peak_tokens": peak, "tokens_per_question": per_q, "turns": 2.0,
            "prompt_tokens_by_turn": [{"turn": i + 1, "mean": mean, "max": mx, "n": n}
                                      for i, (mean, mx, n) in enumerate(by_turn)]}


RESULTS = {
    "memsearcher": {"grpo_minutes": 12.34,
                    "warm_start": {1: _m(0.10, 0.20, 150, 400), 2: _m(0.05, 0.15, 160, 500)},
                    "grpo": {1: _m(0.80, 0.85, 170, 600), 2: _m(0.70, 0.75, 180, 900,
                                                                  [(120.4, 130, 10), (125, 140, 9)]),
                             4: _m(0.50, 0.55, 190, 1500), 8: _m(0.40, 0.45, 200, 3000)}},
    "react": {"grpo_minutes": 20.0,
              "warm_start": {1: _m(0.12, 0.22, 300, 700), 2: _m(0.06, 0.16, 420, 900)},
              "grpo": {"1": _m(0.78, 0.8, 330, 800), "2": _m(0.66, 0.7, 500, 1200,
                                                             [(120, 130, 10), (260, 300, 8), (400, 450, 2)]),
                       "4": _m(0.3, 0.4, 900, 2500)}},  # string keys: as read back from results.json; 8 missing
}


def test_table1_rows_per_workflow_and_stage():
    lines = pt.table1(RESULTS).splitlines()
    assert lines[0].startswith("| workflow | model | EM @1 | F1 @1 | EM @2 | F1 @2 | peak tokens @2")
    assert lines[2] == "| memsearcher | GRPO | 80.0 | 85.0 | 70.0 | 75.0 | 180 | 900 | 12.3 |"
    assert lines[3] == "| memsearcher | warm start only | 10.0 | 20.0 | 5.0 | 15.0 | 160 | 500 | — |"
    assert lines[4] == "| react | GRPO | 78.0 | 80.0 | 66.0 | 70.0 | 500 | 1200 | 20.0 |"
    assert len(lines) == 6


def test_table2_by_turn_cells_and_missing_turns():
    lines = pt.table2(RESULTS).splitlines()
    assert lines[0] == "| workflow | turn 1 | turn 2 | turn 3 |"
    assert lines[2] == "| memsearcher | 120 / 130 (n=10) | 125 / 140 (n=9) | — |"
    assert lines[3] == "| react | 120 / 130 (n=10) | 260 / 300 (n=8) | 400 / 450 (n=2) |"


def test_table3_every_objective_count_missing_is_a_dash():
    lines = pt.table3(RESULTS).splitlines()
    assert lines[0] == ("| workflow | EM @1 | peak @1 | EM @2 | peak @2 | EM @4 | peak @4 | EM @8 | peak @8 | EM @16 | "
                        "peak @16 |")
    assert lines[2] == "| memsearcher | 80.0 | 170 | 70.0 | 180 | 50.0 | 190 | 40.0 | 200 | — | — |"
    assert lines[3] == "| react | 78.0 | 330 | 66.0 | 500 | 30.0 | 900 | — | — | — | — |"


def test_table4_sorted_by_budget():
    lines = pt.table4({"64": _m(0.5, 0.6, 200, 900), 16: _m(0.2, 0.3, 150, 700)}).splitlines()
    assert lines[2] == "| 16 | 20.0 | 30.0 | 150 | 2.00 |" and lines[3].startswith("| 64 | 50.0 |")


def test_report_files_round_trip(tmp_path):
    report = {"date": "2026-11-24", "command": "python bench/paper_tables.py --quick", "train_objectives": 2,
              "objectives": [1, 2, 4, 8], "eval_questions": 12, "quick": True, "budget_training": False,
              "workflows": RESULTS, "budgets": {16: _m(0.2, 0.3, 150, 700)}}
    pt.write_report(report, str(tmp_path))
    again = json.load(open(tmp_path / "results.json"))
    md = (tmp_path / "tables.md").read_text()
    assert pt.tables_markdown(again) == md  # the JSON holds everything the tables show
    assert "2026-11-24" in md and "`python bench/paper_tables.py --quick`" in md
    assert md.count("## Table") == 4 and "| memsearcher | GRPO | 80.0 |" in md
    assert (tmp_path / "prompt_tokens_by_turn.png").stat().st_size > 1000

    assert "Trained on 2 objectives;" in md
    mixed = pt.tables_markdown({**report, "train_mix": "1,2,3,4"})
    assert "GRPO trained on 1, 2, 3, 4 objectives in equal shares;" in mixed


def test_report_files_replace_links_instead_of_writing_through_them(tmp_path):
    """A results.json, tables.md, plot or phase file in OUT that links to a user's file: the report is
    written beside it and renamed over the link; the user's file keeps its bytes (issue 82, item 4)."""
    out, mine = tmp_path / "out", tmp_path / "mine"
    out.mkdir(), mine.mkdir()
    names = ("results.json", "tables.md", "prompt_tokens_by_turn.png")
    for name in names:
        (mine / name).write_text(f"my {name}\n")
        os.symlink(mine / name, out / name)
    phase = pt.phase_path(str(out), "memsearcher", "grpo@1")
    os.makedirs(os.path.dirname(phase))
    os.symlink(mine / "nowhere.json", phase)  # run_phase reads a phase that exists: a dangling link is new to it
    report = {"date": "2026-12-07", "command": "c", "train_objectives": 2, "objectives": [1, 2], "eval_questions": 2,
              "quick": True, "budget_training": False, "workflows": RESULTS, "budgets": {}}
    pt.write_report(report, str(out))
    assert pt.run_phase(phase, lambda: {"em": 0.5}, log=lambda *a, **k: None) == {"em": 0.5}
    for name in names:
        assert (mine / name).read_text() == f"my {name}\n" and not os.path.islink(out / name)
    assert json.load(open(out / "results.json"))["date"] == "2026-12-07"
    assert not os.path.islink(phase) and not (mine / "nowhere.json").exists()


def test_workflow_config_gives_room_for_the_objectives():
    from memsearcher_jax.settings import load_settings as load_config  # the bench's Settings, built once

    base = load_config(os.path.join(ROOT, "configs/default.py"))
    cfg = pt.workflow_config(base, "react", "/tmp/x/react", 2, memory_budget=32)
    assert (cfg.agent.workflow, cfg.world.objectives, cfg.agent.memory_budget) == ("react", 2, 32)
    # 2N+2 = 6 for the pairs trained, but the warm start shows up to 4 questions (2x4 searches + the
    # answer): the turns and the training memory cover those demonstrations too
    assert cfg.agent.max_turns == 9 and cfg.train.eval_questions == 0
    default_budget = pt.workflow_config(base, "memsearcher", "/tmp/x/ms", 2)
    assert default_budget.agent.memory_budget == pt.MEMORY_PER_OBJECTIVE * 4
    from memsearcher_jax.app.experiment import build_setup, demo_questions
    from memsearcher_jax.app.validation import demo_turn_problems
    rows = demo_questions(default_budget, build_setup(default_budget))
    assert demo_turn_problems(rows, default_budget.agent.max_turns, default_budget.world.objectives) == []
    # react's whole history fits at 8 objectives: no workflow is cut by a cap the others never reach
    assert cfg.agent.max_context_tokens == cfg.agent.max_response_tokens == 4096 > base.agent.max_context_tokens
    assert base.agent.workflow == "memsearcher" and base.world.objectives == 1  # the base is not changed
    # the warm start shows singles and up to 4 questions at once
    assert cfg.sft.demo_objectives == "1,2,3,4" and base.sft.demo_objectives == ""
    assert pt.workflow_config(base, "react", "/tmp/x/react", 1).sft.demo_objectives == ""
    ecfg = pt.eval_config(cfg, 8)
    assert ecfg.world.objectives == 8 and ecfg.agent.eval_max_turns == 19


def test_quick_overrides_yield_to_the_command_line():
    args, overrides = pt.parse_args(["--quick", "--config.train.steps=5"])
    assert args.quick and ("sft.steps", str(pt.QUICK["sft.steps"])) in overrides
    assert (args.objectives, args.budgets) == ("1,2,8", "16,64")
    full, _ = pt.parse_args(["--budgets", ""])
    assert (full.objectives, full.budgets) == ("1,2,4,8,16", "")
    assert overrides.index(("train.steps", "5")) > overrides.index(("train.steps", str(pt.QUICK["train.steps"])))



def test_the_bench_warm_start_is_longer_than_the_default_jobs_and_the_command_line_wins():
    from memsearcher_jax.app.warm_start import warm_start_steps
    from memsearcher_jax.settings import load_settings as load_config  # the bench's Settings, built once

    config = os.path.join(ROOT, "configs/default.py")
    default = load_config(config)
    _, overrides = pt.parse_args([])
    bench = load_config(config, overrides)
    assert bench.sft.passes == pt.BENCH["sft.passes"] > 0 == default.sft.passes
    rows = 2500  # memsearcher's ~2500 demonstrated turns: 3 passes, against the default job's 150 steps
    assert warm_start_steps(bench.sft, rows) == 469 > warm_start_steps(default.sft, rows) == default.sft.steps
    assert warm_start_steps(bench.sft, 600) == 113  # react: one row per episode, the same 3 passes
    _, overrides = pt.parse_args(["--config.sft.passes=0", "--config.sft.steps=7"])
    assert warm_start_steps(load_config(config, overrides).sft, rows) == 7
    _, overrides = pt.parse_args(["--quick"])
    assert warm_start_steps(load_config(config, overrides).sft, rows) == pt.QUICK["sft.steps"]


def test_help_lists_the_settings_the_bench_puts_before_the_command_line(capsys):
    with pytest.raises(SystemExit):
        pt.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for key, value in {**pt.BENCH, **pt.QUICK}.items():
        assert f"{key}={value}" in text
    # What GRPO trains on is the mix the bench sets: the help said `--train-objectives` (2) questions.
    grpo = text[text.index("trained with GRPO"):].split(". ")[0]
    assert f"world.objectives_mix={pt.BENCH['world.objectives_mix']}" in grpo, grpo
    assert "only when world.objectives_mix is ''" in text  # what --train-objectives sets, then

TINY = ["--config.model.source=init", "--config.model.hidden_size=64", "--config.model.intermediate_size=128",
        "--config.model.num_layers=2", "--config.model.head_dim=16", "--config.sft.steps=1", "--config.sft.passes=0",
        "--config.sft.name_swap_rate=0",  # a random init has no reading vocabulary to swap names in
        "--config.sft.num_demos=8", "--config.sft.batch_size=4", "--config.train.steps=1",
        "--config.train.save_every=1", "--config.rl.batch_questions=2", "--config.rl.group_size=2",
        "--config.rl.micro_batch_size=4", "--config.rl.logprob_batch_size=8", "--config.agent.max_new_tokens=16",
        "--config.agent.eval_max_turns=1", "--config.agent.max_turns=1"]


@pytest.mark.slow
def test_end_to_end_tiny_run_writes_every_table(tmp_path):
    """Warm start, one GRPO step and the evaluations of one workflow on a tiny random model (every
    workflow's GRPO step has its own smoke test in test_workflows.py)."""
    out = tmp_path / "tables"
    argv = ["--workflows", "memsearcher", "--train-objectives", "1", "--objectives", "1,2",
            "--budgets", "16", "--eval-questions", "2", "--out", str(out),
            f"--config.world.cache_dir={tmp_path / 'worlds'}", *TINY]
    assert pt.main(argv) == 0
    report = json.load(open(out / "results.json"))
    for w in ("memsearcher",):
        r = report["workflows"][w]
        assert set(r["grpo"]) == {"1", "2"} and set(r["warm_start"]) == {"1", "2"}
        assert r["grpo"]["2"]["questions"] == 2 and r["grpo"]["2"]["peak_tokens"] > 0
        assert r["grpo_minutes"] > 0 and os.path.isdir(out / w / "checkpoints")
    assert set(report["budgets"]) == {"16"}
    md = (out / "tables.md").read_text()
    assert md.count("## Table") == 5 and "| memsearcher | warm start only |" in md  # Tables 1-5 (5: coverage)


def test_an_unknown_workflow_is_refused_before_anything_trains(tmp_path):
    from memsearcher_jax.app.experiment import TrainConfigError

    with pytest.raises(TrainConfigError, match="workflow"):
        pt.main(["--workflows", "memsearcher,nope", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("key, value, named", [("sft.passes", "-1", "sft.passes=-1"),
                                                ("agent.tool", "bing_search", "agent.tool='bing_search'")])
def test_a_bad_setting_is_refused_before_anything_trains(key, value, named, tmp_path, monkeypatch):
    """The bench checked each workflow's config with experiment.validate, which did not see the
    settings only the jobs' validator asked (sft.passes=-1 trained one warm-start step); it runs
    the one pass now."""
    from memsearcher_jax.app.experiment import TrainConfigError

    def trained(*args, **kwargs):
        raise AssertionError("the bench went on with a config it should have refused")

    monkeypatch.setattr(pt, "check_settings", trained)
    monkeypatch.setattr(pt, "run_workflow", trained)
    with pytest.raises(TrainConfigError, match=re.escape(named)):
        pt.main(["--workflows", "react", "--out", str(tmp_path / "o"), f"--config.{key}={value}"])
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- resumable phases

class FakeJob:
    """Stands in for train_job and the model evaluations: records each call, returns made-up
    metrics, and can fail on a chosen call (a session killed mid-run)."""

    def __init__(self, fail_on=None):
        self.calls, self.fail_on = [], fail_on

    def _record(self, call):
        if call == self.fail_on:
            raise KeyboardInterrupt(f"killed during {call}")
        self.calls.append(call)

    def train(self, cfg, resume):
        assert resume is True  # an unfinished GRPO resumes from its checkpoint
        self._record(("train", cfg.agent.workflow))
        return {"grpo_seconds": 120.0}

    def rft(self, cfg, seconds):
        self._record(("rft", cfg.agent.workflow))
        assert seconds == 120.0  # at least GRPO's time
        return {"sampled": 8, "kept": 2}

    def evaluator(self, workflow):
        def evaluate(which, n, memory_budget=None):
            self._record((workflow, which, n) if memory_budget is None else (workflow, which, n, memory_budget))
            return _m(0.5 if which == "grpo" else 0.1, 0.6, 100 * n, 300 * n, [(100, 110, 4)])
        return evaluate


def _base_cfg(out, workflow):
    from memsearcher_jax.settings import load_settings as load_config  # the bench's Settings, built once

    return pt.workflow_config(load_config(os.path.join(ROOT, "configs/default.py")), workflow,
                              os.path.join(out, workflow), 2)


def test_a_rerun_skips_finished_phases_and_redoes_only_the_missing(tmp_path, monkeypatch, capsys):
    out = str(tmp_path)
    cfg = _base_cfg(out, "react")
    job = FakeJob()
    monkeypatch.setattr(pt, "train_job", job.train)
    first = pt.run_workflow(cfg, (1, 2, 4), out, job.evaluator("react"))
    assert job.calls == [("train", "react"), ("react", "warm_start", 1), ("react", "warm_start", 2),
                         ("react", "grpo", 1), ("react", "grpo", 2), ("react", "grpo", 4)]
    assert first["grpo_minutes"] == 2.0 and first["grpo"][4]["peak_tokens"] == 400
    assert sorted(os.listdir(tmp_path / "phases" / "react")) == [
        "grpo@1.json", "grpo@2.json", "grpo@4.json", "train.json", "warm_start@1.json", "warm_start@2.json"]

    capsys.readouterr()
    job.calls.clear()
    again = pt.run_workflow(cfg, (1, 2, 4), out, job.evaluator("react"))
    assert job.calls == []  # nothing trained or evaluated twice
    assert json.loads(json.dumps(again)) == json.loads(json.dumps(first))
    log = capsys.readouterr().out
    assert log.count("skipped (done earlier)") == 6 and "phases/react/grpo@4.json" in log

    os.remove(tmp_path / "phases" / "react" / "grpo@2.json")  # one phase lost
    pt.run_workflow(cfg, (1, 2, 4, 8), out, job.evaluator("react"))  # and a new objective count asked for
    assert job.calls == [("react", "grpo", 2), ("react", "grpo", 8)]


def test_a_killed_phase_leaves_nothing_and_reruns(tmp_path, monkeypatch):
    out = str(tmp_path)
    cfg = _base_cfg(out, "mem1")
    killed = FakeJob(fail_on=("mem1", "grpo", 2))
    monkeypatch.setattr(pt, "train_job", killed.train)
    with pytest.raises(KeyboardInterrupt):
        pt.run_workflow(cfg, (1, 2), out, killed.evaluator("mem1"))
    assert not os.path.exists(pt.phase_path(out, "mem1", "grpo@2"))
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path / "phases" / "mem1"))
    job = FakeJob()
    monkeypatch.setattr(pt, "train_job", job.train)
    pt.run_workflow(cfg, (1, 2), out, job.evaluator("mem1"))
    assert job.calls == [("mem1", "grpo", 2)]


def test_budget_sweep_phases_resume(tmp_path):
    out = str(tmp_path)
    cfg = _base_cfg(out, "memsearcher")
    job = FakeJob()
    got = pt.budget_sweep(cfg, (16, 32), out, 4, train_each=False, evaluator=job.evaluator("memsearcher"))
    assert job.calls == [("memsearcher", "grpo", 2, 16), ("memsearcher", "grpo", 2, 32)] and set(got) == {16, 32}
    job.calls.clear()
    pt.budget_sweep(cfg, (16, 32, 64), out, 4, train_each=False, evaluator=job.evaluator("memsearcher"))
    assert job.calls == [("memsearcher", "grpo", 2, 64)]


def test_main_resumes_the_same_command_and_refuses_other_settings(tmp_path, monkeypatch, capsys):
    job = FakeJob()
    monkeypatch.setattr(pt, "train_job", job.train)
    monkeypatch.setattr(pt, "timed_rft", job.rft)
    monkeypatch.setattr(pt, "ModelEvaluator", lambda cfg, q: job.evaluator(cfg.agent.workflow))
    argv = ["--workflows", "memsearcher,react", "--objectives", "1,2", "--budgets", "16", "--out", str(tmp_path),
            "--eval-questions", "4"]
    assert pt.main(argv) == 0
    assert ("train", "memsearcher") in job.calls and ("train", "react") in job.calls
    assert ("rft", "react") in job.calls and ("react", "rft", 2) in job.calls  # Table 1's RFT row
    assert ("memsearcher", "grpo", 2, 16) in job.calls
    md = (tmp_path / "tables.md").read_text()
    assert "| react | GRPO | 50.0 |" in md and "| 16 | 50.0 |" in md and "| react | RFT (same rollouts) | 10.0 |" in md
    assert "Seed 0; base reading_v8; commit " in md
    job.calls.clear()
    assert pt.main(argv) == 0 and job.calls == []
    assert (tmp_path / "tables.md").read_text().split("\n", 1)[1] == md.split("\n", 1)[1]
    with pytest.raises(UserInputError, match=r"other settings \(config.rl.group_size: 5 -> 3\)"):
        pt.main(argv + ["--config.rl.group_size=3"])
    with pytest.raises(UserInputError, match=r"eval_questions: 4 -> 5"):
        pt.main(argv[:-1] + ["5"])
    # A rule of workflow_config changed by the code (not the command) refuses the rerun too.
    monkeypatch.setattr(pt, "CONTEXT_ROOM", 2048)
    with pytest.raises(UserInputError, match=r"workflow_configs\.\w+\.agent\.max_context_tokens: 4096 -> 2048"):
        pt.main(argv)
    assert job.calls == []


def test_an_out_with_files_but_no_settings_is_refused(tmp_path, monkeypatch):
    job = FakeJob()
    monkeypatch.setattr(pt, "train_job", job.train)
    (tmp_path / "react").mkdir()  # e.g. a run from before settings.json, or someone's own directory
    with pytest.raises(UserInputError, match="not empty and holds no settings.json"):
        pt.main(["--workflows", "react", "--objectives", "1", "--budgets", "", "--out", str(tmp_path)])
    assert job.calls == [] and sorted(os.listdir(tmp_path)) == ["react"]


def test_grpo_minutes_count_every_logged_step_of_a_resumed_run(tmp_path, monkeypatch):
    out = str(tmp_path)
    cfg = _base_cfg(out, "react")
    os.makedirs(os.path.join(cfg.train.output_dir, "logs"))
    with open(os.path.join(cfg.train.output_dir, "logs", "metrics.jsonl"), "w") as f:
        for step in (1, 2):  # step 1 ran before a kill, step 2 after the resume
            f.write(json.dumps({"step": step, "time_rollout": 20.0, "time_logprobs": 5.0, "time_update": 20.0}) + "\n")
    job = FakeJob()
    monkeypatch.setattr(pt, "train_job", job.train)  # its summary says 120 s: this call's GRPO only
    assert pt.run_workflow(cfg, (), out, job.evaluator("react"), warm_objectives=())["grpo_minutes"] == 1.5


def test_budget_training_trains_one_run_per_budget_each_resumable(tmp_path, monkeypatch):
    out = str(tmp_path)
    cfg = _base_cfg(out, "memsearcher")
    job = FakeJob()
    monkeypatch.setattr(pt, "train_job", job.train)
    budgets_seen = []
    monkeypatch.setattr(pt, "ModelEvaluator",
                        lambda c, q: budgets_seen.append((c.agent.memory_budget, c.train.output_dir)) or
                        job.evaluator(f"budget{c.agent.memory_budget}"))
    got = pt.budget_sweep(cfg, (16, 32), out, 4, train_each=True)
    assert budgets_seen == [(16, os.path.join(out, "memsearcher_budget16")),
                            (32, os.path.join(out, "memsearcher_budget32"))]
    assert job.calls == [("train", "memsearcher"), ("budget16", "grpo", 2), ("train", "memsearcher"),
                         ("budget32", "grpo", 2)]  # no warm-start evaluation in the sweep
    assert set(got) == {16, 32} and got[16]["em"] == 0.5
    job.calls.clear()
    pt.budget_sweep(cfg, (16, 32), out, 4, train_each=True)
    assert job.calls == []


def test_budget_runs_start_from_memsearchers_warm_start_when_there_is_one(tmp_path, monkeypatch):
    """--budget-training: the warm start reads no memory budget, so each budget's run reuses
    memsearcher's (train_job skips a cached warm start) instead of training the same model again;
    without one, each budget run trains its own as before, and a budget already trained is left."""
    out = str(tmp_path)
    cfg = _base_cfg(out, "memsearcher")
    job = FakeJob()
    seen = []

    def train(c, resume):
        ws = os.path.join(c.train.output_dir, "warmstart", "config.json")
        seen.append((c.agent.memory_budget, os.path.exists(ws) and open(ws).read()))
        return job.train(c, resume)
    monkeypatch.setattr(pt, "train_job", train)
    monkeypatch.setattr(pt, "ModelEvaluator", lambda c, q: job.evaluator("memsearcher"))
    pt.budget_sweep(cfg, (16,), out, 4, train_each=True)
    assert seen == [(16, False)] and not os.path.exists(os.path.join(out, "memsearcher_budget16", "warmstart"))

    warm = tmp_path / "memsearcher" / "warmstart"
    warm.mkdir(parents=True)
    (warm / "config.json").write_text('{"made_by": "memsearcher"}')
    (warm / "model.safetensors").write_bytes(b"weights")
    seen.clear()
    pt.budget_sweep(cfg, (16, 32), out, 4, train_each=True)
    assert seen == [(32, '{"made_by": "memsearcher"}')]  # 16 was trained already: skipped, not given a copy
    copied = tmp_path / "memsearcher_budget32"
    assert (copied / "warmstart" / "model.safetensors").read_bytes() == b"weights"
    assert (copied / RUN_MARKER).exists()  # a run directory train_job resumes in as its own
    assert not any(p.name.startswith(pt.STAGING_PREFIX) for p in copied.iterdir())
    assert (warm / "config.json").read_text() == '{"made_by": "memsearcher"}'  # the source is left as it was


def test_seeds_run_apart_and_table1_gives_mean_and_spread(tmp_path, monkeypatch):
    """--seeds 0,1: each seed (world and training) runs into OUT/seed<S>/ with its own results.json
    (seed, base, git commit, command); OUT/results.json and table1_seeds.md combine them."""
    job, seen = FakeJob(), []
    monkeypatch.setattr(pt, "train_job", lambda cfg, resume: seen.append((cfg.world.seed, cfg.train.seed))
                        or job.train(cfg, resume))
    monkeypatch.setattr(pt, "timed_rft", job.rft)
    monkeypatch.setattr(pt, "ModelEvaluator", lambda cfg, q: job.evaluator(cfg.agent.workflow))
    argv = ["--workflows", "react", "--objectives", "1,2", "--budgets", "", "--out", str(tmp_path), "--seeds", "0,1"]
    assert pt.main(argv) == 0
    assert seen == [(0, 0), (1, 1)]
    for s in (0, 1):
        got = json.loads((tmp_path / f"seed{s}" / "results.json").read_text())
        assert got["seed"] == s and got["base"] == "reading_v8" and len(got["git_commit"]) == 40
        assert got["command"] == "python bench/paper_tables.py " + " ".join(argv)
    combined = json.loads((tmp_path / "results.json").read_text())
    assert combined["seeds"] == [0, 1] and set(combined["by_seed"]) == {"0", "1"}
    table = (tmp_path / "table1_seeds.md").read_text()
    assert "| react | GRPO | 50.0 (50.0-50.0) | 50.0 (50.0-50.0) |" in table
    assert "| react | warm start only | 10.0 (10.0-10.0) |" in table
    # the claims, checked on the seeds' mean (react alone: the memsearcher claims are not measured)
    assert "The papers' claims on the mean over these seeds" in table
    assert "- **met**: GRPO >= warm start + 20 at 2 questions, every workflow (react +40.0)" in table


def test_the_seed_mean_report_averages_what_every_seed_measured():
    """Each figure is the mean over seeds of what all of them measured; a phase one seed lacks is
    left out; peak maxima take the largest; prompt tokens by turn pool the episodes; budgets come
    from the seeds that ran them."""
    one = {"train_objectives": 2, "objectives": [1, 2, 4], "eval_questions": 100,
           "budgets": {"16": _m(0.2, 0.3, 90, 1)},
           "workflows": {"memsearcher": {"grpo_minutes": 10.0,
                                         "warm_start": {"2": _m(0.10, 0.2, 100, 1)},
                                         "grpo": {"1": {**_m(0.8, 0.9, 100, 1), "peak_tokens_max": 120},
                                                  "2": _m(0.30, 0.4, 100, 1, [(100, 110, 10), (50, 60, 2)]),
                                                  "4": _m(0.2, 0.3, 150, 1)}},
                         "react": {"grpo": {"2": _m(0.5, 0.6, 300, 1)}}}}
    two = {"train_objectives": 2, "objectives": [1, 2, 4], "eval_questions": 100,
           "workflows": {"memsearcher": {"grpo_minutes": 20.0,
                                         "warm_start": {2: _m(0.20, 0.3, 100, 1)},
                                         "grpo": {1: {**_m(0.6, 0.7, 100, 1), "peak_tokens_max": 150},
                                                  2: _m(0.50, 0.6, 120, 1, [(200, 210, 30)])}}}}
    mean = pt.seed_mean_report({0: one, 1: two})
    ms = mean["workflows"]["memsearcher"]
    assert ms["grpo_minutes"] == 15.0
    assert ms["warm_start"][2]["em"] == pytest.approx(0.15)
    assert ms["grpo"][1]["em"] == pytest.approx(0.7) and ms["grpo"][1]["peak_tokens_max"] == 150
    assert ms["grpo"][2]["em"] == pytest.approx(0.4) and ms["grpo"][2]["peak_tokens"] == pytest.approx(110)
    assert 4 not in ms["grpo"]  # seed 1 never evaluated 4 objectives
    assert "react" not in mean["workflows"]  # nor ran react
    assert ms["grpo"][2]["prompt_tokens_by_turn"] == [{"turn": 1, "mean": pytest.approx(175.0), "max": 210, "n": 40},
                                                      {"turn": 2, "mean": 50.0, "max": 60, "n": 2}]
    assert mean["budgets"] == {16: pytest.approx({k: v for k, v in _m(0.2, 0.3, 90, 1).items()
                                                  if k in pt.SCALARS})}
    # the targets read it as one report
    assert "memsearcher +25.0" in pt.target_lines(mean)[0]


def test_eval_gives_each_objective_memory_and_table2_reads_four_objectives():
    from memsearcher_jax.settings import load_settings as load_config  # the bench's Settings, built once

    cfg = pt.workflow_config(load_config(os.path.join(ROOT, "configs/default.py")), "memsearcher", "/tmp/x/m", 2)
    # training holds the largest demonstration's facts (4 objectives), the config's 64 being less
    assert cfg.agent.memory_budget == pt.MEMORY_PER_OBJECTIVE * 4 == 128
    assert [pt.eval_config(cfg, n).agent.memory_budget for n in (1, 2, 4, 8, 16)] == [128, 128, 128, 256, 512]
    assert pt.eval_config(cfg, 8, memory_budget=16).agent.memory_budget == 16  # Table 4's own budget wins
    by_turn = [{"turn": 1, "mean": 80.0, "max": 90, "n": 3}]
    four = {"memsearcher": {"grpo": {2: {"prompt_tokens_by_turn": by_turn}, 4: {"prompt_tokens_by_turn": by_turn}}}}
    two = {"memsearcher": {"grpo": {2: {"prompt_tokens_by_turn": by_turn}}}}
    assert pt.table2_objectives({"workflows": four, "train_objectives": 2}) == 4
    assert pt.table2_objectives({"workflows": two, "train_objectives": 2}) == 2


def test_bad_seeds_are_one_line(capsys, tmp_path, monkeypatch):
    """--seeds: whole numbers >= 0; anything else is one line on stderr and exit 2, before any work."""
    for bad in ("a", "-1", ""):
        monkeypatch.setattr("sys.argv", ["paper_tables.py", "--seeds", bad, "--out", str(tmp_path / "o")])
        assert pt.cli() == 2
        assert "--seeds" in capsys.readouterr().err and not (tmp_path / "o").exists()
