"""Every bad input is a message, and nothing a user owns is deleted (issue 22).

Each test runs the CLI as a user would (`main(argv)`, in process) and asserts the exit status,
that the message names the bad input, and that no user file was removed."""
from __future__ import annotations

import os

import pytest

from memsearcher_jax.bases import DEFAULT_BASE
from memsearcher_jax.cli import main
from memsearcher_jax.rules.run_dir import RUN_LOCK

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")


def _run(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _user_files(root) -> dict:
    """Every file under root with its contents (what must survive a refused command)."""
    found = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = f.read()
    return found


# ----------------------------------------------------------------------------- train --fresh

def test_fresh_with_a_bad_config_removes_nothing(tmp_path, capsys):
    out = tmp_path / "d"
    (out / "notes").mkdir(parents=True)
    (out / "notes" / "thesis.txt").write_text("x")
    before = _user_files(out)
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={out}",
                     "--config.data.tokenizer_dir=/nope", "--fresh")
    assert code == 2
    assert "data.tokenizer_dir=/nope" in msg
    assert _user_files(out) == before


def test_fresh_refuses_a_directory_holding_files_no_run_wrote(tmp_path, capsys):
    out = tmp_path / "d"
    (out / "checkpoints").mkdir(parents=True)
    (out / "notes").mkdir()
    (out / "notes" / "thesis.txt").write_text("x")
    before = _user_files(out)
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={out}",
                     f"--config.world.cache_dir={tmp_path / 'worlds'}", "--fresh")
    assert code == 2
    assert str(out / "notes") in msg and "nothing was removed" in msg
    assert _user_files(out) == before and (out / "checkpoints").is_dir()


@pytest.mark.parametrize("where", [".", "~", "/"])
def test_fresh_refuses_the_working_home_and_root_directories(where, tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.txt").write_text("x")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home)
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={where}",
                     f"--config.world.cache_dir={tmp_path / 'worlds'}", "--fresh")
    assert code == 2
    assert "train.output_dir=" in msg and "--fresh" in msg
    assert (home / "thesis.txt").read_text() == "x"


def test_fresh_removes_only_what_a_run_wrote(tmp_path):
    from memsearcher_jax.rules.run_dir import (
        RUN_LOCK,
        RUN_MARKER,
        check_output_dir,
        prepare_output_dir,
        release_output_dir,
    )

    out = tmp_path / "run"
    for sub in ("checkpoints/3", "best/2", "logs", "warmstart", "lora_base"):
        (out / sub).mkdir(parents=True)
    for name in ("summary.json", "learning_curve.png", RUN_MARKER, "logs/metrics.jsonl"):
        (out / name).write_text("{}")
    prepare_output_dir(str(out), fresh=True)
    release_output_dir(str(out))
    assert sorted(os.listdir(out)) == [RUN_MARKER, RUN_LOCK]  # the marker and the lock, everything else gone
    (out / "mine.txt").write_text("x")
    with pytest.raises(ValueError, match="mine.txt"):
        check_output_dir(str(out), fresh=True)
    prepare_output_dir(str(out), fresh=False)  # resuming never removes anything
    assert (out / "mine.txt").read_text() == "x"


def test_fresh_needs_the_run_marker_before_removing_anything(tmp_path):
    """Names alone do not make a run's directory: a user's `logs` and `checkpoints` without the
    marker stay; an empty directory and a marked one are fine."""
    from memsearcher_jax.rules.run_dir import (
        RUN_LOCK,
        RUN_MARKER,
        check_output_dir,
        prepare_output_dir,
        release_output_dir,
    )

    out = tmp_path / "mine"
    (out / "logs").mkdir(parents=True)
    (out / "checkpoints").mkdir()
    (out / "logs" / "metrics.jsonl").write_text("x")
    with pytest.raises(ValueError, match=RUN_MARKER) as err:
        prepare_output_dir(str(out), fresh=True)
    assert "nothing was removed" in str(err.value)
    assert (out / "logs" / "metrics.jsonl").read_text() == "x"
    (out / RUN_MARKER).write_text("")      # an older run's directory, marked by its owner (touch)
    prepare_output_dir(str(out), fresh=True)
    release_output_dir(str(out))
    assert sorted(os.listdir(out)) == [RUN_MARKER, RUN_LOCK]
    empty = tmp_path / "empty"
    empty.mkdir()
    check_output_dir(str(empty), fresh=True)


