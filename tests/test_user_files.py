"""What the tool will not do to your files (issue 56): `train`, `pretrain`, `eval`, `export-hf`,
`index` and the benches' `--out`, pointed at a directory of the user's own files, at a file, at a
run's directory, run twice at once. Each command is run as a user would (`main(argv)`); where the
refusal must come before any work, the first expensive step is replaced by one that fails the
test if it is reached."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from memsearcher_jax.app import jobs, warm_start
from memsearcher_jax.bases import DEFAULT_BASE
from memsearcher_jax.cli import main
from memsearcher_jax.rules.run_dir import RUN_LOCK, RUN_MARKER
from tests.file_trees import snapshot as _files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")
BASE_V8 = os.path.join(ROOT, "configs", "base_v8.py")
sys.path.insert(0, os.path.join(ROOT, "bench"))


def _run(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _no_work(monkeypatch):
    """The first expensive step of train and eval fails the test: refusals must come before it."""
    def started(*a, **k):
        raise AssertionError("the job started working before refusing")
    monkeypatch.setattr(jobs, "build_setup", started)


def _tiny(tmp_path) -> list[str]:
    from tests.test_train_step import SMALL

    return [f"--config.{k}={v}" for k, v in SMALL + [("world.cache_dir", str(tmp_path / "worlds"))]]


def _users_dir(path):
    """A directory of the user's own: a summary and a plot with a run's names, and notes."""
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"em_before": 0.9}))
    (path / "learning_curve.png").write_bytes(b"\x89PNG my plot")
    (path / "notes.md").write_text("mine")
    return path


def _marked_run(path, kind="train"):
    """A run's directory as `train` leaves it (marker, logs, warm start, a checkpoint step)."""
    (path / "logs").mkdir(parents=True)
    (path / RUN_MARKER).write_text(json.dumps({"written_by": f"memsearcher-jax {kind}"}))
    (path / "logs" / "metrics.jsonl").write_text('{"step": 1}\n')
    (path / "warmstart").mkdir()
    (path / "warmstart" / "config.json").write_text("{}")
    (path / "checkpoints" / "1" / "params").mkdir(parents=True)
    (path / "checkpoints" / "1" / "_CHECKPOINT_METADATA").write_text("{}")
    (path / "summary.json").write_text(json.dumps({"em_before": 0.5}))
    return path


# ----------------------------------------------------------------------------- 1: train / pretrain into your directory

