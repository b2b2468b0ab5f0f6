"""The agent's budgets and sampling, and which registered workflow runs (docs/method.md §1).

A plain value: the turn loop (agent/rollout.py) reads it, and hands it to its workflow's hooks.
"""
from __future__ import annotations

import dataclasses

from memsearcher_jax.agent.workflows import workflow_names
from memsearcher_jax.agent.workflows.base import MIN_OBSERVATION_TOKENS
from memsearcher_jax.agent.workflows.summary import OVERLONG_MASKS


def episode_turns(max_turns: int, turns_per_question: int, questions: int) -> int:
    """The turn budget of an episode of `questions` questions asked at once: `max_turns` for one, and
    `turns_per_question` more for each further one (docs/method.md §8). 0 per question: max_turns at
    any count, as before. max_turns 4 and 2 per question give 2N + 2 (a search per hop of a 2-hop
    question, the answer and a spare turn), bench/paper_tables.py's rule."""
    return max_turns + turns_per_question * (max(int(questions), 1) - 1)


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """Budgets and sampling of the agent. Defaults are the recipe's training values (docs/method.md §1),
    each the `agent.*` / `sampler.*` key's default in settings/agent.py (tests/test_lower_defaults.py)."""

    workflow: str = "memsearcher"
    max_turns: int = 5
    max_new_tokens: int = 512           # per generation call
    memory_budget: int = 1024           # tokens of m_t (memory_ops: of the whole entry bank)
    max_response_tokens: int = 8192     # response tokens of one conversation (act + obs + update)
    max_context_tokens: int = 16384     # prompt + response of one generation call
    default_top_n: int = 5              # what the prompt tells the model
    max_top_n: int = 10                 # the recipe's server returns 10 unless asked for fewer
    missing_top_n: int = 10             # passages for a call without top_n, as the recipe's server
                                        # gives; 0: default_top_n (the prompt's word)
    max_observation_tokens: int = 7168  # tokens one observation adds to its row, markup included (0:
                                        # max_response_tokens): documents cut to fit, a cut says so. The
                                        # recipe's: what a response leaves after act and update (8192 - 2 x 512)
    max_searches_per_act: int = 3       # searches one act may run; its further calls get one refusal note
    sampler_batch_size: int = 0         # rows per sampler call (0: every live row at once); bounds
                                        # the KV cache, and row seeds keep the samples the same
    temperature: float = 1.0
    top_p: float = 0.99
    top_k: int = 0
    prompt_style: str = "full"          # "compact": a few-token system prompt for tiny models
    turns_per_question: int = 0         # turns each question after the first adds to max_turns (0: off)
    summary_budget: int = 256           # summary: history tokens (acts, observations) of a segment before it summarizes
    summary_overlong_mask: str = "none"  # summary: "segment" | "trajectory": SUPO's masking of an episode a limit cut
    fold_turns: int = 4                 # fold: acts one branch may take (its last returns or answers)

    def __post_init__(self):
        problems = []
        if self.workflow not in workflow_names():
            problems.append(f"workflow must be one of the registered workflows {workflow_names()}, "
                            f"got {self.workflow!r}")
        for name in ("max_turns", "max_new_tokens", "memory_budget", "max_response_tokens",
                     "max_context_tokens", "default_top_n", "max_top_n"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            problems.append(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.sampler_batch_size < 0:
            problems.append(f"sampler_batch_size must be >= 0 (0: all rows), got {self.sampler_batch_size}")
        if self.max_observation_tokens < 0 or 0 < self.max_observation_tokens < MIN_OBSERVATION_TOKENS:
            problems.append(f"max_observation_tokens must be 0 (max_response_tokens) or >= {MIN_OBSERVATION_TOKENS} "
                            f"(an observation's markup and a note), got {self.max_observation_tokens}")
        if self.max_searches_per_act < 1:
            problems.append(f"max_searches_per_act must be >= 1, got {self.max_searches_per_act}")
        if self.missing_top_n < 0:
            problems.append(f"missing_top_n must be >= 0 (0: default_top_n), got {self.missing_top_n}")
        if self.summary_budget < 1 or self.fold_turns < 1:
            problems.append(f"summary_budget and fold_turns must be >= 1, got {self.summary_budget} and "
                            f"{self.fold_turns}")
        if self.summary_overlong_mask not in OVERLONG_MASKS:
            problems.append(f"summary_overlong_mask must be one of {OVERLONG_MASKS}, "
                            f"got {self.summary_overlong_mask!r}")
        if self.turns_per_question < 0:
            problems.append(f"turns_per_question must be >= 0 (0: max_turns whatever the question count), "
                            f"got {self.turns_per_question}")
        if problems:
            raise ValueError("invalid AgentConfig: " + "; ".join(problems))

    def episode_turns(self, questions: int) -> int:
        """The turns an episode asking `questions` questions at once gets (`episode_turns`)."""
        return episode_turns(self.max_turns, self.turns_per_question, questions)

    def evaluation(self, max_turns: int = 20) -> AgentConfig:
        """The recipe's evaluation setting: greedy, up to 20 turns."""
        return dataclasses.replace(self, temperature=0.0, top_p=1.0, top_k=0, max_turns=max_turns)
