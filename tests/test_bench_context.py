"""bench/context.py: the tokens a trajectory makes the model process, its prompts by turn, and the
refusals that come before any load (the run itself needs a warm start: docs/benchmarks.md)."""
from __future__ import annotations

import types

import pytest

from tests.bench_loader import load_bench


def _bench():
    return load_bench("context")


def _conv(prompt_len, mask):
    return types.SimpleNamespace(prompt_ids=list(range(prompt_len)), loss_mask=list(mask))


def test_tokens_processed_counts_each_call_with_everything_before_it():
    bench = _bench()
    # One conversation: a 10-token prompt, a 2-token call, 3 observation tokens, a 3-token call.
    # The first call processes 10 + 2 tokens, the second 10 + 2 + 3 + 3.
    one = types.SimpleNamespace(conversations=[_conv(10, [1, 1, 0, 0, 0, 1, 1, 1])])
    assert bench.tokens_processed(one) == 12 + 18
    # A second conversation (the next turn's context) adds its own calls; a call at the very end
    # of the response and one masked token alone each count as a call.
    two = types.SimpleNamespace(conversations=[_conv(10, [1, 1, 0, 0, 0, 1, 1, 1]), _conv(4, [0, 1, 0, 1])])
    assert bench.tokens_processed(two) == 30 + (4 + 2) + (4 + 4)
    # Nothing generated: nothing processed.
    assert bench.tokens_processed(types.SimpleNamespace(conversations=[_conv(7, [0, 0])])) == 0


def test_per_turn_groups_prompt_tokens_by_turn_across_trajectories():
    bench = _bench()
    trajs = [types.SimpleNamespace(context_tokens=[100, 120, 150]), types.SimpleNamespace(context_tokens=[90])]
    assert bench.per_turn(trajs) == {1: [100, 90], 2: [120], 3: [150]}
    assert bench.per_turn([]) == {}


def test_react_share_outside_0_1_is_refused_before_any_load(capsys):
    bench = _bench()
    with pytest.raises(SystemExit) as err:
        bench.main(["--react-share", "1.5"])
    assert err.value.code == 2
    assert "--react-share must be in [0, 1], got 1.5" in capsys.readouterr().err


def test_an_out_dir_without_a_cached_warm_start_is_refused(tmp_path, capsys):
    bench = _bench()
    (tmp_path / "warmstart_react0.5").mkdir()
    (tmp_path / "warmstart_react0.5" / "mine.txt").write_text("a user's file")
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path)])
    assert "holds no cached warm start" in capsys.readouterr().err
    assert (tmp_path / "warmstart_react0.5" / "mine.txt").read_text() == "a user's file"