def test_output_dir_that_is_a_file_is_a_message(tmp_path, capsys):
    path = tmp_path / "afile"
    path.write_text("keep me")
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={path}")
    assert code == 2 and f"train.output_dir={path} is a file" in msg
    assert path.read_text() == "keep me"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_output_dir_that_is_not_writable_is_a_message(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={locked / 'run'}")
    finally:
        locked.chmod(0o700)
    assert code == 2 and "not writable" in msg and str(locked) in msg


# ----------------------------------------------------------------------------- export-hf --out

def _tiny_model():
    from flax import nnx

    from memsearcher_jax.models import ModelConfig, Qwen2

    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16)
    return Qwen2(cfg, rngs=nnx.Rngs(0))


def test_export_refuses_the_checkpoint_directory_itself(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints" / "1").mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    before = _user_files(run)
    for out in (run, run / "checkpoints", run / "hf"):
        code, msg = _run(capsys, "export-hf", "--checkpoint", str(run), "--out", str(out), "--overwrite")
        assert code == 2 and "checkpoint directory" in msg and str(out) in msg
    code, msg = _run(capsys, "export-hf", "--checkpoint", str(run / "checkpoints"), "--out", str(run))
    assert code == 2 and "checkpoint directory" in msg
    assert _user_files(run) == before and not (run / "hf").exists()


def test_export_refuses_a_non_empty_out_and_a_file(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "README.md").write_text("my notes")
    code, msg = _run(capsys, "export-hf", "--checkpoint", str(run), "--out", str(out))
    assert code == 2 and str(out) in msg and "--overwrite" in msg
    assert (out / "README.md").read_text() == "my notes"
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, msg = _run(capsys, "export-hf", "--checkpoint", str(run), "--out", str(afile), "--overwrite")
    assert code == 2 and f"--out {afile} is a file" in msg and afile.read_text() == "x"
    assert sorted(os.listdir(tmp_path)) == ["afile", "mine", "run"]  # no .tmp-export left behind


def test_save_pretrained_replaces_only_model_files_and_leaves_no_staging_dir(tmp_path):
    from memsearcher_jax.models import from_pretrained, save_pretrained

    out = tmp_path / "hf"
    out.mkdir()
    (out / "README.md").write_text("my notes")
    (out / "model-00001-of-00002.safetensors").write_text("a stale shard of an older export")
    (out / "config.json").write_text("{}")
    save_pretrained(_tiny_model(), str(out))
    assert sorted(os.listdir(out)) == ["README.md", "config.json", "generation_config.json", "model.safetensors"]
    assert (out / "README.md").read_text() == "my notes"
    assert from_pretrained(str(out)).config.hidden_size == 32
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):  # fails half-way through writing
        save_pretrained(_tiny_model(), str(tmp_path / "hf2"), tokenizer_dir=str(tmp_path / "hf"))
    assert sorted(os.listdir(tmp_path)) == ["hf"]  # neither hf2 nor a staging directory
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        save_pretrained(_tiny_model(), str(afile))
    assert afile.read_text() == "x"


# ----------------------------------------------------------------------------- an unreachable retriever

