"""The batched turn loop: MemSearcher and ReAct workflows over many trajectories at once.

One turn of the memory workflow (docs/method.md §1), for every live trajectory together:
  1. act:     one sampler call for all live rows; context = system + question + memory m_{t-1}
  2. observe: every tool call of every row in ONE batched retriever call (host side)
  3. update:  one sampler call for all rows that searched; the first non-empty <memory> span
              becomes m_t (its token count is checked against the memory budget)
Each turn is one conversation = one training row: prompt = context, response = act tokens
(+ observation tokens + memory-update tokens), loss mask 1 exactly on generated tokens.

The ReAct baseline keeps ONE growing conversation per trajectory: every act and observation
is appended; retrieved text is masked out of the loss.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Protocol, Sequence

from memsearcher_jax.agent.parsing import ActKind, classify_act, extract_memory, outside_think, parse_tool_calls
from memsearcher_jax.agent.prompts import PromptBuilder
from retrieval.base import ERROR_HIT_ID, Hit, Retriever

WORKFLOWS = ("memsearcher", "react")


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """Budgets and sampling of the agent. Defaults are the recipe's training values (docs/method.md §1)."""

    workflow: str = "memsearcher"
    max_turns: int = 5
    max_new_tokens: int = 512           # per generation call
    memory_budget: int = 1024           # tokens of m_t
    max_response_tokens: int = 8192     # response tokens of one conversation (act + obs + update)
    max_context_tokens: int = 32768     # prompt + response of one generation call
    default_top_n: int = 5              # what the prompt tells the model
    max_top_n: int = 10                 # the recipe's server returns 10 unless asked for fewer
    missing_top_n: int = 0              # passages for a call without top_n; 0: default_top_n (the
                                        # prompt's word). The recipe's server gives 10.
    max_observation_tokens: int = 0     # documents of one observation cut to this many tokens (0: no cap);
                                        # a cut observation says so, and no longer ends the trajectory
    sampler_batch_size: int = 0         # rows per sampler call (0: every live row at once); bounds
                                        # the KV cache, and row seeds keep the samples the same
    temperature: float = 1.0
    top_p: float = 0.99
    top_k: int = 0
    prompt_style: str = "full"          # "compact": a few-token system prompt for tiny models

    def __post_init__(self):
        problems = []
        if self.workflow not in WORKFLOWS:
            problems.append(f"workflow must be one of {WORKFLOWS}, got {self.workflow!r}")
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
        if self.max_observation_tokens < 0:
            problems.append(f"max_observation_tokens must be >= 0 (0: no cap), got {self.max_observation_tokens}")
        if self.missing_top_n < 0:
            problems.append(f"missing_top_n must be >= 0 (0: default_top_n), got {self.missing_top_n}")
        if problems:
            raise ValueError("invalid AgentConfig: " + "; ".join(problems))

    def evaluation(self, max_turns: int = 20) -> "AgentConfig":
        """The recipe's evaluation setting: greedy, up to 20 turns."""
        return dataclasses.replace(self, temperature=0.0, top_p=1.0, top_k=0, max_turns=max_turns)


class Completion(Protocol):
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str


class TokenSampler(Protocol):
    """What the turn loop needs from the sampler (memsearcher_jax.sampling.Sampler).

    row_seeds (one per prompt) are the trajectory ids: a trajectory's samples must not depend
    on which other rows share the call (or the host)."""

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                 top_k: int, stop_token_ids: Sequence[int], seed: int,
                 row_seeds: Sequence[int] | None = None) -> list[Completion]: ...


@dataclasses.dataclass
class Conversation:
    """One training row. response_ids, loss_mask and sampler_logprobs are aligned."""

    prompt_ids: list[int]
    response_ids: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    sampler_logprobs: list[float] = dataclasses.field(default_factory=list)
    traj_id: int = 0
    group_id: int = 0
    turn: int = 0
    is_final: bool = False
    blocks: list[str] = dataclasses.field(default_factory=list)  # decoded generated blocks
    ended_with_eos: bool = False

    def add_generated(self, tokens: Sequence[int], logprobs: Sequence[float]):
        self.response_ids += list(tokens)
        self.loss_mask += [1] * len(tokens)
        self.sampler_logprobs += [float(x) for x in logprobs]

    def add_injected(self, tokens: Sequence[int]):
        self.response_ids += list(tokens)
        self.loss_mask += [0] * len(tokens)
        self.sampler_logprobs += [0.0] * len(tokens)


