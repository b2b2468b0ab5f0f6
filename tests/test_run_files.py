"""A run's own files, end to end (issue 82): what `train`, `pretrain` and `bench/learning.py` write
is exactly what their `--fresh` removes; a run stopped after it made its directory can be rerun
there (changed, or with --fresh); a rewrite or an append never writes through a symlink a user
put in place of a run's file (the link is replaced, its target left as it was). Each command runs
as a user runs it (`main(argv)`) on the tiny default."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from memsearcher_jax.app import jobs
from memsearcher_jax.cli import main
from memsearcher_jax.rules.run_dir import RUN_MARKER, foreign_entries
from tests.test_train_step import ROOT, SMALL

DEFAULT = os.path.join(ROOT, "configs", "default.py")
sys.path.insert(0, os.path.join(ROOT, "bench"))


def _train(out, worlds, *extra) -> list[str]:
    args = ["train", "--config", DEFAULT]
    args += [f"--config.{k}={v}" for k, v in SMALL + [("world.cache_dir", str(worlds)), ("train.output_dir", str(out))]]
    return args + list(extra)


# Every entry a train writes: the warm start, best/ (eval every step), samples.jsonl, the plot, the summary.
FULL = ("--config.sft.steps=1", "--config.train.save_every=1", "--config.train.eval_every=1",
        "--config.train.eval_questions=2", "--config.train.log_samples_every=1")


def _mine(tmp_path, name, text):
    """A file of the user's, outside any run (what a link in a run's directory may point at)."""
    path = tmp_path / "mine" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A one-step train that writes every kind of entry (FULL); tests work on copies of it, and
    share its world cache (one world build for the file)."""
    d = tmp_path_factory.mktemp("run_files")
    assert main(_train(d / "run", d / "worlds", "--config.train.steps=1", *FULL)) == 0
    return d


def _copy(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained / "run", run, symlinks=True)
    return run


@pytest.mark.slow
def test_train_then_fresh_in_the_same_directory(trained, tmp_path, capsys):
    """`train`, then the same command with --fresh: every entry train wrote is its own (run_config.json
    and best/'s metrics included), and --fresh starts over there, touching nothing outside it."""
    run = _copy(trained, tmp_path)
    assert foreign_entries(str(run)) == []
    assert (run / "best" / "1").is_dir() and (run / "logs" / "samples.jsonl").is_file()
    mine = _mine(tmp_path, "notes.md", "mine")
    capsys.readouterr()
    code = main(_train(run, trained / "worlds", "--config.train.steps=1", *FULL, "--fresh"))
    assert code == 0, capsys.readouterr().err
    assert "warm start: reusing" not in capsys.readouterr().out  # started over: the warm start ran again
    assert sorted(os.listdir(run / "checkpoints")) == ["1"] and mine.read_text() == "mine"
    assert [json.loads(x)["step"] for x in open(run / "logs" / "metrics.jsonl")] == [1]


@pytest.mark.slow
def test_eval_out_replaces_links_instead_of_writing_through_them(trained, tmp_path, capsys):
    """`eval --out` into its own earlier directory whose two files are links to the user's files:
    the links are replaced by the new results, the files they pointed at are left as they were."""
    args = ["eval", "--config", DEFAULT, "--checkpoint", str(trained / "run"), "--limit", "2",
            *(f"--config.{k}={v}" for k, v in SMALL + [("world.cache_dir", str(trained / "worlds"))])]
    out = tmp_path / "eval"
    assert main(args + ["--out", str(out)]) == 0
    written = json.loads((out / "results.json").read_text())
    targets = {name: _mine(tmp_path, name, f"my {name}") for name in ("results.json", "trajectories.jsonl")}
    for name, target in targets.items():
        (out / name).unlink()
        (out / name).symlink_to(target)
    assert main(args + ["--out", str(out)]) == 0, capsys.readouterr().err
    assert {name: t.read_text() for name, t in targets.items()} == {n: f"my {n}" for n in targets}
    assert not (out / "results.json").is_symlink() and not (out / "trajectories.jsonl").is_symlink()
    assert json.loads((out / "results.json").read_text())["benchmarks"] == written["benchmarks"]
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow
def test_a_resumed_train_replaces_links_instead_of_writing_through_them(trained, tmp_path, capsys):
    """A resumed `train` whose summary.json, learning_curve.png and logs/metrics.jsonl are links
    to the user's files: each link is replaced by the run's file (metrics.jsonl keeps its lines and
    gains the new step), the files they pointed at are left as they were."""
    run = _copy(trained, tmp_path)
    names = ("summary.json", "learning_curve.png", os.path.join("logs", "metrics.jsonl"))
    targets = {}
    for name in names:
        targets[name] = _mine(tmp_path, os.path.basename(name), (run / name).read_bytes().decode("latin-1"))
        (run / name).unlink()
        (run / name).symlink_to(targets[name])
    before = {name: t.read_bytes() for name, t in targets.items()}
    assert main(_train(run, trained / "worlds", "--config.train.steps=2", *FULL)) == 0, capsys.readouterr().err
    assert {name: t.read_bytes() for name, t in targets.items()} == before
    assert not any((run / name).is_symlink() for name in names)
    assert [json.loads(x)["step"] for x in open(run / "logs" / "metrics.jsonl")] == [1, 2]
    assert "em_after" in json.loads((run / "summary.json").read_text())