def test_unreachable_http_retriever_is_named_before_any_model_is_loaded(tmp_path, capsys, monkeypatch):
    from memsearcher_jax.app import jobs

    def refuse(*args, **kwargs):
        raise AssertionError("the retriever is checked before the world and the model are built")

    monkeypatch.setattr(jobs, "build_setup", refuse)
    out = tmp_path / "run"
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={out}",
                     "--config.retrieval.kind=http", "--config.retrieval.url=http://127.0.0.1:1",
                     "--config.sft.steps=0")
    assert code == 2 and "retrieval.url=http://127.0.0.1:1" in msg and "serve-retriever" in msg
    assert not out.exists()
    code, msg = _run(capsys, "eval", "--config", DEFAULT, "--model", DEFAULT_BASE,
                     "--config.retrieval.kind=http", "--config.retrieval.url=http://127.0.0.1:1")
    assert code == 2 and "retrieval.url=http://127.0.0.1:1" in msg


class _Searcher:
    """A retriever that fails every query whose text starts with 'down' (as HTTPRetriever reports it)."""

    def search(self, queries, top_n):
        from retrieval.base import ERROR_HIT_ID, Hit

        return [[Hit(id=ERROR_HIT_ID, contents="search failed: cannot reach the retriever")] if q.startswith("down")
                else [Hit(id=str(i), contents=f"passage {i}") for i in range(top_n)] for q in queries]


def test_failed_searches_are_counted_warned_and_stop_the_step_past_half(capsys):
    from memsearcher_jax.agent.parsing import ToolCall
    from memsearcher_jax.agent.rollout import RolloutStats, SearchFailuresError, _run_searches

    call = lambda q: ToolCall(name="wikipedia_search", arguments={"query": q}, query=q, top_n=2)
    stats = RolloutStats()
    got = _run_searches(_Searcher(), [[call("a"), call("b")], [call("down 1")], [call("c")]], stats)
    assert [len(r) for row in got for r in row] == [2, 2, 1, 2]
    assert (stats.searches, stats.search_errors) == (4, 1)
    assert "1 of 4 searches failed" in capsys.readouterr().err
    _run_searches(_Searcher(), [[call("down 2")]], stats)  # 2 of 5: under half, the step goes on
    assert (stats.searches, stats.search_errors) == (5, 2)
    stats.check_search_errors()
    _run_searches(_Searcher(), [[call("down 3")], [call("down 4")]], stats)  # the rollout itself never raises
    with pytest.raises(SearchFailuresError, match=r"4 of 7 searches of this step failed.*cannot reach"):
        stats.check_search_errors()


# ----------------------------------------------------------------------------- plan, index, serve-retriever