@dataclasses.dataclass
class Trajectory:
    traj_id: int
    group_id: int
    question: str
    golds: list[str]
    conversations: list[Conversation] = dataclasses.field(default_factory=list)
    memory: str = ""
    memories: list[str] = dataclasses.field(default_factory=list)
    memory_tokens: list[int] = dataclasses.field(default_factory=list)  # token count of each kept memory
    done: bool = False
    end_reason: str = ""
    num_searches: int = 0
    context_tokens: list[int] = dataclasses.field(default_factory=list)  # prompt tokens per act call

    @property
    def final(self) -> Conversation:
        return self.conversations[-1]

    def finish(self, reason: str):
        self.done = True
        self.end_reason = reason
        self.final.is_final = True


@dataclasses.dataclass
class RolloutStats:
    """Counts of one training step's rollout (the trainer starts a new one every step)."""

    sampler_seconds: float = 0.0
    retrieval_seconds: float = 0.0
    generated_tokens: int = 0
    sampler_calls: int = 0
    retriever_calls: int = 0
    searches: int = 0                   # non-empty queries sent to the retriever
    search_errors: int = 0              # of those, answered with an error hit (the retriever failed)
    max_search_error_fraction: float = 0.5  # more failures than this share of the searches stops the step

    last_search_error: str = ""

    def check_search_errors(self) -> None:
        """SearchFailuresError when more than max_search_error_fraction of the searches failed
        (the trainer asks after each step's rollout, before the update)."""
        if self.search_errors > self.max_search_error_fraction * self.searches:
            raise SearchFailuresError(
                f"{self.search_errors} of {self.searches} searches of this step failed (more than "
                f"{self.max_search_error_fraction:.0%}); the retriever said: {self.last_search_error}")


class SearchFailuresError(RuntimeError):
    """Too many searches failed in one step: training on "search failed" observations teaches nothing."""


def _run_searches(retriever: Retriever, calls_per_row: list[list], stats: RolloutStats) -> list[list[list[Hit]]]:
    """All calls of all rows in ONE batched retriever call; failures become error hits."""
    flat = [c for calls in calls_per_row for c in calls]
    if not flat:
        return [[] for _ in calls_per_row]
    top = max(c.top_n for c in flat)
    t0 = time.perf_counter()
    try:
        results = retriever.search([c.query for c in flat], top)
        if len(results) != len(flat):
            raise RuntimeError(f"retriever returned {len(results)} result lists for {len(flat)} queries")
    except Exception as e:  # the rollout never crashes because search failed
        results = [[Hit(id=ERROR_HIT_ID, contents=f"{type(e).__name__}: {e}")] for _ in flat]
    stats.retrieval_seconds += time.perf_counter() - t0
    stats.retriever_calls += 1
    # An error hit for a real query means the retriever failed (an empty query is the model's doing).
    sent = [r for c, r in zip(flat, results) if c.query and c.query.strip()]
    failed = [r[0].contents for r in sent if len(r) == 1 and r[0].id == ERROR_HIT_ID]
    stats.searches += len(sent)
    stats.search_errors += len(failed)
    if failed:
        stats.last_search_error = failed[0][:300]
        print(f"warning: {len(failed)} of {len(sent)} searches failed ({failed[0][:200]}); counted in "
              "the step's search_errors", file=sys.stderr, flush=True)
    out, k = [], 0
    for calls in calls_per_row:
        per = []
        for c in calls:
            per.append(list(results[k])[: c.top_n])
            k += 1
        out.append(per)
    return out


