"""How an answer is scored: SQuAD-style normalisation, EM and token F1, and the trajectory score.

The trajectory score (docs/method.md §3: a format gate, then token F1 with a 0.1 format credit)
is the GRPO reward by default, and also what evaluation and the demonstrator check. It lives
here, below rl/, data/ and experiment.py, so that data/ scores a demo without knowing a learner.
It is computed once per trajectory, on the decoded assistant blocks of its final conversation
(the act text, with its pre-filled `<think>` re-attached, and the memory-update text if any).

A multi-objective question (MEM1's task, `data.synthetic.join_objectives`) gives golds as one
alias list per objective; its answer lists the N answers separated by ";", and EM and F1 are
the means over the objectives. One objective is scored exactly as before; N >= 2 objectives
earn 0.1 + 0.9 x mean F1 (`objectives_reward`), which rises with every objective's F1.
"""
from __future__ import annotations

import collections
import dataclasses
import re
import string
from collections.abc import Sequence

from memsearcher_jax.agent.parsing import extract_boxed, tags_balanced, tool_call_bodies_valid

FORMAT_CREDIT = 0.1
# Answers that are only right or wrong: partial token overlap earns nothing.
EXACT_ONLY = frozenset({"yes", "no", "noanswer"})

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower-case, strip ASCII punctuation, drop a/an/the, collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, golds: Sequence[str]) -> bool:
    """True iff the normalised prediction equals some normalised gold alias."""
    p = normalize_answer(prediction)
    return any(p == normalize_answer(g) for g in golds)


def _f1_one(prediction: str, gold: str) -> float:
    p, g = normalize_answer(prediction), normalize_answer(gold)
    if (p in EXACT_ONLY or g in EXACT_ONLY) and p != g:
        return 0.0
    p_toks, g_toks = p.split(), g.split()
    common = collections.Counter(p_toks) & collections.Counter(g_toks)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p_toks), same / len(g_toks)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, golds: Sequence[str]) -> float:
    """Best token F1 over the gold aliases (yes/no/noanswer count only when exactly equal)."""
    return max((_f1_one(prediction, g) for g in golds), default=0.0)


ANSWER_SEPARATOR = ";"


def split_answers(answer: str, n: int) -> list[str]:
    """The answer's parts for n objectives, in order: split on ";" at most n-1 times (so text
    past an n-th separator stays in the last part and lowers its score), stripped, and padded
    with "" when parts are missing. n=1: the whole answer, as a single-question answer is read."""
    if n < 1:
        raise ValueError(f"split_answers: n (objectives) must be >= 1, got {n}")
    parts = [p.strip() for p in answer.split(ANSWER_SEPARATOR, n - 1)] if n > 1 else [answer]
    return parts + [""] * (n - len(parts))


def objective_golds(golds) -> list[list[str]]:
    """golds as one alias list per objective: a flat list of aliases is one objective; a list of
    alias lists is one per objective. ValueError naming golds for anything else or empty."""
    if isinstance(golds, (str, bytes)) or not golds:
        raise ValueError(f"golds must be a non-empty list of answer strings (or of alias lists, one per "
                         f"objective), got {golds!r}")
    if all(isinstance(g, str) for g in golds):
        return [list(golds)]
    if all(not isinstance(g, (str, bytes)) and g and all(isinstance(a, str) for a in g) for g in golds):
        return [list(g) for g in golds]
    raise ValueError(f"golds must be a list of answer strings or a list of non-empty alias lists (one per "
                     f"objective), not a mix: {golds!r}")


def per_objective_scores(answer: str, golds) -> tuple[list[float], list[float]]:
    """([EM], [F1]) of each objective's part of the answer against that objective's aliases, in
    order. golds: as `objective_golds` takes them."""
    per_objective = objective_golds(golds)
    parts = split_answers(answer, len(per_objective))
    ems = [1.0 if exact_match(p, g) else 0.0 for p, g in zip(parts, per_objective)]
    return ems, [token_f1(p, g) for p, g in zip(parts, per_objective)]


