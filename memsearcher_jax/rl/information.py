"""The per-question information signal (issue 83 item 1), the same for every memory design.

For trajectory t, each turn k it opened and each question i of its task ("q1; q2" asks two):

    s[k, i] = log p(gold_i | carried_k + PROBE(question_i))

the policy's log-probability of question i's gold answer (its first alias, every token summed),
teacher-forced in one batched pass of the learner (`GRPOLearner.compute_logprobs`: the jitted
log-prob program in its fixed width buckets) right after the rollout, at the weights that sampled
it. carried_k is what turn k's act prompt carried from earlier turns (`Trajectory.carried_ids`,
`Workflow.carried_span`): memsearcher's memory, mem1's last act and observation (its internal
state), memory_ops' bank, react's whole history; empty on the first turn, so s[0] is what the
policy reads from the probe alone. The probe (`PROBE_OPEN` q `PROBE_CLOSE`, then the gold) is the
cloze the reading base was pretrained on, `\\n<question> q </question>\\n\\boxed{a`: the builder's
own text (tags as every prompt writes them, no chat markup), the question and the gold as plain
text, the same for every design. The gain of turn k (k from 1) is s[k] - s[k-1]: what that turn's
search and memory update added to (or took from) the context the next turn reads.

    rl.info_signal = "off"     nothing computed (the default; its cost is measured in docs/usage.md)
                     "log"     the info/* metrics every step (`information_metrics`)
                     "reward"  those, and with rl.info_coef > 0 a shaped advantage (`shaped_advantages`)

The shaped advantage follows InfoMem's rules: gains, not levels (a trajectory's bonus is its
questions' mean gain over the episode, s[last] - s[0], the per-turn gains summed); only where the
outcome succeeded (question i's gain counts only when the answer got question i exactly right, so
gathering information the answer then ignores, or hoarding it in a failed episode, earns nothing);
normalised before it is added (within each group, over its trajectories that got a question right,
as the reward is: its scale in nats never matters, and a failed trajectory's advantage is left as
the outcome made it); it reaches every generated token of the trajectory, as the outcome advantage
does (react's turns share one row, so a per-turn credit would treat the designs differently). With
rl.info_coef 0 the advantages are the very array `trajectory_advantages` returns: the update is
bit-identical to a run without the signal.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from memsearcher_jax.agent.prompts import PromptBuilder, Untrusted
from memsearcher_jax.agent.trajectory import Trajectory
from memsearcher_jax.qa_metrics import RewardResult, objective_golds, per_objective_scores
from memsearcher_jax.rl.advantages import group_advantages
from memsearcher_jax.rl.batching import RowBatch
from memsearcher_jax.rl.grpo import trajectory_advantages
from memsearcher_jax.runtime import compile_stats
from memsearcher_jax.sampling.buckets import bucket

INFO_MODES = ("off", "log", "reward")
PROBE_OPEN, PROBE_CLOSE = "\n<question> ", " </question>\n\\boxed{"
LOST_NATS = 1.0  # a question's log p(gold) this far below its peak by the episode's end: the memory lost it


def probe_tokens(builder: PromptBuilder, carried: Sequence[int], question: str, gold: str,
                 max_len: int = 0) -> tuple[list[int], int]:
    """(carried + probe lead + gold ids, number of gold ids). max_len > 0: the carried context's
    oldest tokens are dropped so the whole fits (the probe and the gold are never cut)."""
    lead = builder.encode_parts(PROBE_OPEN, Untrusted(question.strip()), PROBE_CLOSE)
    answer = builder.encode_plain(gold.strip())
    keep = len(carried) if max_len <= 0 else max(max_len - len(lead) - len(answer), 0)
    return list(carried[len(carried) - min(keep, len(carried)):]) + lead + answer, len(answer)


def probe_plan(trajs: Sequence[Trajectory]) -> list[list[tuple[int, str, str]]]:
    """Per trajectory, its probes: (turn, question, gold) for every opened turn and question, turn
    major. None for a trajectory that cannot be probed (questions and gold lists disagree in number,
    or a turn's carried context is unknown)."""
    plans = []
    for t in trajs:
        golds = [g[0] for g in objective_golds(t.golds)] if t.golds else []
        if not golds or len(golds) != len(t.objectives) or not t.carried:
            plans.append(None)
            continue
        plans.append([(k, q, g) for k in range(len(t.carried)) for q, g in zip(t.objectives, golds)])
    return plans


def information_scores(score_rows: Callable[[RowBatch], np.ndarray], builder: PromptBuilder,
                       trajs: Sequence[Trajectory], min_len: int = 64, max_len: int = 0) -> list[np.ndarray | None]:
    """s[k, i] of every trajectory ([turns opened, questions]; None where `probe_plan` has none),
    from ONE `score_rows` call over every distinct probe sequence (a group's G first turns, and any
    context that did not change, are scored once). score_rows: a RowBatch -> per-token log-probs at
    its loss positions (`GRPOLearner.compute_logprobs`); min_len / max_len: its rows' bucket floor
    and the longest sequence it takes."""
    plans, index, seqs, n_gold, where = probe_plan(trajs), {}, [], [], []
    for t, plan in zip(trajs, plans):
        where.append([])
        for k, q, g in plan or ():
            ids, n = probe_tokens(builder, t.carried_ids(k), q, g, max_len)
            if tuple(ids) not in index:
                index[tuple(ids)] = len(seqs)
                seqs.append(ids)
                n_gold.append(n)
            where[-1].append(index[tuple(ids)])
    if not seqs:
        return [None] * len(trajs)
    rows = probe_rows(seqs, n_gold, builder.pad_id, min_len)
    # Unpacked, the learner fills a whole window around the gold: only the gold's own positions count.
    per_seq = (score_rows(rows) * rows.loss_mask).sum(axis=1, dtype=np.float64)
    return [None if plan is None else per_seq[np.asarray(w, np.int64)].reshape(len(t.carried), len(t.objectives))
            for t, plan, w in zip(trajs, plans, where)]


def probe_rows(seqs: Sequence[list[int]], n_gold: Sequence[int], pad_id: int, min_len: int = 64) -> RowBatch:
    """The probe sequences as learner rows: right-padded to one whole-octave bucket, the loss mask
    on each sequence's gold tokens (its last n_gold), nothing else of a RowBatch used."""
    r, s = len(seqs), bucket(max(len(x) for x in seqs), min_len)
    tokens = np.full((r, s), pad_id, np.int32)
    attention = np.zeros((r, s), np.int32)
    loss_mask = np.zeros((r, s), np.float32)
    for i, (ids, n) in enumerate(zip(seqs, n_gold)):
        tokens[i, :len(ids)], attention[i, :len(ids)] = ids, 1
        loss_mask[i, len(ids) - n:len(ids)] = 1
    zeros = np.zeros(r, np.int64)
    return RowBatch(tokens=tokens, attention=attention, loss_mask=loss_mask, sampler_logp=np.zeros((r, s), np.float32),
                    advantages=np.zeros(r, np.float32), traj_ids=np.arange(r), group_ids=zeros, turns=zeros,
                    is_final=np.zeros(r, bool))


def information_metrics(scores: Sequence[np.ndarray | None]) -> dict[str, float]:
    """The step's info/* metrics from every trajectory's s[k, i]: the mean log p(gold) at each turn
    (info/logp_turn{k}_mean, k from 1) and the mean gain each turn made (info/gain_turn{k}_mean:
    s[k] - s[k-1], the turn k's search and update), both over (trajectory, question); info/gain_mean
    over every (trajectory, turn, question); info/rose_share: questions whose log p(gold) ended above
    where it started; info/lost_share: questions that ended more than LOST_NATS below their peak
    (the memory held the fact, then lost it); info/scored_share: trajectories probed."""
    got = [s for s in scores if s is not None]
    out = {"info/scored_share": len(got) / max(len(scores), 1)}
    if not got:
        return out
    turns = max(s.shape[0] for s in got)
    for k in range(turns):
        out[f"info/logp_turn{k + 1}_mean"] = float(np.mean(np.concatenate([s[k] for s in got if s.shape[0] > k])))
        if k:
            gains = np.concatenate([s[k] - s[k - 1] for s in got if s.shape[0] > k])
            out[f"info/gain_turn{k}_mean"] = float(gains.mean())
    gains = np.concatenate([np.diff(s, axis=0).ravel() for s in got])
    out["info/gain_mean"] = float(gains.mean()) if gains.size else 0.0
    out["info/rose_share"] = float(np.mean(np.concatenate([s[-1] > s[0] for s in got])))
    out["info/lost_share"] = float(np.mean(np.concatenate([s.max(axis=0) - s[-1] > LOST_NATS for s in got])))
    out["info/logp_first_mean"] = float(np.mean(np.concatenate([s[0] for s in got])))
    out["info/logp_last_mean"] = float(np.mean(np.concatenate([s[-1] for s in got])))
    return out


def information_bonus(scores: Sequence[np.ndarray | None], trajs: Sequence[Trajectory],
                      results: Sequence[RewardResult]) -> tuple[np.ndarray, np.ndarray]:
    """(bonus [T], eligible [T]): a trajectory's bonus is the mean over its questions of
    s[last, i] - s[0, i], question i's term counted only when the answer was well-formed and got
    question i exactly right; eligible: a probed trajectory that got at least one question right
    (the others are neither paid nor compared)."""
    bonus, eligible = np.zeros(len(trajs), np.float64), np.zeros(len(trajs), bool)
    for j, (s, t, r) in enumerate(zip(scores, trajs, results)):
        if s is None or not r.format_ok or r.answer is None:
            continue
        right = np.asarray(per_objective_scores(r.answer, t.golds)[0]) == 1.0
        bonus[j], eligible[j] = float(np.mean((s[-1] - s[0]) * right)), bool(right.any())
    return bonus, eligible


def shaped_advantages(adv: np.ndarray, bonus: np.ndarray, eligible: np.ndarray, group_ids: Sequence[int],
                      coef: float) -> np.ndarray:
    """adv + coef x the bonus normalised within each group over its eligible trajectories
    (`group_advantages` among them: 0 where their bonuses tie, and for a group with one eligible
    trajectory, which has nothing to be compared with); the others' advantages unchanged.
    coef 0: `adv` itself, untouched."""
    if coef == 0:
        return adv
    groups, z = np.asarray(group_ids), np.zeros(len(adv), np.float64)
    if eligible.any():
        _, inverse, counts = np.unique(groups[eligible], return_inverse=True, return_counts=True)
        z[eligible] = group_advantages(bonus[eligible], groups[eligible]) * (counts[inverse.reshape(-1)] > 1)
    return (adv + coef * z).astype(adv.dtype)


def information_advantages(trainer: Any, trajs: Sequence[Trajectory],
                           results: Sequence[RewardResult]) -> tuple[np.ndarray, dict]:
    """The step's advantages (`trajectory_advantages`, shaped under rl.info_signal="reward" with
    rl.info_coef != 0) and its info/* metrics ({} when rl.info_signal="off"), from the trainer's
    (rl/trainer.py's `Trainer`, which imports this module) learner at its current weights (those
    that sampled `trajs`), prompt builder (`trainer.runner.builder`) and loop settings."""
    loop, learner = trainer.loop, trainer.learner
    adv = trajectory_advantages(trajs, [r.reward for r in results])
    if loop.info_signal == "off":
        return adv, {}
    t0, c0 = time.perf_counter(), compile_stats.snapshot()
    grpo = learner.config
    scores = information_scores(lambda rows: learner.compute_logprobs(learner.params, rows), trainer.runner.builder,
                                trajs, min_len=grpo.min_seq_len, max_len=grpo.max_seq_len)
    info = information_metrics(scores)
    if loop.info_signal == "reward" and loop.info_coef != 0:
        bonus, eligible = information_bonus(scores, trajs, results)
        adv = shaped_advantages(adv, bonus, eligible, [t.group_id for t in trajs], loop.info_coef)
        info.update({"info/bonus_mean": float(bonus[eligible].mean()) if eligible.any() else 0.0,
                     "info/eligible_share": float(eligible.mean())})
    info.update(time_info=time.perf_counter() - t0, compiles_info=(compile_stats.snapshot() - c0).programs)
    return adv, info


def merge_info(update: dict, info: dict) -> dict:
    """The update's metrics with the info pass's: its programs counted with the log-prob passes'
    (so a step's compile metrics still add up), its seconds as time_info. `update` itself when {}."""
    if not info:
        return update
    return {**update, **info, "compiles_logprobs": update["compiles_logprobs"] + info["compiles_info"]}