class AgentRunner:
    """Runs batched episodes of one workflow with a sampler and a retriever."""

    def __init__(self, builder: PromptBuilder, sampler: TokenSampler, retriever: Retriever, config: AgentConfig):
        self.builder = builder
        self.sampler = sampler
        self.retriever = retriever
        self.config = config
        self.stats = RolloutStats()

    def _generate(self, prompts: list[list[int]], max_new_tokens: int | list[int], seed: int,
                  rows: Sequence[Trajectory] | None = None):
        """One sampler call. rows: the trajectory of each prompt; their traj_ids become the
        sampler's per-row seeds, so a trajectory samples the same tokens whichever other
        trajectories share the call (or the host)."""
        cfg = self.config
        t0 = time.perf_counter()
        # Per-row budgets go to the sampler; a row that still overshoots is cut and marked "length".
        budget = max(max_new_tokens) if isinstance(max_new_tokens, list) else max_new_tokens
        row_seeds = None if rows is None else [t.traj_id for t in rows]
        chunk = cfg.sampler_batch_size or len(prompts)
        outs = []
        for i in range(0, len(prompts), chunk):  # chunks bound the KV cache of one call
            budgets = max_new_tokens[i:i + chunk] if isinstance(max_new_tokens, list) else max_new_tokens
            outs += self.sampler.generate(prompts[i:i + chunk], max_new_tokens=budgets, temperature=cfg.temperature,
                                          top_p=cfg.top_p, top_k=cfg.top_k, stop_token_ids=self.builder.stop_ids,
                                          seed=seed, row_seeds=None if row_seeds is None else row_seeds[i:i + chunk])
            self.stats.sampler_calls += 1
        self.stats.sampler_seconds += time.perf_counter() - t0
        results = []
        for i, o in enumerate(outs):
            limit = max_new_tokens[i] if isinstance(max_new_tokens, list) else budget
            tokens, logprobs, reason = list(o.tokens), list(o.logprobs), o.finish_reason
            if len(tokens) > limit:
                tokens, logprobs, reason = tokens[:limit], logprobs[:limit], "length"
            self.stats.generated_tokens += len(tokens)
            results.append((tokens, logprobs, reason))
        return results

    def run(self, questions: Sequence[dict], group_size: int = 1, seed: int = 0,
            first_group_id: int = 0, first_traj_id: int = 0) -> list[Trajectory]:
        """questions: dicts with "question" and "golden_answers". Returns B * G trajectories,
        trajectory i*G..i*G+G-1 (ids first_traj_id + i*G + g) forming group first_group_id + i.

        A trajectory's samples depend on (seed, its traj_id) only, so a host that runs a slice
        of a batch with the slice's global first_traj_id / first_group_id produces exactly the
        trajectories the whole batch run in one call would."""
        trajs = []
        for qi, q in enumerate(questions):
            for g in range(group_size):
                trajs.append(Trajectory(traj_id=first_traj_id + len(trajs), group_id=first_group_id + qi,
                                        question=q["question"], golds=list(q.get("golden_answers", []))))
        if self.config.workflow == "memsearcher":
            self._run_memsearcher(trajs, seed)
        else:
            self._run_react(trajs, seed)
        return trajs

    # ------------------------------------------------------------------ the act call, shared
    def _act(self, rows: list[Trajectory], prompts: list[list[int]], budgets: list[int], seed: int):
        """One batched act call: record each completion on its row, end the rows that answered,
        stopped illegally or wrote no valid act. Returns (rows that search, their parsed calls)."""
        cfg, b = self.config, self.builder
        searching, calls = [], []
        for t, (tokens, logprobs, reason) in zip(rows, self._generate(prompts, budgets, seed=seed, rows=rows)):
            conv = t.final
            conv.add_generated(tokens, logprobs)
            conv.blocks.append(b.decode_act(tokens))
            conv.ended_with_eos = b.ends_turn(tokens, reason)
            if not conv.ended_with_eos:
                t.finish("length" if reason == "length" else "illegal_stop")
                continue
            kind = classify_act(conv.blocks[-1])
            if kind == ActKind.ANSWER:
                t.finish("answer")
            elif kind == ActKind.INVALID:
                t.finish("invalid_act")
            else:
                searching.append(t)
                # The same text classify_act judged: calls outside every thinking span.
                calls.append(parse_tool_calls(outside_think(conv.blocks[-1]),
                                              default_top_n=cfg.missing_top_n or cfg.default_top_n,
                                              max_top_n=cfg.max_top_n, tool=b.tool))
        return searching, calls

    # ------------------------------------------------------------------ MemSearcher
    def _run_memsearcher(self, trajs: list[Trajectory], seed: int):
        cfg, b = self.config, self.builder
        for turn in range(cfg.max_turns):
            live = [t for t in trajs if not t.done]
            if not live:
                break
            for t in live:
                ctx = b.memsearcher_context(t.question, t.memory)
                t.conversations.append(Conversation(prompt_ids=ctx, traj_id=t.traj_id, group_id=t.group_id, turn=turn))
                t.context_tokens.append(len(ctx))
            budgets = [max(1, min(cfg.max_new_tokens, cfg.max_context_tokens - len(t.final.prompt_ids),
                                  cfg.max_response_tokens)) for t in live]
            searching, calls = self._act(live, [t.final.prompt_ids for t in live], budgets,
                                         seed=_seed(seed, turn, 0))
            if not searching:
                continue
            results = _run_searches(self.retriever, calls, self.stats)
            update_rows, update_prompts, update_budgets = [], [], []
            for t, row_calls, row_results in zip(searching, calls, results):
                t.num_searches += len(row_calls)
                conv = t.final
                conv.add_injected(b.observation(row_results, cfg.max_observation_tokens))
                room = min(cfg.max_new_tokens, cfg.max_response_tokens - len(conv.response_ids),
                           cfg.max_context_tokens - len(conv.prompt_ids) - len(conv.response_ids))
                if room < 1:
                    t.finish("response_budget")
                    continue
                update_rows.append(t)
                update_prompts.append(conv.prompt_ids + conv.response_ids)
                update_budgets.append(room)
            if not update_rows:
                continue
            updates = self._generate(update_prompts, update_budgets, seed=_seed(seed, turn, 1), rows=update_rows)
            for t, (tokens, logprobs, reason) in zip(update_rows, updates):
                conv = t.final
                conv.add_generated(tokens, logprobs)
                text = b.decode_update(tokens)
                conv.blocks.append(text)
                conv.ended_with_eos = b.ends_turn(tokens, reason)
                memory = extract_memory(text)
                if not conv.ended_with_eos:
                    t.finish("length" if reason == "length" else "illegal_stop")
                elif memory is None:
                    t.finish("no_memory")
                elif (n_memory := b.memory_tokens(memory)) > cfg.memory_budget:
                    t.finish("memory_over_budget")
                else:
                    t.memory = memory
                    t.memories.append(memory)
                    t.memory_tokens.append(n_memory)
        for t in trajs:
            if not t.done:
                t.finish("max_turns")

    # ------------------------------------------------------------------ ReAct baseline
    def _run_react(self, trajs: list[Trajectory], seed: int):
        cfg, b = self.config, self.builder
        for t in trajs:
            t.conversations.append(Conversation(prompt_ids=b.react_context(t.question), traj_id=t.traj_id,
                                                group_id=t.group_id, turn=0))
        for turn in range(cfg.max_turns):
            live = [t for t in trajs if not t.done]
            if not live:
                break
            budgets = []
            for t in live:
                conv = t.final
                t.context_tokens.append(len(conv.prompt_ids) + len(conv.response_ids))
                budgets.append(min(cfg.max_new_tokens, cfg.max_response_tokens - len(conv.response_ids),
                                   cfg.max_context_tokens - t.context_tokens[-1]))
            runnable = [(t, n) for t, n in zip(live, budgets) if n >= 1]
            for t, n in zip(live, budgets):
                if n < 1:
                    t.finish("response_budget")
            if not runnable:
                break
            searching, calls = self._act([t for t, _ in runnable],
                                         [t.final.prompt_ids + t.final.response_ids for t, _ in runnable],
                                         [n for _, n in runnable], seed=_seed(seed, turn, 0))
            if searching:
                results = _run_searches(self.retriever, calls, self.stats)
                for t, row_calls, row_results in zip(searching, calls, results):
                    t.num_searches += len(row_calls)
                    t.final.add_injected(b.react_observation(row_results, cfg.max_observation_tokens))
        for t in trajs:
            if not t.done:
                t.finish("max_turns")


def _seed(seed: int, turn: int, phase: int) -> int:
    """A distinct, reproducible sampler seed per (step seed, turn, act/update phase)."""
    return (seed * 1_000_003 + turn * 7919 + phase * 104_729) % (2 ** 31 - 1)

