"""Scripted demonstrations on the synthetic world, as rollout-identical token rows.

A demonstration is what the agent loop (`agent.rollout.AgentRunner`) would record if the model
had generated the scripted text. In the MemSearcher workflow: one `Conversation` per turn with
    prompt   = builder.memsearcher_context(question, memory)
    response = act tokens (mask 1) + builder.observation(BM25 hits) (mask 0) + update tokens (mask 1)
and a final act `...</think>\\n\\boxed{answer}<|im_end|>`. In the ReAct workflow (the baseline,
`DemoConfig.react_share`): ONE growing conversation with
    prompt   = builder.react_context(question)
    response = act (mask 1) + builder.react_observation(hits) (mask 0) + act (mask 1) + ... + final act
Both formats come from the same script (same searches, flaws and answers for a given seed and
row); only the recording differs, and the ReAct recording keeps no memory. Supervised warm-up on
these rows teaches exactly the format the loop parses (tests replay them through `AgentRunner`).

Script per question (state machine over the hops whose fact is not yet in memory):
    turn k: think briefly, search the query of the first unfound hop; the memory update keeps
            every supporting sentence found so far in the retrieved documents;
    last:   once all hops are found, answer `\\boxed{answer}`.
Deliberate flaws (seeded, at most one per demo, so GRPO has something to improve):
    vague_query   the first search is vague or about the wrong entity; a recovery search follows
    wrong_answer  every hop is searched but the boxed answer is wrong
    early_answer  answers (wrongly) before every hop is found: 1-hop with no search at all,
                  2-hop right after the first hop (boxing the bridge entity)
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from memsearcher_jax.agent.parsing import ActKind, classify_act, extract_memory
from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.agent.rollout import Conversation, Trajectory
from memsearcher_jax.qa_metrics import compute_reward, normalize_answer, token_f1

FLAWS = ("vague_query", "wrong_answer", "early_answer")

# Kept to a few tokens each: the model is tiny and every token is context.
THINK_SEARCH = "I need to search."
THINK_NEXT = "Next search {e}."
THINK_RETRY = "Not found. Search again."
THINK_ANSWER = "The memory has the answer."
THINK_GUESS = "I know the answer."
EMPTY_MEMORY = "Nothing found about {s} yet."


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    vague_query_rate: float = 0.15
    wrong_answer_rate: float = 0.1
    early_answer_rate: float = 0.1
    # Share of 2-hop demos that stop after the first hop (boxing the bridge entity), drawn apart
    # from the rates above. Above 0.5 the stop is the demonstrator's habit, so the warm-started
    # policy's greedy choice too: a mistake only reward can correct (SFT would copy it).
    two_hop_early_rate: float = 0.0
    top_n: int = 3          # written into each tool call; fewer documents keep the context small
    max_turns: int = 5      # the agent's turn limit; every demo must fit in it
    # Share of demos recorded in the ReAct workflow's format instead of MemSearcher's, drawn per
    # row apart from the flaws (0: all MemSearcher, 1: all ReAct). A model meant to run both
    # workflows (bench/context.py) needs demos of both.
    react_share: float = 0.0

    def __post_init__(self):
        rates = (self.vague_query_rate, self.wrong_answer_rate, self.early_answer_rate)
        if any(r < 0 for r in rates) or sum(rates) > 1:
            raise ValueError(f"flaw rates must be >= 0 and sum to <= 1, got {rates}")
        if not 0 <= self.two_hop_early_rate <= 1:
            raise ValueError(f"two_hop_early_rate must be in [0, 1], got {self.two_hop_early_rate}")
        if not 0 <= self.react_share <= 1:
            raise ValueError(f"react_share must be in [0, 1], got {self.react_share}")
        if self.top_n < 1:
            raise ValueError(f"top_n must be >= 1, got {self.top_n}")
        if self.max_turns < 4:  # 2 hops + a recovery search + the answer
            raise ValueError(f"max_turns must be >= 4 for the scripts, got {self.max_turns}")


@dataclasses.dataclass
class Demonstration:
    """A scripted episode: the trajectory (rows as the rollout builds them) and what was intended."""

    trajectory: Trajectory
    row: dict
    flaw: str | None                 # one of FLAWS or None for a clean demo
    act_kinds: list[ActKind]         # intended kind of each turn's act
    memories: list[str]              # intended memory after each searching turn (ReAct: none kept, [])
    answer: str                      # the boxed answer
    workflow: str = "memsearcher"    # the recording format: "memsearcher" or "react"

    @property
    def correct(self) -> bool:
        """Whether the scripted answer is a gold answer (reward 1.0 expected)."""
        return self.flaw not in ("wrong_answer", "early_answer")

    @property
    def conversations(self) -> list[Conversation]:
        return self.trajectory.conversations


def _wrong_answer_pool(rows: Sequence[dict]) -> dict[str, list[str]]:
    """First gold answer of every row, by relation: wrong answers of the right type."""
    pool: dict[str, list[str]] = {}
    for r in rows:
        pool.setdefault(r["relation"], [])
        if r["golden_answers"][0] not in pool[r["relation"]]:
            pool[r["relation"]].append(r["golden_answers"][0])
    return pool


def _pick_wrong(rng: random.Random, candidates: Sequence[str], golds: Sequence[str]) -> str:
    """A candidate with zero token F1 against every gold; falls back to a fixed non-answer."""
    options = [c for c in candidates if token_f1(c, golds) == 0.0 and normalize_answer(c)]
    return rng.choice(options) if options else "unknown"


def _vague_query(rng: random.Random, row: dict, all_rows: Sequence[dict]) -> str:
    """Either the hop-1 query without its entity name, or the same relation about another entity."""
    q = row["queries"][0]
    if rng.random() < 0.5:
        words = [w for w in q.split() if w != row["subject"]]
        if words:
            return " ".join(words)
    others = [r for r in all_rows if r["subject"] != row["subject"]]
    other = rng.choice(others) if others else row
    return q.replace(row["subject"], other["subject"]) if other is not row else "information"


class _Builder:
    """Appends scripted turns to a trajectory exactly as AgentRunner's memsearcher workflow records them."""

    def __init__(self, builder: PromptBuilder, traj: Trajectory):
        self.b, self.t = builder, traj

    def _enc(self, text: str) -> list[int]:
        return self.b._enc(text) + [self.b.eos_id]

    def new_turn(self) -> Conversation:
        conv = Conversation(prompt_ids=self.b.memsearcher_context(self.t.question, self.t.memory),
                            traj_id=self.t.traj_id, group_id=self.t.group_id, turn=len(self.t.conversations))
        self.t.conversations.append(conv)
        self.t.context_tokens.append(len(conv.prompt_ids))
        return conv

    def act(self, conv: Conversation, text_after_think: str):
        ids = self._enc(text_after_think)
        conv.add_generated(ids, [0.0] * len(ids))
        conv.blocks.append(self.b.decode_act(ids))
        conv.ended_with_eos = True

    def observe_and_update(self, conv: Conversation, hits, memory: str):
        conv.add_injected(self.b.observation([hits]))
        ids = self._enc(f"<memory>{memory}</memory>")
        conv.add_generated(ids, [0.0] * len(ids))
        conv.blocks.append(self.b.decode_update(ids))
        conv.ended_with_eos = True
        self.t.memory = memory
        self.t.memories.append(memory)
        self.t.num_searches += 1