@pytest.mark.parametrize("gib", ["0", "-3", "nan", "lots"])
def test_plan_refuses_a_device_memory_that_is_not_positive(gib, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--config", DEFAULT, "--device-memory-gib", gib])
    assert e.value.code == 2 and "--device-memory-gib" in capsys.readouterr().err


def _subcommand_parser(name):
    import argparse

    from memsearcher_jax.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("command", ["plan", "index", "serve-retriever"])
def test_help_describes_every_option_with_its_default(command):
    parser = _subcommand_parser(command)
    text = parser.format_help()
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        assert action.option_strings[-1] in text, action.option_strings
        assert action.help, f"{command} {action.option_strings[-1]} has no help"
        shown = formatter._get_help_string(action) % {"default": action.default}
        assert action.required or "default" in shown, f"{command} {action.option_strings[-1]}: no default in {shown!r}"


@pytest.mark.parametrize("argv,named", [
    (["index", "--corpus", "c.jsonl", "--out", "o", "--batch-size", "0"], "--batch-size"),
    (["index", "--corpus", "c.jsonl", "--out", "o", "--nlist", "-1"], "--nlist"),
    (["serve-retriever", "--index", "i", "--port", "99999"], "--port"),
    (["serve-retriever", "--index", "i", "--port", "0"], "--port"),
])
def test_retrieval_options_out_of_range_are_refused(argv, named, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and named in capsys.readouterr().err


def _write_corpus(path, lines: list[bytes]):
    with open(path, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")


def _good(i):
    return f'{{"id": "{i}", "contents": "Title {i}\\npassage number {i} about things"}}'.encode()


def test_index_names_duplicate_ids_empty_contents_and_non_utf8_lines(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    cases = {
        "duplicate": (_good(2).replace(b'"2"', b'"1"'), "line 3: id '1' appeared on an earlier line"),
        "empty": (b'{"id": "9", "contents": "  "}', "line 3: 'contents' is empty"),
        "latin1": ('{"id": "9", "contents": "caf\u00e9"}'.encode("latin-1"), "line 3: not UTF-8"),
    }
    for name, (bad, message) in cases.items():
        _write_corpus(corpus, [_good(0), _good(1), bad, _good(3)])
        code, msg = _run(capsys, "index", "--corpus", str(corpus), "--out", str(tmp_path / name),
                         "--index-type", "bm25")
        assert code == 2 and message in msg, (name, msg)
    # the way past each: --dedupe keeps the first of an id, --skip-bad-lines skips the others
    _write_corpus(corpus, [_good(0), _good(1), cases["duplicate"][0], cases["latin1"][0], _good(3)])
    code, msg = _run(capsys, "index", "--corpus", str(corpus), "--out", str(tmp_path / "ok"), "--index-type", "bm25",
                     "--dedupe", "--skip-bad-lines")
    assert code == 0 and "indexed 3 passages" in msg and "dropped 1 duplicate" in msg and "skipped 1 bad" in msg


def test_index_ivf_pq_m_that_does_not_divide_the_dimension_is_named_before_encoding(tmp_path, capsys, monkeypatch):
    import retrieval.dense
    from tests.assets import minilm_encoder_dir

    def encode_nothing(*args, **kwargs):
        raise AssertionError("the corpus was encoded before --pq-m was checked")

    monkeypatch.setattr(retrieval.dense, "build_dense_index", encode_nothing)
    corpus = tmp_path / "c.jsonl"
    _write_corpus(corpus, [_good(i) for i in range(4)])
    code, msg = _run(capsys, "index", "--corpus", str(corpus), "--out", str(tmp_path / "pq"), "--index-type", "ivf_pq",
                     "--encoder", minilm_encoder_dir(), "--pq-m", "7")
    assert code == 2 and "--pq-m 7" in msg and "384" in msg, msg
    assert not (tmp_path / "pq").exists()


def test_serve_retriever_reports_a_busy_port_before_serving(tmp_path, capsys):
    import socket

    corpus = tmp_path / "c.jsonl"
    _write_corpus(corpus, [_good(i) for i in range(5)])
    assert main(["index", "--corpus", str(corpus), "--out", str(tmp_path / "idx"), "--index-type", "bm25"]) == 0
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, msg = _run(capsys, "serve-retriever", "--index", str(tmp_path / "idx"), "--port", str(port))
    assert code == 2 and f"127.0.0.1:{port}" in msg and "serving" not in msg


# ----------------------------------------------------------------------------- values that train on nothing or crash

@pytest.mark.parametrize("override,named", [
    ("rl.group_size=1", "rl.group_size=1"),
    ("agent.stop_token_ids=abc", "agent.stop_token_ids"),
    ("world.num_entities=0", "world.num_entities=0"),
    ("sft.early_two_hop=halfway", "sft.early_two_hop must be one of first_hop, no_search"),
    ("sft.early_several=halfway", "sft.early_several must be one of first_hop, skip"),
    ("sft.max_batch_tokens=-1", "sft.max_batch_tokens=-1"),
])
def test_train_values_that_cannot_work_are_named(override, named, tmp_path, capsys):
    out = tmp_path / "run"
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={out}", f"--config.{override}")
    assert code == 2 and named in msg
    assert not out.exists()


def test_heads_not_a_multiple_of_kv_heads_is_named(tmp_path, capsys):
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={tmp_path / 'run'}",
                     "--config.model.source=init", "--config.model.num_heads=4", "--config.model.num_kv_heads=3")
    assert code == 2 and "model.num_heads=4" in msg and "num_kv_heads=3" in msg


def test_a_flag_taken_as_an_override_value_is_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["train", "--config", DEFAULT, "--config.train.output_dir", "--print-config"])
    assert e.value.code == 2 and "--config.train.output_dir got '--print-config'" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_eval_refuses_a_bad_split_limit_or_checkpoint_in_a_second(tmp_path, capsys, monkeypatch):
    import time

    from memsearcher_jax.app import jobs

    def refuse(*args, **kwargs):
        raise AssertionError("refused before the world and the model are built")

    monkeypatch.setattr(jobs, "build_setup", refuse)
    model = DEFAULT_BASE
    for extra, named in ((["--model", model, "--split", "bogus"], "--split 'bogus'"),
                         (["--model", model, "--limit", "-5"], "--limit -5"),
                         (["--checkpoint", str(tmp_path / "nope")], str(tmp_path / "nope"))):
        t0 = time.perf_counter()
        code, msg = _run(capsys, "eval", "--config", DEFAULT, *extra)
        assert code == 2 and named in msg, msg
        assert time.perf_counter() - t0 < 5.0


# ------------------------------------------------------------------------ a real (tiny) run: resume, Ctrl-C, damage

@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory):
    """A 1-step training run of the tiny random model (no warm start, no held-out eval)."""
    from tests.test_train_step import SMALL

    d = tmp_path_factory.mktemp("run")
    overrides = [f"--config.{k}={v}" for k, v in SMALL + [("world.cache_dir", str(d / "worlds")),
                                                         ("train.output_dir", str(d / "run")),
                                                         ("train.save_every", "1")]]
    assert main(["train", "--config", DEFAULT, *overrides, "--config.train.steps=1"]) == 0
    return d / "run", overrides


@pytest.mark.slow
def test_resume_with_another_model_size_names_the_step(one_step_run, capsys):
    out, overrides = one_step_run
    capsys.readouterr()
    before = _user_files(out)
    code, msg = _run(capsys, "train", "--config", DEFAULT, *overrides, "--config.train.steps=2",
                     "--config.model.hidden_size=32")
    assert code == 2 and "checkpoint step 1" in msg and "hidden_size 64 -> 32" in msg and "--fresh" in msg
    assert "Traceback" not in msg
    assert {k: v for k, v in _user_files(out).items() if "checkpoints" in k} == \
        {k: v for k, v in before.items() if "checkpoints" in k}


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_the_next_start_resumes(one_step_run, capsys, monkeypatch):
    from memsearcher_jax.rl.trainer import Trainer

    out, overrides = one_step_run

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "train_step", interrupted)
    code, msg = _run(capsys, "train", "--config", DEFAULT, *overrides, "--config.train.steps=2")
    assert code == 130
    assert "resuming from step 1" in msg
    assert "interrupted at step 2; checkpoint 1 kept; resume with the same command" in msg
    assert "Traceback" not in msg and os.path.isdir(out / "checkpoints" / "1")


