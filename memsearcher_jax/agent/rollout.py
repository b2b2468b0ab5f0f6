"""The batched turn loop, shared by every workflow (agent/workflows/), over many trajectories at once.

One turn, for every live trajectory together (docs/method.md §1):
  1. act:     one sampler call for all live rows; each row's context is what its workflow built
              (memsearcher: system + question + memory m_{t-1}; react: the whole history so far;
              mem1: question + last act + last observation; memory_ops: question + entry bank)
  2. observe: every tool call of every row in ONE batched retriever call (host side), at most
              agent.max_searches_per_act of an act (one note refuses the rest); the workflow places
              the observation, held to its cap (workflows.base.observation_cap)
  3. second:  for workflows that have one (memsearcher's memory update, memory_ops' operations),
              one sampler call for all rows that searched; the workflow reads what it carries
Each conversation is one training row: prompt = context, response = generated tokens (loss
mask 1) and injected observations (mask 0). Every call's prompt and output sizes are recorded
on the trajectory (`Trajectory.calls`, `peak_tokens`, `tokens_processed`).
"""
from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from typing import Protocol

# AgentConfig, Conversation, Trajectory and CallRecord are re-exported: callers import them from here.
from memsearcher_jax.agent.config import AgentConfig
from memsearcher_jax.agent.parsing import ActKind, classify_act, outside_think, parse_tool_calls
from memsearcher_jax.agent.prompts import PromptBuilder, refused_searches
from memsearcher_jax.agent.trajectory import ACT, SECOND, CallRecord, Conversation, Trajectory  # noqa: F401
from memsearcher_jax.agent.workflows import Workflow, get_workflow
from retrieval.base import ERROR_HIT_ID, Hit, Retriever


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
class RolloutStats:
    """Counts of one training step's rollout (the trainer starts a new one every step)."""

    sampler_seconds: float = 0.0
    retrieval_seconds: float = 0.0
    generated_tokens: int = 0
    sampler_calls: int = 0
    retriever_calls: int = 0
    searches: int = 0                   # non-empty queries sent to the retriever
    search_errors: int = 0              # of those, answered with an error hit (the retriever failed)
    refused_searches: int = 0           # calls over agent.max_searches_per_act: refused, never sent
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
            for _ in range(group_size):
                trajs.append(Trajectory(traj_id=first_traj_id + len(trajs), group_id=first_group_id + qi,
                                        question=q["question"], golds=list(q.get("golden_answers", [])),
                                        objectives=[o["question"] for o in q.get("objectives", [q])],
                                        max_turns=self.config.episode_turns(len(q.get("objectives", [q]))),
                                        subjects=[o.get("subject") for o in q.get("objectives", [q])]))
        self._run(get_workflow(self.config.workflow), trajs, seed)
        return trajs

    def _run(self, wf: Workflow, trajs: list[Trajectory], seed: int):
        cfg, b = self.config, self.builder
        for t in trajs:
            t.max_turns = t.max_turns or cfg.max_turns  # a trajectory made elsewhere: the config's budget
            wf.start(t, b, cfg)
        # Each episode's own budget (AgentConfig.episode_turns: max_turns unless turns_per_question is set).
        for turn in range(max((t.max_turns for t in trajs), default=0)):
            for t in trajs:
                if not t.done and turn >= t.max_turns:
                    t.finish("max_turns")
            live = [t for t in trajs if not t.done]
            if not live:
                break
            runnable, budgets = [], []
            for t in live:
                wf.open_turn(t, turn, b, cfg)
                t.carried.append((len(t.conversations) - 1, *wf.carried_span(t, b, cfg)))
                n = wf.act_budget(t, cfg)
                if n < 1:
                    t.finish("response_budget")
                else:
                    runnable.append(t)
                    budgets.append(n)
            if not runnable:
                break
            prompts = [t.final.prompt_ids + t.final.response_ids for t in runnable]
            searching, calls, refused = self._act(runnable, prompts, budgets, seed=_seed(seed, turn, 0), turn=turn)
            if not searching:
                continue
            results = _run_searches(self.retriever, calls, self.stats)
            second = []
            for t, row_calls, row_results, extra in zip(searching, calls, results, refused):
                t.record_searches([c.query for c in row_calls], row_results)
                if extra:  # the calls over the limit: one refusal, where their responses would be
                    row_results = [*row_results, refused_searches(extra, cfg.max_searches_per_act)]
                wf.observe(t, row_results, b, cfg)
                if wf.second_call:
                    second.append(t)
            if second:
                self._second(wf, second, seed=_seed(seed, turn, 1), turn=turn)
        for t in trajs:
            if not t.done:
                t.finish("max_turns")

    # ------------------------------------------------------------------ the two calls of a turn
    def _act(self, rows: list[Trajectory], prompts: list[list[int]], budgets: list[int], seed: int, turn: int = 0):
        """One batched act call: record each completion on its row, end the rows that answered,
        stopped illegally or wrote no valid act. Returns (rows that search, their parsed calls up to
        agent.max_searches_per_act, how many more each row's act made: refused)."""
        cfg, b = self.config, self.builder
        searching, calls, refused = [], [], []
        for t, p, (tokens, logprobs, reason) in zip(rows, prompts,
                                                    self._generate(prompts, budgets, seed=seed, rows=rows)):
            t.record_call(ACT, turn, len(p), len(tokens))
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
                row_calls = parse_tool_calls(outside_think(conv.blocks[-1]),
                                             default_top_n=cfg.missing_top_n or cfg.default_top_n,
                                             max_top_n=cfg.max_top_n, tool=b.tool)
                calls.append(row_calls[:cfg.max_searches_per_act])
                refused.append(len(row_calls) - len(calls[-1]))
                t.refused_searches += refused[-1]
                self.stats.refused_searches += refused[-1]
        return searching, calls, refused

    def _second(self, wf: Workflow, rows: list[Trajectory], seed: int, turn: int):
        """One batched second call (memory update, operations) on each row's conversation so far."""
        cfg, b = self.config, self.builder
        go, prompts, budgets = [], [], []
        for t in rows:
            conv = t.final
            room = min(cfg.max_new_tokens, cfg.max_response_tokens - len(conv.response_ids),
                       cfg.max_context_tokens - len(conv.prompt_ids) - len(conv.response_ids))
            if room < 1:
                t.finish("response_budget")
                continue
            go.append(t)
            prompts.append(conv.prompt_ids + conv.response_ids)
            budgets.append(room)
        if not go:
            return
        for t, p, (tokens, logprobs, reason) in zip(go, prompts, self._generate(prompts, budgets, seed=seed, rows=go)):
            t.record_call(SECOND, turn, len(p), len(tokens))
            conv = t.final
            conv.add_generated(tokens, logprobs)
            text = b.decode_update(tokens)
            conv.blocks.append(text)
            conv.ended_with_eos = b.ends_turn(tokens, reason)
            if not conv.ended_with_eos:
                t.finish("length" if reason == "length" else "illegal_stop")
            else:
                wf.after_second(t, text, b, cfg)


def _seed(seed: int, turn: int, phase: int) -> int:
    """A distinct, reproducible sampler seed per (step seed, turn, act/update phase)."""
    return (seed * 1_000_003 + turn * 7919 + phase * 104_729) % (2 ** 31 - 1)