class _ReactBuilder(_Builder):
    """The same scripted turns as AgentRunner's react workflow records them: one conversation,
    each act appended (mask 1), each observation appended (mask 0), no memory update."""

    def new_turn(self) -> Conversation:
        if not self.t.conversations:
            self.t.conversations.append(Conversation(prompt_ids=self.b.react_context(self.t.question),
                                                     traj_id=self.t.traj_id, group_id=self.t.group_id, turn=0))
        conv = self.t.final
        self.t.context_tokens.append(len(conv.prompt_ids) + len(conv.response_ids))
        return conv

    def observe_and_update(self, conv: Conversation, hits, memory: str):
        conv.add_injected(self.b.react_observation([hits]))
        self.t.num_searches += 1


def make_demonstrations(world_rows: Sequence[dict], builder: PromptBuilder, retriever, seed: int = 0,
                        config: DemoConfig | None = None) -> list[Demonstration]:
    """One scripted demonstration per question row (synthetic-world rows with `queries`, `facts`).

    The retriever is searched for real (one batched call per script step), so observations are
    what the agent would see; memories only keep supporting sentences that the hits contain.
    A share `config.react_share` of the demos (drawn per row, apart from the flaws) is recorded
    in the ReAct workflow's format; which format a row gets changes nothing else about its demo.
    """
    cfg = config or DemoConfig()
    pool = _wrong_answer_pool(world_rows)
    demos: list[Demonstration] = []
    for i, row in enumerate(world_rows):
        for key in ("question", "golden_answers", "hops", "facts", "queries", "relation", "subject"):
            if key not in row:
                raise ValueError(f"row {i} ({row.get('id', '?')}) lacks {key!r}; expected a synthetic-world "
                                 "question row")
        # One generator per row: demo i depends only on (seed, i, row), not on the other rows.
        rng = random.Random(f"{seed}:{i}")
        u = rng.random()
        flaw = None
        edges = [cfg.vague_query_rate, cfg.vague_query_rate + cfg.wrong_answer_rate,
                 cfg.vague_query_rate + cfg.wrong_answer_rate + cfg.early_answer_rate]
        for name, edge in zip(FLAWS, edges):
            if u < edge:
                flaw = name
                break
        if cfg.two_hop_early_rate > 0 and int(row["hops"]) == 2:
            early = rng.random() < cfg.two_hop_early_rate
            flaw = "early_answer" if early else (None if flaw == "early_answer" else flaw)
        # The format draw has its own generator, so the script (and its rng) is the same either way.
        react = cfg.react_share > 0 and random.Random(f"{seed}:{i}:workflow").random() < cfg.react_share
        demos.append(_script(row, i, flaw, builder, retriever, rng, pool, world_rows, cfg,
                             workflow="react" if react else "memsearcher"))
    return demos


