"""Every bad input is a message, and nothing a user owns is deleted (issue 22).

Each test runs the CLI as a user would (`main(argv)`, in process) and asserts the exit status,
that the message names the bad input, and that no user file was removed."""
from __future__ import annotations

import os

import pytest

from memsearcher_jax.cli import main

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
    from memsearcher_jax.jobs import RUN_MARKER, check_output_dir, prepare_output_dir

    out = tmp_path / "run"
    for sub in ("checkpoints/3", "best/2", "logs", "warmstart", "lora_base"):
        (out / sub).mkdir(parents=True)
    for name in ("summary.json", "learning_curve.png", RUN_MARKER, "logs/metrics.jsonl"):
        (out / name).write_text("{}")
    prepare_output_dir(str(out), fresh=True)
    assert sorted(os.listdir(out)) == [RUN_MARKER]  # a new marker, everything else gone
    (out / "mine.txt").write_text("x")
    with pytest.raises(ValueError, match="mine.txt"):
        check_output_dir(str(out), fresh=True)
    prepare_output_dir(str(out), fresh=False)  # resuming never removes anything
    assert (out / "mine.txt").read_text() == "x"


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
    from memsearcher_jax import jobs

    def refuse(*args, **kwargs):
        raise AssertionError("the retriever is checked before the world and the model are built")

    monkeypatch.setattr(jobs, "build_setup", refuse)
    out = tmp_path / "run"
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={out}",
                     "--config.retrieval.kind=http", "--config.retrieval.url=http://127.0.0.1:1",
                     "--config.sft.steps=0")
    assert code == 2 and "retrieval.url=http://127.0.0.1:1" in msg and "serve-retriever" in msg
    assert not out.exists()
    code, msg = _run(capsys, "eval", "--config", DEFAULT, "--model", os.path.join(ROOT, "memsearcher_jax", "bases",
                                                                               "reading_tiny"),
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
    _run_searches(_Searcher(), [[call("down 2")]], stats)  # 2 of 5: still under half
    assert (stats.searches, stats.search_errors) == (5, 2)
    with pytest.raises(SearchFailuresError, match=r"4 of 7 searches of this step failed.*cannot reach"):
        _run_searches(_Searcher(), [[call("down 3")], [call("down 4")]], stats)
