"""bench/main_job.py refuses bad input at once, before any worktree or job exists."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import main_job  # noqa: E402


def _worktrees() -> str:
    return subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, ".git")), reason="needs the git checkout")
def test_an_unknown_baseline_is_named(tmp_path, capsys):
    before = _worktrees()
    with pytest.raises(SystemExit) as e:
        main_job.main(["--baseline", "no-such-ref-4242", "--out", str(tmp_path / "new")])
    assert e.value.code == 2
    assert "no-such-ref-4242" in capsys.readouterr().err
    assert not (tmp_path / "new").exists() and _worktrees() == before


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, ".git")), reason="needs the git checkout")
def test_an_existing_output_directory_is_refused_and_left_alone(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("a user's file")
    before = _worktrees()
    with pytest.raises(SystemExit) as e:
        main_job.main(["--baseline", "HEAD", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert str(tmp_path) in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["mine.txt"] and (tmp_path / "mine.txt").read_text() == "a user's file"
    assert _worktrees() == before
