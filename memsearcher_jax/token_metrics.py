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


def generation_calls(prompt_tokens: int, loss_mask: Sequence[int]) -> list[tuple[int, int]]:
    """(prompt tokens, generated tokens) of each generation call of one conversation, read from
    its loss mask: each maximal run of generated (mask 1) tokens is one call, whose prompt is
    everything before it. For trajectories that do not record their calls."""
    calls, pos = [], 0
    while pos < len(loss_mask):
        if loss_mask[pos] != 1:
            pos += 1
            continue
        start = pos
        while pos < len(loss_mask) and loss_mask[pos] == 1:
            pos += 1
        calls.append((prompt_tokens + start, pos - start))
    return calls


def _episode_calls(traj) -> list[tuple[int, int]]:
    recorded = getattr(traj, "calls", None)
    if recorded is not None:  # agent.trajectory.CallRecord: exact, zero-token calls included
        return [(c.prompt_tokens, c.generated_tokens) for c in recorded]
    return [call for conv in traj.conversations for call in generation_calls(len(conv.prompt_ids), conv.loss_mask)]


def trajectory_token_metrics(trajs) -> dict:
    """episode_token_metrics over trajectories, plus "prompt_tokens_by_turn" (TurnTokens as
    dicts). A trajectory gives its act prompts (context_tokens), its searches and its calls."""
    calls = [_episode_calls(t) for t in trajs]
    out = episode_token_metrics(peaks=[max((p + g for p, g in c), default=0) for c in calls],
                                processed=[sum(p + g for p, g in c) for c in calls],
                                searches=[t.num_searches for t in trajs],
                                turns=[len(t.context_tokens) for t in trajs])
    out["prompt_tokens_by_turn"] = [dataclasses.asdict(r) for r in prompt_tokens_by_turn([t.context_tokens
                                                                                         for t in trajs])]
    return out