def objective_scores(answer: str, golds) -> tuple[float, float]:
    """(EM, F1) of an answer, each the mean over the objectives of the part's EM / token F1
    against that objective's aliases. golds: as `objective_golds` takes them."""
    ems, f1s = per_objective_scores(answer, golds)
    return sum(ems) / len(ems), sum(f1s) / len(f1s)


def objectives_reward(f1s: Sequence[float]) -> float:
    """The reward of a well-formed answer from its per-objective F1s (docs/method.md §3).

    One objective: the paper's F1, or FORMAT_CREDIT when F1 is 0 (kept exactly as the paper has it,
    though an F1 in (0, 0.1) then earns less than a wrong answer). N >= 2: FORMAT_CREDIT +
    (1 - FORMAT_CREDIT) x mean F1, strictly increasing in every objective's F1 and still in
    [0.1, 1]. The paper's rule applied to the mean F1 let a part half right among wrong ones score
    below all wrong (0.0999 against 0.1), and max(0.1, mean F1) would still be flat below 0.1.
    A group's trajectories share one question, hence one N, and an affine map of the rewards
    leaves the group-normalised advantage unchanged (up to its 1e-6), so among well-formed
    answers GRPO sees exactly the mean F1; the credit only ranks them above malformed ones (0)."""
    if not f1s:
        raise ValueError("objectives_reward: f1s must hold one F1 per objective, got none")
    if len(f1s) == 1:
        return f1s[0] if f1s[0] > 0 else FORMAT_CREDIT
    # The mean first: 0.9 x N / N is 0.9999999999999999 at N = 9, 18, 36, 41 (the mean of N ones is 1).
    return FORMAT_CREDIT + (1.0 - FORMAT_CREDIT) * (sum(f1s) / len(f1s))


@dataclasses.dataclass(frozen=True)
class RewardResult:
    reward: float
    em: float  # 1.0 or 0.0; with several objectives, the share answered exactly
    f1: float
    format_ok: bool
    answer: str | None  # the last boxed answer of the last block, if any
    failure: str | None = None  # why the format gate failed (for logging), None if it passed


def format_failure(assistant_blocks: Sequence[str], ended_with_eos: bool) -> str | None:
    """The first docs/method.md §3 format rule the output breaks, or None if it passes them all."""
    if not ended_with_eos:
        return "output did not end with the end-of-turn token"
    if not assistant_blocks:
        return "no assistant blocks"
    for i, block in enumerate(assistant_blocks):
        if not tags_balanced(block, "think"):
            return f"block {i}: unbalanced <think> tags"
        if not tags_balanced(block, "tool_call"):
            return f"block {i}: unbalanced <tool_call> tags"
        if not tool_call_bodies_valid(block):
            return f"block {i}: a tool call body is not JSON with name and arguments"
    if extract_boxed(assistant_blocks[-1]) is None:
        return "last block has no \\boxed{} answer"
    return None


def compute_reward(assistant_blocks: Sequence[str], ended_with_eos: bool, golds: Sequence[str]) -> RewardResult:
    """docs/method.md §3 reward of one trajectory.

    assistant_blocks: decoded model outputs of the final conversation, in order, each act
        block including the `<think>` that the prompt pre-filled.
    ended_with_eos: whether the final generation stopped on the end-of-turn token.
    golds: the gold answer aliases (at least one); or, for a multi-objective question, one
        alias list per objective (the answer's ";"-separated parts are scored in order and the
        EM and F1 are their means).
    Returns reward 0 if the format gate fails; otherwise `objectives_reward`: for one objective
    F1 against the best alias, or FORMAT_CREDIT (0.1) when that F1 is 0; for N >= 2,
    FORMAT_CREDIT + (1 - FORMAT_CREDIT) x mean F1.
    """
    objective_golds(golds)  # a malformed golds fails here, whatever the output
    failure = format_failure(assistant_blocks, ended_with_eos)
    answer = extract_boxed(assistant_blocks[-1]) if assistant_blocks else None
    if failure is not None:
        return RewardResult(reward=0.0, em=0.0, f1=0.0, format_ok=False, answer=answer, failure=failure)
    ems, f1s = per_objective_scores(answer, golds)
    return RewardResult(reward=objectives_reward(f1s), em=sum(ems) / len(ems), f1=sum(f1s) / len(f1s),
                        format_ok=True, answer=answer)