@pytest.mark.slow
def test_export_from_a_damaged_checkpoint_names_the_step(one_step_run, tmp_path, capsys):
    import shutil

    out, _ = one_step_run
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    params = damaged / "checkpoints" / "1" / "params"
    for dirpath, _, files in os.walk(params):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.getsize(path) > 64:
                with open(path, "r+b") as f:
                    f.truncate(os.path.getsize(path) // 2)
    code, msg = _run(capsys, "export-hf", "--checkpoint", str(damaged), "--out", str(tmp_path / "hf"))
    assert code == 2 and "checkpoint step 1" in msg and str(damaged) in msg, msg
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_resume_from_a_truncated_checkpoint_names_the_step(one_step_run, tmp_path, capsys):
    import shutil

    out, overrides = one_step_run
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    for dirpath, _, files in os.walk(damaged / "checkpoints" / "1" / "params"):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.getsize(path) > 64:
                with open(path, "r+b") as f:
                    f.truncate(os.path.getsize(path) // 2)
    before = _user_files(damaged)
    overrides = [o for o in overrides if not o.startswith("--config.train.output_dir=")]
    code, msg = _run(capsys, "train", "--config", DEFAULT, *overrides, f"--config.train.output_dir={damaged}",
                     "--config.train.steps=2")
    assert code == 2 and "step 1" in msg and str(damaged) in msg and "--fresh" in msg, msg
    assert "Traceback" not in msg
    assert {k: v for k, v in _user_files(damaged).items() if "checkpoints" in k} == \
        {k: v for k, v in before.items() if "checkpoints" in k}


def _damage(step_dir, how: str) -> None:
    """Damages the params of a checkpoint step as a full disk or a half copy would: the largest
    data file cut to half its size (the other reads are still pending when its read fails) or
    gone, or the OCDBT manifests gone."""
    data = sorted((p for p in (step_dir / "params").rglob("*") if p.is_file() and p.parent.name == "d"
                   and p.parent.parent.name.startswith("ocdbt.process_")), key=lambda p: p.stat().st_size)
    assert data and data[-1].stat().st_size > 4096, "the checkpoint layout changed: no OCDBT data files"
    if how == "missing":
        data[-1].unlink()
    for path in (step_dir / "params").rglob("manifest.ocdbt") if how == "no_manifest" else ():
        path.unlink()
    if how == "truncated":
        with open(data[-1], "r+b") as f:
            f.truncate(data[-1].stat().st_size // 2)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncated", "missing", "no_manifest"])
def test_resume_from_a_damaged_checkpoint_is_one_line_in_its_own_process(one_step_run, tmp_path, how):
    """A resume from a checkpoint whose data a full disk cut short printed its message, then the
    tracebacks of Orbax's pending reads at the interpreter's exit ('Exception ignored in:
    <coroutine ...>', 130 lines; asyncio's "Event loop is closed", 43 lines, manifests gone).
    Its own process, as a user runs it: the checkpoint is now checked before any restore and
    before any work, and the message is all the user sees."""
    import shutil
    import subprocess
    import sys

    out, overrides = one_step_run
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    _damage(damaged / "checkpoints" / "1", how)
    before = _user_files(damaged)
    overrides = [o for o in overrides if not o.startswith("--config.train.output_dir=")]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "memsearcher_jax.cli", "train", "--config", DEFAULT, *overrides,
                           f"--config.train.output_dir={damaged}", "--config.train.steps=2"],
                          env=env, capture_output=True, text=True, timeout=900)
    errors = [line for line in done.stderr.splitlines() if not line.startswith("[memsearcher-jax ")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-3000:]
    assert errors[0].startswith(f"memsearcher-jax: checkpoint step 1 in {damaged}/checkpoints cannot be restored")
    assert "params/" in errors[0] and "--fresh" in errors[0], errors[0]
    assert "GRPO" not in done.stderr  # refused before the loop (and its compile) started
    mine = lambda files: {k: v for k, v in files.items() if k != RUN_LOCK}  # the lock holds the last pid
    assert mine(_user_files(damaged)) == mine(before)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncated", "missing_item"])
def test_export_and_eval_from_a_damaged_checkpoint_are_one_line_in_their_own_process(one_step_run, tmp_path, how):
    """`export-hf` and `eval --checkpoint` restore a run's checkpoint (jobs.restore_policy): a data
    file cut short printed the message, then Orbax's pending reads' asyncio tracebacks at exit;
    `eval` found out only after building the world. Both now check the step as a resumed `train`
    does, before any restore (eval: before any world is built): one line naming the step."""
    import shutil
    import subprocess
    import sys

    from tests.test_validation import NOISE

    out, overrides = one_step_run
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    if how == "truncated":
        _damage(damaged / "checkpoints" / "1", "truncated")
    else:
        shutil.rmtree(damaged / "checkpoints" / "1" / "params")
    before = _user_files(damaged)
    worlds = tmp_path / "worlds"  # a world eval would build: it must not
    overrides = [o for o in overrides if not o.startswith(("--config.train.output_dir=", "--config.world.cache_dir="))]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for argv in (["export-hf", "--checkpoint", str(damaged), "--out", str(tmp_path / "hf")],
                 ["eval", "--config", DEFAULT, *overrides, f"--config.world.cache_dir={worlds}", "--checkpoint",
                  str(damaged), "--limit", "2"]):
        done = subprocess.run([sys.executable, "-m", "memsearcher_jax.cli", *argv], env=env, capture_output=True,
                              text=True, timeout=900)
        errors = [line for line in done.stderr.splitlines() if line.startswith("memsearcher-jax")]
        assert done.returncode == 2 and len(errors) == 1, (argv[0], done.stderr[-3000:])
        assert errors[0].startswith(f"memsearcher-jax: checkpoint step 1 in {damaged}/checkpoints cannot be "
                                    "restored (params/"), errors[0]
        assert ("cut short" if how == "truncated" else "params/ is missing") in errors[0], errors[0]
        assert not any(n in done.stderr for n in NOISE), done.stderr[-3000:]
    assert not (tmp_path / "hf").exists() and not worlds.exists()
    assert _user_files(damaged) == before


# ----------------------------------------------------------------------------- fault injection

def _start_server(index_dir: str, port: int):
    """`serve-retriever` in its own process on 127.0.0.1:port, once /health answers."""
    import subprocess
    import sys
    import time

    import httpx

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "retrieval.cli", "serve-retriever", "--index", index_dir,
                             "--port", str(port), "--log-level", "warning"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).raise_for_status()
            return proc
        except httpx.TransportError:
            assert proc.poll() is None, "the retriever server died while starting"
            time.sleep(0.1)
    raise AssertionError("the retriever server did not start in 60 s")