@pytest.mark.slow
def test_a_run_stopped_after_recording_its_config_can_be_rerun_changed(trained, tmp_path, monkeypatch, capsys):
    """A train stopped after its directory and config were written, before any checkpoint (here:
    Ctrl-C as GRPO's trainer is built, after the warm start): the corrected command, with another
    setting, runs there; the earlier attempt's warm start is not reused for it."""
    run, worlds = tmp_path / "run", trained / "worlds"

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(jobs, "assemble_trainer", interrupted)
    assert main(_train(run, worlds, "--config.train.steps=1", "--config.sft.steps=1")) == 130
    assert (run / "logs" / "run_config.json").is_file() and (run / "warmstart" / "config.json").is_file()
    assert not (run / "checkpoints").exists()
    capsys.readouterr()  # the same command again: it resumes there, its finished warm start reused
    assert main(_train(run, worlds, "--config.train.steps=1", "--config.sft.steps=1")) == 130
    assert "warm start: reusing" in capsys.readouterr().out
    monkeypatch.undo()
    code = main(_train(run, worlds, "--config.train.steps=1", "--config.sft.steps=2"))
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "warm start: reusing" not in printed.out and "starting over there" in printed.out
    assert json.loads((run / "logs" / "run_config.json").read_text())["sft"]["steps"] == 2
    assert sorted(os.listdir(run / "checkpoints")) == ["1"]


@pytest.mark.slow
def test_a_run_stopped_in_its_warm_start_can_start_over_with_fresh(trained, tmp_path, monkeypatch, capsys):
    """Ctrl-C during the warm start, then the same command with --fresh: it runs, and the directory
    holds what a run writes only."""
    run, worlds = tmp_path / "run", trained / "worlds"
    from memsearcher_jax.app import warm_start

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(warm_start, "sft_train", interrupted)
    assert main(_train(run, worlds, "--config.train.steps=1", "--config.sft.steps=1")) == 130
    assert (run / "logs" / "run_config.json").is_file()
    monkeypatch.undo()
    capsys.readouterr()
    code = main(_train(run, worlds, "--config.train.steps=1", "--config.sft.steps=1", "--fresh"))
    assert code == 0, capsys.readouterr().err
    assert foreign_entries(str(run)) == [] and (run / "warmstart" / "config.json").is_file()
    assert sorted(os.listdir(run / "checkpoints")) == ["1"]


@pytest.mark.slow
def test_learning_bench_then_fresh(trained, tmp_path, capsys):
    """bench/learning.py --fresh where an earlier run left its seed's directory (here the trained
    run, as train_job wrote it): the seed starts over there; without --fresh it is refused."""
    import learning

    out = tmp_path / "bench"
    shutil.copytree(trained / "run", out / "seed0", symlinks=True)
    args = ["--seeds", "1", "--out", str(out), "--no-control", "--no-rft",
            *(f"--config.{k}={v}" for k, v in SMALL + [("world.cache_dir", str(trained / "worlds")),
                                                       ("train.steps", "1"), ("train.eval_questions", "2")])]
    assert learning.main(args) == 2 and "--fresh" in capsys.readouterr().err
    assert learning.main(args + ["--fresh"]) == 0, capsys.readouterr().err
    seed = out / "seed0"
    assert foreign_entries(str(seed)) == [] and not (seed / "warmstart").exists() and not (seed / "best").exists()
    assert [json.loads(x)["step"] for x in open(seed / "logs" / "metrics.jsonl")] == [1]


