"""Per-workflow context metrics on hand-made numbers: prompt tokens by turn, peak tokens,
tokens per question; and their PNG."""
from __future__ import annotations

import math

import pytest

from memsearcher_jax.agent.trajectory import ACT, SECOND, Trajectory
from memsearcher_jax.app.curves import plot_prompt_tokens_by_turn
from memsearcher_jax.rl.token_metrics import (
    TurnTokens,
    by_turn_metrics,
    episode_token_metrics,
    prompt_tokens_by_turn,
    trajectory_token_metrics,
    turn_growth,
)


def test_prompt_tokens_by_turn_counts_only_episodes_that_reached_the_turn():
    rows = prompt_tokens_by_turn([[100, 200, 300], [110, 190], [90]])
    assert rows == [TurnTokens(1, 100.0, 110, 3), TurnTokens(2, 195.0, 200, 2), TurnTokens(3, 300.0, 300, 1)]
    assert prompt_tokens_by_turn([]) == [] and prompt_tokens_by_turn([[]]) == []


def test_turn_growth_flat_vs_growing():
    flat = prompt_tokens_by_turn([[100, 110, 120, 125]])
    growing = prompt_tokens_by_turn([[100, 180, 260, 340]])
    assert turn_growth(flat, 4) == pytest.approx(1.25)
    assert turn_growth(growing, 4) == pytest.approx(3.4)
    assert turn_growth(growing, 2, of="mean") == pytest.approx(1.8)
    assert math.isnan(turn_growth(flat, 5))  # never reached


def test_episode_token_metrics_means_and_max():
    m = episode_token_metrics(peaks=[300, 500], processed=[900, 2100], searches=[1, 3], turns=[2, 4])
    assert m == {"peak_tokens": 400.0, "peak_tokens_max": 500.0, "tokens_per_question": 1500.0, "searches": 2.0,
                 "turns": 3.0}
    assert episode_token_metrics([], [], [], [])["peak_tokens"] == 0.0


def test_episode_token_metrics_rejects_ragged_lists():
    with pytest.raises(ValueError, match="one value per episode"):
        episode_token_metrics(peaks=[1, 2], processed=[1], searches=[1, 2], turns=[1, 2])


def test_by_turn_metrics_names():
    m = by_turn_metrics(prompt_tokens_by_turn([[10, 30], [20]]))
    assert m == {"prompt_tokens_turn1_mean": 15.0, "prompt_tokens_turn1_max": 20.0,
                 "prompt_tokens_turn2_mean": 30.0, "prompt_tokens_turn2_max": 30.0}


def test_plot_one_line_pair_per_workflow(tmp_path):
    png = plot_prompt_tokens_by_turn({"memsearcher": prompt_tokens_by_turn([[100, 110]]),
                                      "react": [{"turn": 1, "mean": 100, "max": 100},
                                                {"turn": 2, "mean": 250, "max": 300}],
                                      "empty": []}, str(tmp_path / "by_turn.png"))
    assert png and (tmp_path / "by_turn.png").stat().st_size > 1000
    assert plot_prompt_tokens_by_turn({"x": []}, str(tmp_path / "none.png")) is None


def test_trajectory_token_metrics_from_recorded_calls():
    # memory-style: two turns of (act, update); react-style: the context grows by each act and observation
    memory = Trajectory(0, 0, "q", ["a"], num_searches=1)
    for turn, (act_prompt, act_out, upd_prompt, upd_out) in enumerate([(20, 2, 25, 1), (25, 2, 0, 0)]):
        memory.record_call(ACT, turn, act_prompt, act_out)
        if upd_prompt:
            memory.record_call(SECOND, turn, upd_prompt, upd_out)
    react = Trajectory(1, 1, "q", ["a"], num_searches=1)
    react.record_call(ACT, 0, 20, 2)
    react.record_call(ACT, 1, 25, 2)
    m = trajectory_token_metrics([memory, react])
    # memory calls (20+2, 25+1, 25+2): peak 27, processed 75; react (20+2, 25+2): peak 27, processed 49
    assert m["peak_tokens"] == 27.0 and m["peak_tokens_max"] == 27.0 and m["tokens_per_question"] == 62.0
    assert m["searches"] == 1.0 and m["turns"] == 2.0
    assert m["prompt_tokens_by_turn"] == [{"turn": 1, "mean": 20.0, "max": 20, "n": 2},
                                          {"turn": 2, "mean": 25.0, "max": 25, "n": 2}]


def test_training_step_logs_the_context_metrics():
    """rl.metrics.rollout_metrics: peak tokens, tokens per question and prompt tokens by turn;
    turns are act calls (a ReAct episode is one conversation of several turns)."""
    from memsearcher_jax.agent.trajectory import Conversation
    from memsearcher_jax.qa_metrics import RewardResult
    from memsearcher_jax.rl.metrics import rollout_metrics

    react = Trajectory(0, 0, "q", ["a"], conversations=[Conversation(prompt_ids=[1] * 20, response_ids=[2] * 9)])
    for turn, prompt in enumerate((20, 25, 31)):
        react.record_call(ACT, turn, prompt, 3)
    short = Trajectory(1, 0, "q", ["a"], conversations=[Conversation(prompt_ids=[1] * 20, response_ids=[2] * 3)])
    short.record_call(ACT, 0, 20, 3)
    results = [RewardResult(reward=1.0, em=1.0, f1=1.0, format_ok=True, answer="a")] * 2
    m = rollout_metrics([react, short], results, num_rows=2)
    assert m["turns_per_trajectory"] == 2.0
    assert m["peak_tokens"] == (34 + 23) / 2 and m["tokens_per_question"] == (23 + 28 + 34 + 23) / 2
    assert (m["prompt_tokens_turn1_mean"], m["prompt_tokens_turn3_max"]) == (20.0, 31.0)