def _script(row, idx, flaw, builder, retriever, rng, pool, all_rows, cfg: DemoConfig,
            workflow: str = "memsearcher") -> Demonstration:
    traj = Trajectory(traj_id=idx, group_id=idx, question=row["question"], golds=list(row["golden_answers"]))
    tb = (_ReactBuilder if workflow == "react" else _Builder)(builder, traj)
    hops, facts = int(row["hops"]), list(row["facts"])
    found: list[str] = []       # supporting sentences in memory, hop order
    kinds: list[ActKind] = []
    memories: list[str] = []
    vague_pending = flaw == "vague_query"
    answer = None
    for _ in range(cfg.max_turns):
        conv = tb.new_turn()
        n_found = len(found)
        early = flaw == "early_answer" and n_found == hops - 1
        if n_found == hops or early:
            if flaw in ("wrong_answer", "early_answer"):
                # An early 2-hop answer boxes the bridge entity: the classic stop-one-hop-short error.
                cands = [row["intermediate"]] if early and row.get("intermediate") else pool.get(row["relation"], [])
                answer = _pick_wrong(rng, cands, row["golden_answers"])
                if answer == "unknown" and early:
                    answer = _pick_wrong(rng, pool.get(row["relation"], []), row["golden_answers"])
            else:
                answer = row["golden_answers"][0]
            think = THINK_GUESS if early and n_found == 0 else THINK_ANSWER
            tb.act(conv, f"{think}</think>\n\\boxed{{{answer}}}")
            kinds.append(ActKind.ANSWER)
            traj.finish("answer")
            break
        if vague_pending:
            query, think = _vague_query(rng, row, all_rows), THINK_SEARCH
        else:
            query = row["queries"][n_found]
            think = THINK_SEARCH if n_found == 0 and not kinds else (
                THINK_RETRY if n_found == 0 else THINK_NEXT.format(e=row["intermediate"]))
        tb.act(conv, f"{think}</think>\n{builder.tool.call_text(query, cfg.top_n)}")
        kinds.append(ActKind.TOOL_CALLS)
        hits = retriever.search([query], cfg.top_n)[0][: cfg.top_n]
        text = " ".join(h.contents for h in hits)
        new_fact = facts[n_found] if facts[n_found] in text else None
        if new_fact is not None:
            found.append(new_fact)
        elif not vague_pending:
            raise RuntimeError(f"row {row.get('id', idx)}: query {query!r} did not retrieve the hop-{n_found + 1} "
                               f"fact {facts[n_found]!r}; the world's queries must retrieve their passages")
        vague_pending = False
        memory = " ".join(found) if found else EMPTY_MEMORY.format(s=row["subject"])
        tb.observe_and_update(conv, hits, memory)
        memories.append(memory)
    else:
        raise RuntimeError(f"row {row.get('id', idx)}: script did not answer within {cfg.max_turns} turns")
    if workflow == "react":
        memories = []  # the ReAct workflow keeps no memory; the script's notes are not recorded
    return Demonstration(trajectory=traj, row=row, flaw=flaw, act_kinds=kinds, memories=memories, answer=answer,
                         workflow=workflow)


