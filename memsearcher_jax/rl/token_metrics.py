"""How much context a workflow uses, aggregated over episodes (issue 23's per-workflow metrics).

Pure functions over plain per-episode numbers, so evaluation, training metrics and
bench/paper_tables.py aggregate the same way:

    prompt_tokens_by_turn([[120, 130], [118]])  # act-call prompt tokens, one list per episode
    -> [TurnTokens(turn=1, mean=119.0, max=120, n=2), TurnTokens(turn=2, mean=130.0, max=130, n=1)]
    episode_token_metrics(peaks=[...], processed=[...], searches=[...], turns=[...])

An episode's numbers (its act prompts by turn, its peak context, the tokens it processed) are
its trajectory's to give (agent.trajectory); nothing here imports the agent.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class TurnTokens:
    """Prompt tokens of the act calls made at one turn (1-based), over the episodes that reached it."""

    turn: int
    mean: float
    max: int
    n: int  # episodes that made an act call at this turn


def prompt_tokens_by_turn(act_prompt_tokens: Sequence[Sequence[int]]) -> list[TurnTokens]:
    """Mean and max act-call prompt tokens at each turn. act_prompt_tokens: one list per episode,
    its act calls' prompt tokens in turn order (an episode that ended early just stops adding)."""
    by_turn: list[list[int]] = []
    for episode in act_prompt_tokens:
        for i, n in enumerate(episode):
            if i == len(by_turn):
                by_turn.append([])
            by_turn[i].append(int(n))
    return [TurnTokens(turn=i + 1, mean=sum(v) / len(v), max=max(v), n=len(v)) for i, v in enumerate(by_turn)]


def turn_growth(by_turn: Sequence[TurnTokens], turn: int, of: str = "max") -> float:
    """How many times turn 1's value (`of`: "max" or "mean") the given turn's is (e.g. issue 23's
    target: memsearcher's max at turn 4 <= 1.25x turn 1). NaN when that turn was never reached."""
    rows = {t.turn: getattr(t, of) for t in by_turn}
    if turn not in rows or not rows.get(1):
        return float("nan")
    return rows[turn] / rows[1]


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if len(xs) else 0.0


def episode_token_metrics(peaks: Sequence[int], processed: Sequence[int], searches: Sequence[int],
                          turns: Sequence[int]) -> dict[str, float]:
    """Per-question means over episodes (one value per episode in each list, same order):
    peak_tokens (the largest context of any call of the episode; also its max over episodes),
    tokens_per_question (every call's prompt + output, summed over the episode), searches, turns."""
    sizes = {len(peaks), len(processed), len(searches), len(turns)}
    if len(sizes) != 1:
        raise ValueError(f"episode_token_metrics: one value per episode in every list, got lengths peaks "
                         f"{len(peaks)}, processed {len(processed)}, searches {len(searches)}, turns {len(turns)}")
    return {"peak_tokens": _mean(peaks), "peak_tokens_max": float(max(peaks, default=0)),
            "tokens_per_question": _mean(processed), "searches": _mean(searches), "turns": _mean(turns)}


def by_turn_metrics(by_turn: Sequence[TurnTokens], prefix: str = "prompt_tokens") -> dict[str, float]:
    """by_turn as flat scalars for a metrics log: {prefix}_turn{k}_mean / _max."""
    out: dict[str, float] = {}
    for t in by_turn:
        out[f"{prefix}_turn{t.turn}_mean"] = float(t.mean)
        out[f"{prefix}_turn{t.turn}_max"] = float(t.max)
    return out


def trajectory_token_metrics(trajs) -> dict:
    """episode_token_metrics over trajectories (agent.trajectory.Trajectory: its peak_tokens,
    tokens_processed, num_searches, turns and act_prompt_tokens, all read from the calls it
    recorded), plus "prompt_tokens_by_turn" (TurnTokens as dicts)."""
    out = episode_token_metrics(peaks=[t.peak_tokens for t in trajs], processed=[t.tokens_processed for t in trajs],
                                searches=[t.num_searches for t in trajs], turns=[t.turns for t in trajs])
    out["prompt_tokens_by_turn"] = [dataclasses.asdict(r)
                                    for r in prompt_tokens_by_turn([t.act_prompt_tokens for t in trajs])]
    return out