@pytest.mark.slow
def test_retriever_killed_and_restarted_mid_run_is_counted_and_the_run_goes_on(tmp_path):
    """The HTTP retriever (a real server process) is killed in the middle of a search call of a
    short GRPO run with the shipped base (which searches) and started again: the run finishes,
    search_errors counts the failed query, nothing crashes."""
    import json
    import signal
    import socket

    from memsearcher_jax.app.experiment import build_setup, build_trainer
    from memsearcher_jax.settings import load_settings
    from retrieval.client import HTTPRetriever

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    overrides = [("world.cache_dir", str(tmp_path / "worlds")), ("train.output_dir", str(tmp_path / "run")),
                 ("sft.steps", "0"), ("train.eval_questions", "0"), ("train.steps", "2"), ("train.save_every", "1"),
                 ("rl.batch_questions", "2"), ("rl.group_size", "2"), ("agent.max_turns", "3")]
    corpus = build_setup(load_settings(DEFAULT, overrides)).world.corpus  # the world's passages, for the server
    assert main(["index", "--corpus", corpus, "--out", str(tmp_path / "idx"), "--index-type", "bm25"]) == 0
    server = {"proc": _start_server(str(tmp_path / "idx"), port)}
    injected = []

    class Outage(HTTPRetriever):
        """One query per request, no retries; in the first call with >= 3 queries the server is
        killed before the second query is sent and started again once that query has failed."""

        def search(self, queries, top_n):
            self._kill_at = self.attempts + 1 if len(queries) >= 3 and not injected else None
            return super().search(queries, top_n)

        def _once(self, queries, top_n):
            if self.attempts != self._kill_at:
                return super()._once(queries, top_n)
            server["proc"].send_signal(signal.SIGKILL)
            server["proc"].wait(30)
            try:
                return super()._once(queries, top_n)
            finally:
                injected.append(queries[0])
                server["proc"] = _start_server(str(tmp_path / "idx"), port)

    cfg = load_settings(DEFAULT, overrides + [("retrieval.kind", "http"), ("retrieval.url", url)])
    setup = build_setup(cfg)
    setup.retriever = Outage(url, max_retries=0, max_batch=1)
    try:
        build_trainer(cfg, setup, progress=False).train()
    finally:
        server["proc"].send_signal(signal.SIGKILL)
        server["proc"].wait(30)
    assert len(injected) == 1, "the model never made a search call of >= 3 queries"
    with open(tmp_path / "run" / "logs" / "metrics.jsonl", encoding="utf-8") as f:
        metrics = [json.loads(line) for line in f]
    assert [m["step"] for m in metrics] == [1, 2]
    assert sum(m["search_errors"] for m in metrics) == 1