def check_demonstration(demo: Demonstration, builder: PromptBuilder) -> list[str]:
    """Problems with a demonstration (empty list = parses as intended).

    Checks every act classifies as intended, masks align (1 on acts and updates, 0 on one
    observation span after each searching act), and the final reward is 1.0 for a correct demo
    and 0.1 (format credit, F1 = 0) for a wrong-answer demo. MemSearcher demos: prompts are
    rebuilt from the previous memory and every update's memory is extracted as scripted. ReAct
    demos: one conversation on react_context(question), each observation a tool-response
    message that re-opens `<think>`, and the recorded context length of every act call.
    """
    t = demo.trajectory
    if demo.workflow == "react":
        problems = _check_react(demo, builder)
    elif demo.workflow == "memsearcher":
        problems = _check_memsearcher(demo, builder)
    else:
        return [f"unknown workflow {demo.workflow!r}"]
    if not t.conversations:
        return problems + ["no conversations"]
    final = t.final
    if not final.is_final or any(c.is_final for c in t.conversations[:-1]):
        problems.append("is_final must be set on the last conversation only")
    if t.num_searches != demo.act_kinds.count(ActKind.TOOL_CALLS):
        problems.append(f"num_searches {t.num_searches} but {demo.act_kinds.count(ActKind.TOOL_CALLS)} searching acts")
    res = compute_reward(final.blocks, final.ended_with_eos, t.golds)
    if demo.correct and res.reward != 1.0:
        problems.append(f"correct demo has reward {res.reward} ({res.failure or res.answer!r})")
    if not demo.correct and not (res.format_ok and res.reward == 0.1):
        problems.append(f"wrong-answer demo should get the 0.1 format credit, got {res.reward} ({res.failure})")
    return problems


def _act_end(conv: Conversation, builder: PromptBuilder, start: int) -> int | None:
    """Where the act starting at `start` ends: just past its first <|im_end|>."""
    try:
        return conv.response_ids.index(builder.eos_id, start) + 1
    except ValueError:
        return None


def _check_memsearcher(demo: Demonstration, builder: PromptBuilder) -> list[str]:
    problems = []
    t = demo.trajectory
    if len(t.conversations) != len(demo.act_kinds):
        problems.append(f"{len(t.conversations)} conversations but {len(demo.act_kinds)} intended acts")
    memory, mem_iter = "", iter(demo.memories)
    for k, (conv, kind) in enumerate(zip(t.conversations, demo.act_kinds)):
        where = f"turn {k}"
        if conv.prompt_ids != builder.memsearcher_context(t.question, memory):
            problems.append(f"{where}: prompt is not memsearcher_context(question, previous memory)")
        if not (len(conv.response_ids) == len(conv.loss_mask) == len(conv.sampler_logprobs)):
            problems.append(f"{where}: response_ids, loss_mask and sampler_logprobs differ in length")
        # Split the response where the rollout would: the act ends at its first <|im_end|>.
        act_end = _act_end(conv, builder, 0)
        if act_end is None:
            problems.append(f"{where}: act has no end-of-turn token")
            continue
        got = classify_act(builder.decode_act(conv.response_ids[:act_end]))
        if got != kind:
            problems.append(f"{where}: act classifies as {got.value}, intended {kind.value}")
        if any(m != 1 for m in conv.loss_mask[:act_end]):
            problems.append(f"{where}: act tokens not all in the loss mask")
        if kind == ActKind.TOOL_CALLS:
            expected_mem = next(mem_iter, None)
            zeros = [j for j, m in enumerate(conv.loss_mask) if m == 0]
            if not zeros or zeros[0] != act_end or zeros[-1] - zeros[0] + 1 != len(zeros):
                problems.append(f"{where}: the observation is not one masked span right after the act")
                continue
            update = conv.response_ids[zeros[-1] + 1:]
            mem = extract_memory(builder.decode_update(update))
            if mem is None or mem != expected_mem:
                problems.append(f"{where}: extract_memory gives {mem!r}, scripted {expected_mem!r}")
            if not update or update[-1] != builder.eos_id:
                problems.append(f"{where}: memory update does not end with the end-of-turn token")
            memory = mem or ""
        elif len(conv.response_ids) != act_end:
            problems.append(f"{where}: answer turn has tokens after its act")
    return problems


