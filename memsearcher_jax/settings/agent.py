"""The agent (its workflow, budgets, sampling, prompt and tool) and the sampler that runs its turns.
Defaults: the paper recipe's (configs/memsearcher_qwen2_5_3b.py; docs/method.md §1)."""
from __future__ import annotations

import dataclasses

from memsearcher_jax.agent.prompts import HINT_MODES
from memsearcher_jax.agent.tools import tool_spec
from memsearcher_jax.errors import UserInputError
from memsearcher_jax.settings.fields import Section, flag_problems, setting


@dataclasses.dataclass(frozen=True)
class AgentSettings(Section):
    """The agent: its workflow (the memory design), budgets, sampling, prompt and search tool."""
    key = "agent"
    workflow: str = setting("memsearcher", "the memory design, by registered name (agent/workflows/)")
    max_turns: int = setting(5, "acts an episode of one question may take in training")
    max_new_tokens: int = setting(512, "tokens one generation call may write (an act, a memory update)")
    memory_budget: int = setting(1024, "tokens of the carried memory (memory_ops: of its whole entry bank)")
    max_response_tokens: int = setting(8192, "response tokens of one conversation (act, observation, update)")
    max_context_tokens: int = setting(16384, "prompt + response of one generation call (the KV cache's slots)")
    default_top_n: int = setting(5, "passages a search returns, as the system prompt tells the model")
    max_top_n: int = setting(10, "the most passages a call may ask for (top_n above it is cut to it)")
    max_observation_tokens: int = setting(7168, "tokens one observation adds to its row, markup included (0: "
                                                "max_response_tokens, else >= 128); documents are cut to fit, and a "
                                                "cut says so; the planner's longest row counts it")
    max_searches_per_act: int = setting(3, "searches one act may run; its further calls get one refusal note "
                                           "(refused_searches on the trajectory)")
    missing_top_n: int = setting(10, "passages for a call that gives no top_n (0: default_top_n; the recipe's "
                                     "server gives 10)")
    temperature: float = setting(1.0, "training rollouts' sampling temperature; the learner scores tokens at it too")
    top_p: float = setting(0.99, "training rollouts' nucleus (1.0: off)")
    top_k: int = setting(0, "training rollouts' top-k (0: off)")
    eval_max_turns: int = setting(20, "acts an evaluation episode may take (greedy)")
    turns_per_question: int = setting(0, "turns each question after the first adds to max_turns and eval_max_turns "
                                         "(0: off; docs/method.md §8)")
    hint: str = setting("none", '"turns" | "turns_and_questions": MEM1\'s hint line ending each act\'s user message')
    summary_budget: int = setting(256, "workflow=summary: history tokens (acts, observations) of a segment before "
                                       "its summary act (docs/method.md §11)")
    summary_overlong_mask: str = setting("none", 'workflow=summary: "segment" | "trajectory": SUPO, no loss on what '
                                                 "a limit cut")
    fold_turns: int = setting(4, "workflow=fold: acts one branch may take, its last returns or answers "
                                 "(docs/method.md §12)")
    prompt_style: str = setting("full", 'the system prompt: "full" (the recipe\'s) or "compact" (a few tokens, '
                                        "for tiny models)")
    tool: str = setting("wikipedia_search", "the search tool by registered name (agent/tools.py)")
    multi_answer_prompt: str | bool = setting("auto", 'state the N-answer format ("a1; a2") in every system prompt: '
                                                      "auto where a task asks several questions at once")
    tool_schema: str = setting("", 'your own JSON function schema ({"name", "description", "parameters"}) '
                                   "instead of agent.tool: its first required string parameter is the query, an "
                                   "integer one the passage count")
    stop_token_ids: tuple[int, ...] = setting((), "ids a generation also ends on (empty: the tokenizer's eos and the "
                                                  "model directory's generation_config eos list)")

    def problems(self, training: bool = True) -> list[str]:
        """The stop ids, the hint, the tool (agent/tools.py's rule) and the answer-format flag; the
        budgets and sampling values are AgentConfig's (agent/config.py), asked once these pass."""
        problems = []
        try:
            tool_spec(self.tool, self.tool_schema)
        except UserInputError as e:
            problems.append(str(e))
        bad_ids = [v for v in self.stop_token_ids if isinstance(v, bool) or not isinstance(v, int) or v < 0]
        if bad_ids:
            problems.append(f"agent.stop_token_ids={tuple(self.stop_token_ids)}: expected token ids (integers >= 0, "
                            f"e.g. --config.agent.stop_token_ids=151643,151645), got {bad_ids[0]!r}")
        if self.hint not in HINT_MODES:
            problems.append(f"agent.hint={self.hint!r}: expected one of {', '.join(map(repr, HINT_MODES))}")
        return problems + flag_problems(self.multi_answer_prompt, "agent.multi_answer_prompt")


@dataclasses.dataclass(frozen=True)
class SamplerSettings(Section):
    """The KV-cache sampler that runs the agent's turns."""
    key = "sampler"
    cache_dtype: str = setting("bfloat16", "the KV cache's dtype (and the sampler's compute dtype)")
    batch_size: int = setting(0, "rows per sampler call (0: every live row in one call); bounds the KV cache")
    prefill_query_block: int = setting(512, "prefill attention: queries per block (0: all at once)")
    devices: int = setting(0, "devices that decode on their own: the sampler on the last sampler.devices devices "
                              "(a multiple of mesh.tp), the learner on the mesh's before them (0: both share the "
                              "mesh's devices)")

    def problems(self, training: bool = True) -> list[str]:
        from memsearcher_jax.sampling.sampler import check_query_block  # the sampler loads JAX

        problems = [] if self.devices >= 0 else [f"sampler.devices must be >= 0 (0: the learner's devices), got "
                                                 f"{self.devices}"]
        try:
            check_query_block(self.prefill_query_block)
        except ValueError as e:
            problems.append(f"sampler.{e}")
        return problems