@pytest.mark.slow
def test_sigkill_while_an_async_checkpoint_is_written_resumes_from_the_last_complete_step(tmp_path):
    """SIGKILL the moment an asynchronous save has begun (its temporary directory exists and is
    not yet renamed to its step): the next start resumes from the last finalized step and
    finishes the run."""
    import signal
    import subprocess
    import time

    from tests.test_train_step import _logged_steps, _train_cmd

    steps, out, worlds = 6, str(tmp_path / "run"), str(tmp_path / "worlds")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", PYTHONPATH=ROOT)
    cmd = _train_cmd(ROOT, out, steps, worlds) + ["--config.train.save_every=1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpts, caught, deadline = os.path.join(out, "checkpoints"), None, time.time() + 900
    while proc.poll() is None and time.time() < deadline:
        names = os.listdir(ckpts) if os.path.isdir(ckpts) else []
        partial = [n for n in names if not n.isdigit()]
        if partial and any(n.isdigit() for n in names):  # a later save under way, an earlier one complete
            proc.send_signal(signal.SIGKILL)
            caught = (partial, sorted(int(n) for n in names if n.isdigit()))
            break
        time.sleep(0.002)
    proc.wait(60)
    assert caught, "no save was caught in progress"
    complete = sorted(int(n) for n in os.listdir(ckpts) if n.isdigit())
    assert complete and complete[-1] < steps
    resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from step {complete[-1]}" in resumed.stdout, (caught, complete, resumed.stdout[-1500:])
    assert _logged_steps(os.path.join(out, "logs", "metrics.jsonl")) == steps


def test_index_builder_records_the_nlist_it_built(capsys):
    import numpy as np

    from retrieval.index import IndexBuilder, IndexConfig

    builder = IndexBuilder(8, IndexConfig(type="ivf_flat", nlist=64, nprobe=4))
    builder.add(np.random.default_rng(0).standard_normal((200, 8)).astype(np.float32))
    index = builder.finish()
    assert index.ntotal == 200 and builder.config.nlist == 200 // 39  # what the manifest now records
    assert "nlist 64 lowered to 5" in capsys.readouterr().err


def test_fresh_with_a_remote_output_dir_is_refused_not_cleared():
    from memsearcher_jax.rules.run_dir import check_output_dir

    with pytest.raises(ValueError, match="remote train.output_dir=gs://bucket/run"):
        check_output_dir("gs://bucket/run", fresh=True)
    check_output_dir("gs://bucket/run", fresh=False)  # resuming there is fine


@pytest.mark.slow
def test_eval_of_a_model_without_its_reading_vocab_is_refused(tmp_path, capsys):
    """Without reading_vocab.json the synthetic world builds another vocabulary; evaluating the
    model with it silently scored EM 0. It is refused, naming the missing file."""
    import shutil

    base = DEFAULT_BASE
    model = tmp_path / "model"
    shutil.copytree(base, model, ignore=shutil.ignore_patterns("reading_vocab.json"))
    code, msg = _run(capsys, "eval", "--config", DEFAULT, "--model", str(model), "--limit", "2",
                     f"--config.world.cache_dir={tmp_path / 'worlds'}")
    assert code == 2 and f"{model} has no reading_vocab.json" in msg, msg