def _check_react(demo: Demonstration, builder: PromptBuilder) -> list[str]:
    problems = []
    t = demo.trajectory
    if len(t.conversations) != 1:
        return [f"a ReAct demo is one conversation, got {len(t.conversations)}"]
    conv = t.final
    if conv.prompt_ids != builder.react_context(t.question):
        problems.append("prompt is not react_context(question)")
    if not (len(conv.response_ids) == len(conv.loss_mask) == len(conv.sampler_logprobs)):
        return problems + ["response_ids, loss_mask and sampler_logprobs differ in length"]
    if demo.memories or t.memories:
        problems.append("a ReAct demo keeps no memory")
    if len(t.context_tokens) != len(demo.act_kinds):
        problems.append(f"{len(t.context_tokens)} recorded context lengths but {len(demo.act_kinds)} intended acts")
    # An observation is a user message of tool responses that hands the turn back with <think>.
    obs_head = [*builder._obs_user_header, builder.tool_response_open_id]
    obs_tail = [*builder._turn_end_newline, *builder._assistant_header, builder.think_id]
    pos = 0
    for k, kind in enumerate(demo.act_kinds):
        where = f"act {k}"
        if k < len(t.context_tokens) and t.context_tokens[k] != len(conv.prompt_ids) + pos:
            problems.append(f"{where}: recorded context {t.context_tokens[k]} tokens, the act's prefix has "
                            f"{len(conv.prompt_ids) + pos}")
        end = _act_end(conv, builder, pos)
        if end is None:
            problems.append(f"{where}: act has no end-of-turn token")
            return problems
        got = classify_act(builder.decode_act(conv.response_ids[pos:end]))
        if got != kind:
            problems.append(f"{where}: act classifies as {got.value}, intended {kind.value}")
        if any(m != 1 for m in conv.loss_mask[pos:end]):
            problems.append(f"{where}: act tokens not all in the loss mask")
        pos = end
        if kind == ActKind.TOOL_CALLS:
            obs_end = pos
            while obs_end < len(conv.loss_mask) and conv.loss_mask[obs_end] == 0:
                obs_end += 1
            obs = conv.response_ids[pos:obs_end]
            if (len(obs) < len(obs_head) + len(obs_tail) or obs[:len(obs_head)] != obs_head
                    or obs[-len(obs_tail):] != obs_tail):
                problems.append(f"{where}: no masked tool-response observation (ending in the <think> "
                                f"pre-fill) right after the act")
            pos = obs_end
    if pos != len(conv.response_ids):
        problems.append(f"{len(conv.response_ids) - pos} response tokens after the final act")
    if len(conv.blocks) != len(demo.act_kinds):
        problems.append(f"{len(conv.blocks)} decoded blocks but {len(demo.act_kinds)} acts")
    return problems


def demo_conversations(demos: Sequence[Demonstration]) -> list[Conversation]:
    return [c for d in demos for c in d.conversations]


def demo_stats(demos: Sequence[Demonstration]) -> dict:
    """Token counts per conversation (prompt + response) and flaw fractions, for reports."""
    lens = [len(c.prompt_ids) + len(c.response_ids) for c in demo_conversations(demos)]
    n = max(1, len(demos))
    return {
        "demos": len(demos), "conversations": len(lens),
        "mean_tokens": sum(lens) / max(1, len(lens)), "max_tokens": max(lens, default=0),
        "trained_tokens": sum(sum(c.loss_mask) for c in demo_conversations(demos)),
        **{f"frac_{f}": sum(d.flaw == f for d in demos) / n for f in FLAWS},
        "frac_react": sum(d.workflow == "react" for d in demos) / n,
    }