def test_train_refuses_a_directory_of_your_own_files(tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    mine = _users_dir(tmp_path / "mine")
    before = _files(mine)
    code, msg = _run(capsys, "train", "--config", DEFAULT, *_tiny(tmp_path), f"--config.train.output_dir={mine}")
    assert code == 2, msg
    assert f"train.output_dir={mine} is not empty" in msg and RUN_MARKER in msg and "notes.md" in msg
    assert "Traceback" not in msg and _files(mine) == before
    (mine / "notes.md").unlink()  # a summary and a plot alone: still yours, and no hint to mark it as a run's
    before = _files(mine)
    code, msg = _run(capsys, "train", "--config", DEFAULT, *_tiny(tmp_path), f"--config.train.output_dir={mine}")
    assert code == 2 and "is not empty" in msg and "touch" not in msg, msg
    assert "Traceback" not in msg and _files(mine) == before


def test_train_names_how_to_mark_a_run_directory_from_before_markers(tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    old = _marked_run(tmp_path / "old")
    (old / RUN_MARKER).unlink()
    code, msg = _run(capsys, "train", "--config", DEFAULT, *_tiny(tmp_path), f"--config.train.output_dir={old}")
    assert code == 2 and f"touch {old / RUN_MARKER}" in msg, msg


def test_train_refuses_a_pretraining_runs_directory(tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    run = _marked_run(tmp_path / "base_run", kind="pretrain")
    before = _files(run)
    code, msg = _run(capsys, "train", "--config", DEFAULT, *_tiny(tmp_path), f"--config.train.output_dir={run}")
    assert code == 2 and "memsearcher-jax pretrain` run" in msg, msg
    assert _files(run) == before


def test_pretrain_refuses_a_directory_of_your_own_files(tmp_path, capsys, monkeypatch):
    from memsearcher_jax.pretrain import run as pretrain

    monkeypatch.setattr(pretrain, "build_vocab", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    mine = _users_dir(tmp_path / "mine")
    before = _files(mine)
    code, msg = _run(capsys, "pretrain", "--config", BASE_V8, f"--config.train.output_dir={mine}")
    assert code == 2 and "is not empty" in msg and "pretraining run" in msg, msg
    assert _files(mine) == before


@pytest.mark.parametrize("value", ["", " "])
def test_a_blank_output_dir_is_refused_not_the_working_directory(value, tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code, msg = _run(capsys, "train", "--config", DEFAULT, *_tiny(tmp_path), f"--config.train.output_dir={value}")
    assert code == 2 and "train.output_dir=" in msg and "blank" in msg, msg
    assert os.listdir(work) == []


def test_a_blank_compilation_cache_is_refused(tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMSEARCHER_JAX_COMPILATION_CACHE", " ")
    code, msg = _run(capsys, "train", "--config", DEFAULT, *_tiny(tmp_path),
                     f"--config.train.output_dir={tmp_path / 'run'}")
    assert code == 2 and "MEMSEARCHER_JAX_COMPILATION_CACHE=' ' is blank" in msg, msg
    assert not (tmp_path / " ").exists() and not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- 3: --fresh removes only the run's own

@pytest.mark.parametrize("foreign", ["logs/my_analysis.ipynb", "warmstart/mynotes/", "checkpoints/notes.txt",
                                     "checkpoints/1/my_eval.json", "best/", "mine.txt"])
def test_fresh_refuses_a_foreign_file_inside_the_runs_own_directories(foreign, tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    run = _marked_run(tmp_path / "run")
    if foreign == "best/":  # best/ holds checkpoint steps only
        (run / "best").mkdir()
        foreign = "best/latest.txt"
    path = run / foreign.rstrip("/")
    if foreign.endswith("/"):
        path.mkdir(parents=True)
        (path / "a.txt").write_text("mine")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("mine")
    before = _files(run)
    code, msg = _run(capsys, "train", "--config", DEFAULT, *_tiny(tmp_path), f"--config.train.output_dir={run}",
                     "--fresh")
    assert code == 2 and str(path) in msg and "nothing was removed" in msg, msg
    assert _files(run) == before


def test_fresh_removes_nothing_when_the_job_fails_before_its_first_step(tmp_path, monkeypatch):
    """The demonstrator that cannot answer under a config (world.objectives=9 with the default
    turns) fails before the earlier run is removed, not after."""
    def fails(*a, **k):
        raise RuntimeError("row 0: script did not answer within 4 turns")
    monkeypatch.setattr(warm_start, "make_demonstrations", fails)
    run = _marked_run(tmp_path / "run")
    before = _files(run)
    with pytest.raises(RuntimeError, match="did not answer"):
        main(["train", "--config", DEFAULT, *_tiny(tmp_path), "--config.sft.steps=2",
              f"--config.train.output_dir={run}", "--fresh"])
    assert _files(run) == before


def _written_by_the_writers(run):
    """A run directory as the code that writes each entry leaves it, each writer called as the jobs
    call it (the marker and lock, the recorded config, the metrics writer, the trainer's checkpoint
    managers, the summary and the plot), with no training: what --fresh must know by name."""
    import types

    import numpy as np
    import orbax.checkpoint as ocp

    from memsearcher_jax.app.curves import plot_curves
    from memsearcher_jax.rl.metrics import MetricsWriter
    from memsearcher_jax.rl.trainer import Trainer
    from memsearcher_jax.rules.run_dir import (
        CURVE,
        LOG_DIR,
        SUMMARY,
        prepare_output_dir,
        record_config,
        release_output_dir,
        replaced,
        write_json,
    )
    from memsearcher_jax.settings.config_utils import load_config

    prepare_output_dir(str(run), fresh=False)
    record_config(load_config(DEFAULT), str(run))
    writer = MetricsWriter(str(run / LOG_DIR))
    writer.write(1, {"reward_mean": 0.5})
    writer.write_samples(1, [{"question": "q", "golds": ["a"], "answer": "a", "reward": 1.0, "end_reason": "answer",
                              "conversations": ["c"]}])
    writer.close()
    loop = types.SimpleNamespace(out_dir=run, loop=types.SimpleNamespace(keep=2), _ckpt=None, _best=None)
    tree = {"w": np.zeros(2, np.float32)}
    with Trainer.checkpoints.fget(loop) as ckpt:
        ckpt.save(1, args=ocp.args.Composite(params=ocp.args.StandardSave(tree), opt_state=ocp.args.StandardSave(tree),
                                             meta=ocp.args.JsonSave({"step": 1})))
    with Trainer.best.fget(loop) as best:
        best.save(1, args=ocp.args.Composite(params=ocp.args.StandardSave(tree)), metrics={"eval/em": 0.5})
    write_json(str(run / SUMMARY), {"em_before": 0.5})
    with replaced(str(run / CURVE)) as png:
        plot_curves([{"step": 1, "reward_mean": 0.5}], png)
    release_output_dir(str(run))


def test_fresh_removes_what_the_writers_wrote_and_nothing_else(tmp_path):
    """What the writers write (`_written_by_the_writers`) and what a killed run leaves (a resume's
    rewrite, Orbax's step in progress, an export's and a rewrite's staging files) is the run's:
    --fresh accepts and removes it all, and refuses the same directory with one file of the user's."""
    from memsearcher_jax.rules.run_dir import foreign_entries, prepare_output_dir, release_output_dir

    run = tmp_path / "run"
    _written_by_the_writers(run)
    assert {"logs", "checkpoints", "best", "summary.json", "learning_curve.png"} <= set(os.listdir(run))
    assert {"metrics.jsonl", "samples.jsonl", "run_config.json"} <= set(os.listdir(run / "logs"))
    assert "metrics" in os.listdir(run / "best" / "1")  # Orbax's item of a best_fn step
    for name in ("logs/metrics.jsonl.tmp", "logs/wandb/run-1/files/config.yaml", "logs/.tmp-write-1a2b-run_config.json",
                 "checkpoints/2.orbax-checkpoint-tmp-7/params/x", "warmstart/model.safetensors",
                 "warmstart/tokenizer.json", "lora_base/config.json", ".tmp-export-abc/config.json",
                 ".tmp-write-0f0f-summary.json"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("run's")
    assert foreign_entries(str(run)) == []
    (run / "logs" / "notes.txt").write_text("mine")
    assert foreign_entries(str(run)) == [str(run / "logs" / "notes.txt")]
    with pytest.raises(ValueError, match="notes.txt, which no training run wrote"):
        prepare_output_dir(str(run), fresh=True)
    (run / "logs" / "notes.txt").unlink()
    prepare_output_dir(str(run), fresh=True)
    release_output_dir(str(run))
    assert sorted(os.listdir(run)) == [RUN_MARKER, RUN_LOCK]


# ----------------------------------------------------------------------------- 4: links in place of a run's files

def test_a_rewrite_replaces_a_link_and_never_writes_through_it(tmp_path):
    """run_dir.replaced (every rewrite of a run's, eval's or a bench's file): the new file is made
    beside the link and renamed over it; the file the link points at is left as it was. A write
    that fails leaves the old file and no temporary file."""
    from memsearcher_jax.rules.run_dir import replaced, write_json

    mine = tmp_path / "mine.json"
    mine.write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").symlink_to(mine)
    write_json(str(out / "summary.json"), {"em": 1})
    assert mine.read_text() == "mine" and not (out / "summary.json").is_symlink()
    assert json.loads((out / "summary.json").read_text()) == {"em": 1}
    with pytest.raises(RuntimeError):
        with replaced(str(out / "summary.json")) as tmp:
            open(tmp, "w").write("half")
            raise RuntimeError("killed mid-write")
    assert json.loads((out / "summary.json").read_text()) == {"em": 1} and os.listdir(out) == ["summary.json"]


def test_the_metrics_log_replaces_a_link_and_never_appends_through_it(tmp_path):
    """logs/metrics.jsonl (appended to every step) as a link to the user's file: the resumed writer
    replaces the link by a file of the lines it keeps; a link put there during the run is replaced
    by a copy of what it showed before the next line is appended; a dangling link is replaced too.
    The user's files are never written."""
    from memsearcher_jax.rl.metrics import MetricsWriter

    logs = tmp_path / "logs"
    logs.mkdir()
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"step": 1}\n{"step": 2}\n')
    (logs / "metrics.jsonl").symlink_to(mine)
    writer = MetricsWriter(str(logs), resume_step=1)
    writer.write(2, {"loss": 0.5})
    assert mine.read_text() == '{"step": 1}\n{"step": 2}\n' and not (logs / "metrics.jsonl").is_symlink()
    assert [json.loads(x)["step"] for x in open(logs / "metrics.jsonl")] == [1, 2]
    (logs / "metrics.jsonl").unlink()
    (logs / "metrics.jsonl").symlink_to(mine)  # during the run
    writer.write(3, {"loss": 0.4})
    assert mine.read_text() == '{"step": 1}\n{"step": 2}\n' and not (logs / "metrics.jsonl").is_symlink()
    assert [json.loads(x)["step"] for x in open(logs / "metrics.jsonl")] == [1, 2, 3]
    writer.close()
    (logs / "samples.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    writer = MetricsWriter(str(logs), resume_step=3)
    writer.write_samples(4, [])
    writer.close()
    assert not (tmp_path / "nowhere.jsonl").exists() and not (logs / "samples.jsonl").is_symlink()


def test_the_markers_and_the_recorded_config_replace_links(tmp_path):
    """The run marker, the recorded config and eval's marker, each a link to a file of the user's
    (a dangling one included): replaced by the file written, never written through."""
    from memsearcher_jax.rules.run_dir import (
        EVAL_MARKER,
        RUN_CONFIG,
        prepare_eval_out,
        prepare_output_dir,
        record_config,
        release_output_dir,
    )
    from memsearcher_jax.settings.config_utils import load_config

    mine = tmp_path / "mine.txt"
    mine.write_text("mine")
    run, ev = tmp_path / "run", tmp_path / "eval"
    (run / "logs").mkdir(parents=True)
    ev.mkdir()
    (run / RUN_MARKER).symlink_to(tmp_path / "nowhere")
    (run / RUN_CONFIG).symlink_to(mine)
    (ev / EVAL_MARKER).symlink_to(mine)
    prepare_output_dir(str(run), fresh=False)
    release_output_dir(str(run))
    record_config(load_config(DEFAULT), str(run))
    prepare_eval_out(str(ev))
    assert mine.read_text() == "mine" and not (tmp_path / "nowhere").exists()
    assert "train" in json.loads((run / RUN_CONFIG).read_text()) and not (run / RUN_CONFIG).is_symlink()
    assert json.loads((run / RUN_MARKER).read_text())["written_by"] == "memsearcher-jax train"
    assert json.loads((ev / EVAL_MARKER).read_text())["written_by"] == "memsearcher-jax eval"


def test_writers_of_a_runs_files_open_none_in_place():
    """Every write of a run's, eval's or episode_report's file goes through run_dir.replaced (a new
    file renamed over the name) or, for the appended logs, an open that refuses a link: no
    `open(path, "w")` or `"a"` on a name a user may have linked."""
    import re

    writes = re.compile(r"""\bopen\((?P<what>[^,()]+(?:\([^()]*\))?[^,()]*),\s*(?:mode=)?["'][wa]""")
    path_writes = re.compile(r"""(?P<what>\w+)(?:\.open\(\s*(?:mode=)?["'][wa]|\.write_(?:text|bytes)\().*""")
    for rel in ("memsearcher_jax/app/jobs.py", "memsearcher_jax/rules/run_dir.py", "memsearcher_jax/rl/metrics.py",
                "memsearcher_jax/rl/trainer.py", "memsearcher_jax/pretrain/run.py",
                "memsearcher_jax/pretrain/export.py", "bench/episode_report.py", "bench/learning.py"):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            text = f.read()
        in_place = [m.group(0) for m in writes.finditer(text) if m.group("what").strip() != "tmp"]
        in_place += [m.group(0) for m in path_writes.finditer(text)  # epath, pathlib
                     if m.group("what") != "tmp" and "# remote: an object store has no links" not in m.group(0)]
        assert in_place == [], (rel, in_place)


def test_the_run_lock_replaces_a_link_and_never_writes_through_it(tmp_path):
    from memsearcher_jax.rules.run_dir import lock_output_dir, release_output_dir

    run = tmp_path / "run"
    run.mkdir()
    mine = tmp_path / "mine.txt"
    mine.write_text("mine")
    (run / RUN_LOCK).symlink_to(mine)
    lock_output_dir(str(run))
    release_output_dir(str(run))
    assert mine.read_text() == "mine" and not (run / RUN_LOCK).is_symlink()
    assert (run / RUN_LOCK).read_text() == str(os.getpid())


# ----------------------------------------------------------------------------- a run that stopped before a checkpoint

def test_a_changed_rerun_is_refused_only_where_a_checkpoint_is(tmp_path):
    """The recorded experiment is protected once a checkpoint holds it: a changed setting in a
    directory with no checkpoint (checkpoints/ or best/) is a start over (`starts_over` names the
    change), unless the directory holds a file no run wrote (what --fresh would refuse)."""
    from memsearcher_jax.rules.run_dir import check_same_experiment, record_config, starts_over
    from memsearcher_jax.settings.config_utils import load_config

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / RUN_MARKER).write_text(json.dumps({"written_by": "memsearcher-jax train"}))
    record_config(load_config(DEFAULT), str(run))
    changed = load_config(DEFAULT, [("sft.steps", "7")])
    check_same_experiment(changed, str(run))
    assert [k for k, _, _ in starts_over(changed, str(run))] == ["sft.steps"]
    assert starts_over(load_config(DEFAULT), str(run)) == []  # the same command resumes
    (run / "checkpoints" / "2.orbax-checkpoint-tmp-1").mkdir(parents=True)  # a step not finished: none
    check_same_experiment(changed, str(run))
    (run / "logs" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="no checkpoint.*notes.txt, which no training run wrote"):
        check_same_experiment(changed, str(run))
    (run / "logs" / "notes.txt").unlink()
    for saved in ("best/3", "checkpoints/2"):
        (run / saved).mkdir(parents=True)
        with pytest.raises(ValueError, match="holds a run of another experiment.*sft.steps"):
            check_same_experiment(changed, str(run))
        assert starts_over(changed, str(run)) == []
        (run / saved).rmdir()


# ----------------------------------------------------------------------------- 5: one process per run directory

def _hold_lock(directory) -> subprocess.Popen:
    """Another process holding `directory`'s run lock (as a running train does), until killed."""
    code = ("import fcntl, os, sys, time\n"
            f"fd = os.open({str(directory / RUN_LOCK)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.write(fd, str(os.getpid()).encode())\n"
            "print('locked', flush=True)\n"
            "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_train_in_a_running_runs_directory_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / RUN_MARKER).write_text(json.dumps({"written_by": "memsearcher-jax train"}))
    other = _hold_lock(run)
    try:
        code, msg = _run(capsys, "train", "--config", DEFAULT, *_tiny(tmp_path), f"--config.train.output_dir={run}",
                         "--config.train.steps=1")
    finally:
        other.kill()
        other.wait()
    assert code == 2, msg
    assert f"train.output_dir={run} is in use" in msg and f"pid {other.pid}" in msg
    assert sorted(os.listdir(run)) == [RUN_MARKER, RUN_LOCK]  # nothing written: no log, no checkpoint


def test_a_second_pretrain_in_a_running_runs_directory_is_refused(tmp_path, capsys, monkeypatch):
    from memsearcher_jax.pretrain import run as pretrain

    monkeypatch.setattr(pretrain, "build_vocab", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    run = tmp_path / "run"
    run.mkdir()
    (run / RUN_MARKER).write_text(json.dumps({"written_by": "memsearcher-jax pretrain"}))
    other = _hold_lock(run)
    try:
        code, msg = _run(capsys, "pretrain", "--config", BASE_V8, f"--config.train.output_dir={run}")
    finally:
        other.kill()
        other.wait()
    assert code == 2 and f"pid {other.pid}" in msg, msg


def test_the_lock_is_held_until_released_and_then_free(tmp_path):
    from memsearcher_jax.rules.run_dir import lock_output_dir, release_output_dir

    run = tmp_path / "run"
    run.mkdir()
    lock_output_dir(str(run))
    lock_output_dir(str(run))  # the same process again (a bench's next job): no refusal
    probe = ("import sys; from memsearcher_jax.rules.run_dir import lock_output_dir\n"
             f"lock_output_dir({str(run)!r})\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    held = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert held.returncode != 0 and f"pid {os.getpid()}" in held.stderr
    release_output_dir(str(run))
    free = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert free.returncode == 0, free.stderr


# ----------------------------------------------------------------------------- 2: eval --out

def test_eval_out_refuses_your_results_before_any_work(tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "results.json").write_text('{"mine": 1}')
    (mine / "trajectories.jsonl").write_text("mine\n")
    before = _files(mine)
    code, msg = _run(capsys, "eval", "--config", DEFAULT, "--model", DEFAULT_BASE, "--out", str(mine))
    assert code == 2 and f"--out {mine} is not empty" in msg and "results.json" in msg, msg
    assert _files(mine) == before


def test_eval_out_a_file_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    afile = tmp_path / "out.json"
    afile.write_text("mine")
    code, msg = _run(capsys, "eval", "--config", DEFAULT, "--model", DEFAULT_BASE, "--out", str(afile))
    assert code == 2 and "is a file" in msg, msg
    code, msg = _run(capsys, "eval", "--config", DEFAULT, "--model", DEFAULT_BASE, "--out", str(afile / "sub"))
    assert code == 2 and "is a file" in msg, msg
    assert afile.read_text() == "mine"


def test_eval_out_inside_a_run_or_the_model_is_refused(tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    run = _marked_run(tmp_path / "run")
    before = _files(run)
    for out in (run / "checkpoints" / "1", run / "eval"):
        code, msg = _run(capsys, "eval", "--config", DEFAULT, "--model", DEFAULT_BASE, "--out", str(out))
        assert code == 2 and f"inside the run directory {run}" in msg, msg
    assert _files(run) == before
    code, msg = _run(capsys, "eval", "--config", DEFAULT, "--model", DEFAULT_BASE, "--out",
                     os.path.join(DEFAULT_BASE, "eval"))
    assert code == 2 and "the evaluated directory" in msg, msg
    assert not os.path.exists(os.path.join(DEFAULT_BASE, "eval"))


def test_eval_out_rewrites_only_an_earlier_evals_files(tmp_path):
    from memsearcher_jax.rules.run_dir import EVAL_MARKER, check_eval_out, prepare_eval_out

    out = tmp_path / "eval"
    paths = prepare_eval_out(str(out))
    assert sorted(os.listdir(out)) == [EVAL_MARKER] and set(paths) == {"results.json", "trajectories.jsonl"}
    (out / "results.json").write_text("{}")
    (out / "my_notes.md").write_text("mine")
    check_eval_out(str(out))  # an earlier eval's directory: its two files may be replaced
    (out / EVAL_MARKER).unlink()
    with pytest.raises(ValueError, match="no earlier eval wrote it"):
        check_eval_out(str(out))


# ----------------------------------------------------------------------------- export-hf, index, benches

def test_export_out_inside_another_run_is_refused(tmp_path, capsys):
    run = _marked_run(tmp_path / "other_run")
    before = _files(run)
    code, msg = _run(capsys, "export-hf", "--checkpoint", str(tmp_path / "some_run"), "--out", str(run / "hf"))
    assert code == 2 and f"inside the run directory {run}" in msg, msg
    assert _files(run) == before


def _corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "contents": f"Title {i}\npassage {i} about things"}) + "\n"
                            for i in range(5)))
    return str(path)


def test_index_out_refuses_your_directory_and_a_file(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "docs.jsonl").write_text("my documents")
    before = _files(mine)
    code, msg = _run(capsys, "index", "--corpus", _corpus(tmp_path), "--out", str(mine), "--index-type", "bm25")
    assert code == 2 and "holds no index" in msg and "docs.jsonl" in msg, msg
    assert _files(mine) == before
    code, msg = _run(capsys, "index", "--corpus", _corpus(tmp_path), "--out", str(mine / "docs.jsonl"),
                     "--index-type", "bm25")
    assert code == 2 and "is a file" in msg, msg
    assert _files(mine) == before
    code, msg = _run(capsys, "index", "--corpus", _corpus(tmp_path), "--out", str(tmp_path / "idx"),
                     "--index-type", "bm25")
    assert code == 0, msg
    code, msg = _run(capsys, "index", "--corpus", _corpus(tmp_path), "--out", str(tmp_path / "idx"),
                     "--index-type", "bm25", "--overwrite")
    assert code == 0, msg


def test_paper_tables_out_a_file_is_a_message(tmp_path, capsys):
    import paper_tables

    afile = tmp_path / "tables"
    afile.write_text("mine")
    assert paper_tables.main(["--workflows", "react", "--out", str(afile)]) == 2
    assert "is a file" in capsys.readouterr().err and afile.read_text() == "mine"


def test_paper_tables_refuses_your_directory_and_a_changed_rerun_with_exit_2(tmp_path, capsys, monkeypatch):
    """Its refusals of a directory of the user's (no settings.json) and of a rerun with other
    settings are its other refusals' kind: one line naming --out, exit 2 (they were exit 1, no prefix)."""
    import paper_tables

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "tables.md").write_text("mine")
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "settings.json").write_text(json.dumps({"config": {"other": 1}}))
    for out, says in ((mine, "holds no settings.json"), (earlier, "holds a run with other settings")):
        before = _files(out)
        monkeypatch.setattr(sys, "argv", ["paper_tables.py", "--workflows", "react", "--out", str(out)])
        assert paper_tables.cli() == 2
        err = capsys.readouterr().err
        assert err.startswith(f"paper_tables: --out {out}") and says in err and len(err.strip().splitlines()) == 1
        assert _files(out) == before


def test_learning_bench_refuses_a_file_and_an_earlier_runs_seed(tmp_path, capsys, monkeypatch):
    import learning

    monkeypatch.setattr(learning, "train_job", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained")))
    afile = tmp_path / "bench"
    afile.write_text("mine")
    assert learning.main(["--seeds", "1", "--out", str(afile)]) == 2
    assert "is a file" in capsys.readouterr().err and afile.read_text() == "mine"
    earlier = tmp_path / "earlier"
    _marked_run(earlier / "seed0")
    before = _files(earlier)
    assert learning.main(["--seeds", "2", "--out", str(earlier)]) == 2
    err = capsys.readouterr().err
    assert f"already holds {earlier / 'seed0'}" in err and "--fresh" in err
    assert _files(earlier) == before


def test_main_job_bench_refuses_an_out_under_a_file(tmp_path, capsys):
    import main_job

    afile = tmp_path / "f"
    afile.write_text("mine")
    with pytest.raises(SystemExit) as e:
        main_job.main(["--baseline", "HEAD", "--out", str(afile / "sub")])
    assert e.value.code == 2 and "lies under a file" in capsys.readouterr().err


def test_a_lock_left_by_a_dead_process_does_not_block(tmp_path):
    from memsearcher_jax.rules.run_dir import lock_output_dir, release_output_dir

    run = tmp_path / "run"
    run.mkdir()
    proc = _hold_lock(run)
    proc.kill()
    proc.wait()
    time.sleep(0.1)
    lock_output_dir(str(run))  # the file is left, the lock went with its process
    assert (run / RUN_LOCK).read_text() == str(os.getpid())
    release_output_dir(str(run))


def test_train_refuses_an_output_dir_inside_another_run(tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    run = _marked_run(tmp_path / "run")
    before = _files(run)
    inner = run / "checkpoints" / "1" / "again"
    code, msg = _run(capsys, "train", "--config", DEFAULT, *_tiny(tmp_path), f"--config.train.output_dir={inner}")
    assert code == 2 and f"lies inside the run directory {run}" in msg, msg
    assert _files(run) == before


def test_export_out_under_a_file_is_refused_before_the_checkpoint_is_read(tmp_path, capsys):
    afile = tmp_path / "f"
    afile.write_text("mine")
    code, msg = _run(capsys, "export-hf", "--checkpoint", str(tmp_path / "no_run"), "--out", str(afile / "hf"))
    assert code == 2 and f"{afile} is a file" in msg, msg
    assert afile.read_text() == "mine"


def test_index_out_inside_a_run_is_refused(tmp_path, capsys):
    from retrieval import cli as retrieval_cli

    assert retrieval_cli.RUN_MARKER == RUN_MARKER
    run = _marked_run(tmp_path / "run")
    before = _files(run)
    code, msg = _run(capsys, "index", "--corpus", _corpus(tmp_path), "--out", str(run / "checkpoints" / "idx"),
                     "--index-type", "bm25")
    assert code == 2 and f"inside the training run directory {run}" in msg, msg
    assert _files(run) == before


def test_context_bench_refuses_a_warm_start_dir_it_did_not_cache(tmp_path, capsys):
    import context

    ws = tmp_path / "out" / "warmstart_react0.5"
    ws.mkdir(parents=True)
    (ws / "tokenizer.json").write_text("mine")
    with pytest.raises(SystemExit) as e:
        context.main(["--out", str(tmp_path / "out")])
    assert e.value.code == 2 and "holds no cached warm start" in capsys.readouterr().err
    assert (ws / "tokenizer.json").read_text() == "mine"