def test_export_hf_of_a_pretraining_run_names_its_export(tmp_path, capsys):
    """`export-hf --checkpoint` of a `pretrain` run (its checkpoints hold no model config): the
    message names the run's export, base/, instead of a damaged checkpoint; nothing is written.
    (`pretrain`, then `pretrain --fresh`, end to end:
    tests/test_pretrain.py::test_pretrain_runs_resumes_and_exports.)"""
    run = tmp_path / "run"
    (run / "checkpoints" / "2" / "params").mkdir(parents=True)
    (run / RUN_MARKER).write_text(json.dumps({"written_by": "memsearcher-jax pretrain"}))
    assert main(["export-hf", "--checkpoint", str(run), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "pretraining run" in err and str(run / "base") in err and "damaged" not in err, err
    (run / "base").mkdir()
    (run / "base" / "config.json").write_text("{}")
    assert main(["export-hf", "--checkpoint", str(run / "checkpoints"), "--out", str(tmp_path / "hf")]) == 2
    assert "give that as --model" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_episode_report_writes_its_own_directory_and_replaces_links(trained, tmp_path, capsys):
    """bench/episode_report.py on a paper_tables-style --run (its settings.json and a workflow's
    run directory, here the trained run): the reports and summary.md go to RUN/episode_report with
    its marker; a rerun there replaces a report and summary.md that are links to the user's files
    (summary.md keeps its lines and gains one), never writing through them; the run's own
    directory gains nothing (its --fresh still accepts it)."""
    from memsearcher_jax.settings.config_utils import load_config
    from tests.bench_loader import load_bench

    rep = load_bench("episode_report")
    paper = tmp_path / "paper"
    cfg = load_config(DEFAULT, SMALL + [("world.cache_dir", str(trained / "worlds"))])
    paper.mkdir()
    (paper / "settings.json").write_text(json.dumps({"workflow_configs": {"memsearcher": cfg.to_dict()}}))
    shutil.copytree(trained / "run", paper / "memsearcher", symlinks=True)
    args = ["--run", str(paper), "--workflows", "memsearcher", "--questions", "2", "--objectives", "1"]
    assert rep.cli(args) == 0, capsys.readouterr().err
    out = paper / "episode_report"
    assert sorted(os.listdir(out)) == sorted([rep.MARKER, "memsearcher-warm_start-N1.jsonl",
                                              "memsearcher-grpo-N1.jsonl", "summary.md"])
    assert len((out / "memsearcher-grpo-N1.jsonl").read_text().splitlines()) == 2
    summary = (out / "summary.md").read_text()
    assert len(summary.splitlines()) == 2
    names = ("summary.md", "memsearcher-warm_start-N1.jsonl")
    targets = {name: _mine(tmp_path, name, f"my {name}\n") for name in names}
    for name, target in targets.items():
        (out / name).unlink()
        (out / name).symlink_to(target)
    assert rep.cli(args + ["--models", "warm_start"]) == 0, capsys.readouterr().err
    assert {name: t.read_text() for name, t in targets.items()} == {n: f"my {n}\n" for n in targets}
    assert not any((out / name).is_symlink() for name in targets)
    assert (out / "summary.md").read_text().startswith("my summary.md\n")  # what the link showed, then a line
    assert len((out / "summary.md").read_text().splitlines()) == 2
    assert len((out / "memsearcher-warm_start-N1.jsonl").read_text().splitlines()) == 2
    assert foreign_entries(str(paper / "memsearcher")) == []


def test_a_pretrain_stopped_in_its_vocabulary_build_starts_over_with_fresh(tmp_path, capsys, monkeypatch):
    """`pretrain` stopped (Ctrl-C) while it wrote its vocabulary: the directory holds the marker and
    a part of vocab/; `pretrain --fresh` there is accepted, removes the part, and builds again
    (the build is stopped here once it is reached: the checks and the removal came before it)."""
    from memsearcher_jax.pretrain import run as pretrain
    from memsearcher_jax.rules.run_dir import PRETRAIN_ENTRIES

    def stopped(out_dir, **k):
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
            f.write('{"half')
        raise KeyboardInterrupt
    monkeypatch.setattr(pretrain, "build_vocab", stopped)
    run = tmp_path / "run"
    args = ["pretrain", "--config", os.path.join(ROOT, "configs", "base_v8.py"), f"--config.train.output_dir={run}"]
    assert main(args) == 130
    assert foreign_entries(str(run), PRETRAIN_ENTRIES) == [] and (run / "vocab" / "tokenizer.json").is_file()

    def reached(out_dir, **k):
        assert not os.path.exists(out_dir), "the earlier attempt's vocabulary was not removed"
        raise RuntimeError("vocabulary build reached")
    monkeypatch.setattr(pretrain, "build_vocab", reached)
    with pytest.raises(RuntimeError, match="vocabulary build reached"):
        main(args + ["--fresh"])
    assert os.path.isfile(run / RUN_MARKER)
