"""How an answer is scored: SQuAD-style normalisation, EM and token F1, and the trajectory score.

The trajectory score (docs/method.md §3: a format gate, then token F1 with a 0.1 format credit)
is the GRPO reward by default, and also what evaluation and the demonstrator check. It lives
here, below rl/, data/ and experiment.py, so that data/ scores a demo without knowing a learner.
It is computed once per trajectory, on the decoded assistant blocks of its final conversation
(the act text, with its pre-filled `<think>` re-attached, and the memory-update text if any).
"""
from __future__ import annotations

import collections
import dataclasses
import re
import string
from typing import Sequence

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


@dataclasses.dataclass(frozen=True)
class RewardResult:
    reward: float
    em: float  # 1.0 or 0.0
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
    golds: the gold answer aliases (at least one).
    Returns reward 0 if the format gate fails; otherwise F1 against the best alias, or
    FORMAT_CREDIT (0.1) when that F1 is 0.
    """
    if isinstance(golds, str) or not golds:
        raise ValueError(f"golds must be a non-empty list of answer strings, got {golds!r}")
    failure = format_failure(assistant_blocks, ended_with_eos)
    answer = extract_boxed(assistant_blocks[-1]) if assistant_blocks else None
    if failure is not None:
        return RewardResult(reward=0.0, em=0.0, f1=0.0, format_ok=False, answer=answer, failure=failure)
    f1 = token_f1(answer, golds)
    em = 1.0 if exact_match(answer, golds) else 0.0
    return RewardResult(reward=f1 if f1 > 0 else FORMAT_CREDIT, em=em, f1=f1, format_ok=True, answer=answer)
