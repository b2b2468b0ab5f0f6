"""The reading curriculum: endless training rows that teach a tiny model to read and copy.

Every row is drawn from a fresh random world (`synthetic.generate_world`) whose entities take
names from the reading vocabulary's **pretrain** pool only (`data.vocab`), so facts never
repeat across worlds: the only way to lower the loss is to read them from the context. Kinds
of row, mixed by `CurriculumConfig.mix` (a phase's `mix`, `phases.py`):

- `repeat`: a random run of names and values, then the same run again; loss on the second
  copy, every token of which is the one after the previous occurrence of the token before it
  (the induction pattern that copying from context is built on).
- `recall`: associative-recall drill. `k1 v1 ; k2 v2 ; ... \\n k3 v3 ; k1 v1 ...` over random
  single-token names and values; loss on the values of the second list (each key's value is
  somewhere in the first).
- `cloze`: retrieved passages exactly as the agent sees them (`<tool_response>` blocks), then
  several `<question> q </question>\\n\\boxed{a}` pairs about them; loss on the answers.
  1-hop questions read one passage; a 2-hop one reads both of its passages.
- `demo`: correct MemSearcher episodes recorded as the rollout records them (`data.demos`,
  no flaws, real BM25 over the world): copying the question's entity into a query, the
  retrieved facts into a memory, and the answer out of the memory. Loss on generated tokens.
- `long`, `bind`, `multi`: up to 16 passages with the asked one anywhere (`long_row`), several
  entities of one type asked one relation (`bind_row`), two questions in one ask (`long_row`).
- `probe` (not trained on): the cloze format with one question, used by `probes.py`.

    curriculum = Curriculum(vocab, builder, CurriculumConfig(seed=0))
    rows = curriculum.rows_for_step(step, 64)   # prompt_ids, response_ids, loss_mask (sft.build_rows)
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from memsearcher_jax.agent.prompts import PromptBuilder, format_hits
from memsearcher_jax.agent.workflows import recorded_workflows
from memsearcher_jax.data.demos import DemoConfig, demo_conversations, make_demonstrations
from memsearcher_jax.data.synthetic import ONE_HOP, generate_world, join_objectives
from memsearcher_jax.data.vocab import ReadingVocab
from retrieval.base import Hit
from retrieval.bm25 import BM25Retriever

KINDS = ("repeat", "recall", "cloze", "demo", "long", "bind", "multi")


@dataclasses.dataclass(frozen=True)
class CurriculumConfig:
    seed: int = 0
    mix: tuple[tuple[str, float], ...] = (("repeat", 0.3), ("recall", 0.2), ("cloze", 0.3), ("demo", 0.2))
    world_entities: int = 30        # entities per random world (people, cities, companies)
    rows_per_world: int = 32        # rows drawn from one world before a new one is made
    recall_pairs: tuple[int, int] = (4, 16)   # pairs per recall drill (inclusive range)
    repeat_tokens: tuple[int, int] = (16, 48)  # tokens in the run a repeat drill copies
    cloze_passages: tuple[int, int] = (2, 3)  # passages shown per cloze row
    cloze_questions: int = 4        # questions per cloze row
    top_n: int = 2                  # passages per search in demos (the agent's default_top_n)
    max_turns: int = 4
    max_len: int = 512              # longer rows are dropped (their conversation is redrawn)
    long_passages: tuple[int, int] = (4, 16)  # passages per `long`, `bind` and `multi` row (16: ~900 tokens)
    bind_entities: tuple[int, int] = (2, 8)   # same-type entities per `bind` row (capped by the world's count)
    # `demo` episodes: the workflow formats recorded and the objective counts asked, in equal
    # shares of episodes (every (workflow, objectives) pair in turn from a random start per
    # world). The default, memsearcher alone at one objective, keeps the first base's rows.
    demo_workflows: tuple[str, ...] = ("memsearcher",)
    demo_objectives: tuple[int, ...] = (1,)
    # Weight of the name-copy targets in context rows (cloze, long, bind, multi): every name token
    # of the passages and questions that already appeared earlier in the row is predicted too, at
    # this weight beside the answers' 1 (0: answers only, the first base's rows).
    name_copy: float = 0.0

    def __post_init__(self):
        names = [k for k, _ in self.mix]
        if not names or any(k not in KINDS for k in names) or any(w < 0 for _, w in self.mix):
            raise ValueError(f"mix must be (kind, weight >= 0) pairs over {KINDS}, got {self.mix}")
        if sum(w for _, w in self.mix) <= 0:
            raise ValueError(f"mix weights must not all be 0, got {self.mix}")
        if not 1 <= self.recall_pairs[0] <= self.recall_pairs[1]:
            raise ValueError(f"recall_pairs must be an increasing range >= 1, got {self.recall_pairs}")
        if not 0 <= self.name_copy <= 1:
            raise ValueError(f"name_copy must be a weight in [0, 1], got {self.name_copy}")
        if not self.demo_workflows or any(w not in recorded_workflows() for w in self.demo_workflows):
            raise ValueError(f"demo_workflows must name recorded formats {recorded_workflows()}, "
                             f"got {self.demo_workflows}")
        if not self.demo_objectives or any(int(k) != k or k < 1 for k in self.demo_objectives):
            raise ValueError(f"demo_objectives must be integers >= 1, got {self.demo_objectives}")
        for field in ("cloze_passages", "long_passages", "bind_entities"):
            lo, hi = getattr(self, field)
            if not 1 <= lo <= hi:
                raise ValueError(f"{field} must be an increasing range >= 1, got {(lo, hi)}")


@dataclasses.dataclass
class Row:
    """A training row in the layout `sft.build_rows` reads: loss on response tokens with mask 1."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[float]  # 0/1 (answers), or a copy target's weight (`with_name_copy`)
    kind: str = ""
    questions: list = dataclasses.field(default_factory=list)  # context rows: the question rows asked, in order
    per_ask: int = 1                # questions joined into one `<question>` (multi-objective: 2)
    passages: list = dataclasses.field(default_factory=list)   # context rows: the shown passages' titles, in order

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


class Pieces:
    """Token pieces from a prompt builder (free text is tokenized with special tokens split)."""

    def __init__(self, builder: PromptBuilder):
        self.b = builder
        self.enc = builder.encode

    def observation_text(self, hits: Sequence[Hit]) -> list[int]:
        return [self.b.tool_response_open_id, *self.enc("\n" + format_hits(hits) + "\n"),
                self.b.tool_response_close_id]


def cloze_row(world, rng: random.Random, pieces: Pieces, n_passages: int, n_questions: int,
              one_question_about: str | None = None) -> Row:
    """Passages (as a tool response) + questions answered from them.

    The shown passages are a random subject's passage plus others from the same world
    (including, where it has one, the passage its 2-hop question needs), in random order.
    one_question_about: the probe's form: one 1-hop question about this entity, whose passage
    is shown.
    """
    rows = [r for r in world.train + world.heldout]
    by_subject: dict[str, list[dict]] = {}
    for r in rows:
        by_subject.setdefault(r["subject"], []).append(r)
    pid_of = {p["contents"].split("\n", 1)[0]: p for p in world.corpus}
    if one_question_about is not None:
        qs = [rng.choice([r for r in by_subject[one_question_about] if r["hops"] == 1])]
    else:
        qs = []
    shown: list[dict] = []

    def show(name):
        p = pid_of[name]
        if p not in shown:
            shown.append(p)

    for q in qs:
        for pid in q["gold_passage_ids"]:
            show(world.corpus[int(pid)]["contents"].split("\n", 1)[0])
    while len(shown) < n_passages:
        show(rng.choice(list(pid_of)))
    rng.shuffle(shown)
    if one_question_about is None:
        titles = {p["contents"].split("\n", 1)[0] for p in shown}
        answerable = [r for r in rows if all(world.corpus[int(i)]["contents"].split("\n", 1)[0] in titles
                                             for i in r["gold_passage_ids"])]
        qs = [rng.choice(answerable) for _ in range(n_questions)]
    hits = [Hit(id=p["id"], contents=p["contents"]) for p in shown]
    prompt = pieces.observation_text(hits) + pieces.enc("\n")
    response, mask = [], []
    for q in qs:
        ask = pieces.enc(f"<question> {q['question']} </question>\n\\boxed{{")
        ans = pieces.enc(q["golden_answers"][0] + "}\n")
        response += ask + ans
        mask += [0] * len(ask) + [1] * len(ans)
    # The first question's lead-in is part of the prompt (nothing before it is a target).
    return Row(prompt_ids=prompt, response_ids=response, loss_mask=mask, kind="cloze", questions=qs)


def passage_title(passage: dict) -> str:
    return passage["contents"].split("\n", 1)[0]


def context_row(world, pieces: Pieces, shown: Sequence[dict], asks: Sequence[Sequence[dict]], kind: str) -> Row:
    """Shown passages (one tool response, in the given order), then one `<question>` per ask.

    An ask of several questions is one multi-objective question: `<question> q1; q2 </question>`
    answered `\\boxed{a1; a2}` (the format of `world.objectives`). Loss on the answers only.
    """
    hits = [Hit(id=p["id"], contents=p["contents"]) for p in shown]
    prompt = pieces.observation_text(hits) + pieces.enc("\n")
    response, mask = [], []
    for ask in asks:
        lead = pieces.enc("<question> " + "; ".join(q["question"] for q in ask) + " </question>\n\\boxed{")
        ans = pieces.enc("; ".join(q["golden_answers"][0] for q in ask) + "}\n")
        response += lead + ans
        mask += [0] * len(lead) + [1] * len(ans)
    return Row(prompt_ids=prompt, response_ids=response, loss_mask=mask, kind=kind,
               questions=[q for ask in asks for q in ask], per_ask=len(asks[0]) if asks else 1,
               passages=[passage_title(p) for p in shown])


def _answerable(world, shown: Sequence[dict]) -> list[dict]:
    """Questions (1- and 2-hop) whose every gold passage is among the shown ones."""
    ids = {p["id"] for p in shown}
    return [r for r in world.train + world.heldout if all(i in ids for i in r["gold_passage_ids"])]


def long_row(world, rng: random.Random, pieces: Pieces, n_passages: int, n_asks: int, per_ask: int = 1,
             kind: str = "long") -> Row:
    """n random passages of the world in random order and questions about them: the asked
    passage is anywhere in the context, uniformly (the shuffle). per_ask=2: multi-objective
    asks, two questions about two different subjects."""
    shown = rng.sample(world.corpus, min(n_passages, len(world.corpus)))
    pool = _answerable(world, shown)
    asks = []
    for _ in range(n_asks):
        ask = [rng.choice(pool)]
        while len(ask) < per_ask:
            other = rng.choice(pool)
            if other["subject"] != ask[0]["subject"] or len({q["subject"] for q in pool}) == 1:
                ask.append(other)
        asks.append(ask)
    return context_row(world, pieces, shown, asks, kind)


def bind_row(world, rng: random.Random, pieces: Pieces, n_passages: int, n_entities: int, n_asks: int) -> Row:
    """Binding drill: several entities of one type (so every passage states the asked relation,
    with a value of the same kind) among n passages; one relation asked about several of them.
    The wrong-entity value of the right kind is always in the context: only binding the value
    to its subject answers."""
    by_type: dict[str, list[str]] = {}
    for name, e in world.entities.items():
        if e["type"] != "country":
            by_type.setdefault(e["type"], []).append(name)
    etype = rng.choice(sorted(t for t, names in by_type.items() if len(names) >= 2))
    same = rng.sample(sorted(by_type[etype]), max(2, min(n_entities, len(by_type[etype]))))
    passage_of = {passage_title(p): p for p in world.corpus}
    others = [p for p in world.corpus if passage_title(p) not in same]
    shown = [passage_of[n] for n in same] + rng.sample(others, max(0, min(n_passages - len(same), len(others))))
    rng.shuffle(shown)
    relation = rng.choice(sorted(ONE_HOP[etype]))
    question = {r["subject"]: r for r in world.train + world.heldout if r["hops"] == 1 and r["relation"] == relation}
    asked = rng.sample(same, min(n_asks, len(same)))
    asked += [rng.choice(same) for _ in range(n_asks - len(asked))]
    asks = [[question[name]] for name in asked]
    return context_row(world, pieces, shown, asks, "bind")


def repeat_row(rng: random.Random, pieces: Pieces, words: Sequence[str], n: int) -> Row:
    """`w1 w2 ... wn` then `w1 w2 ... wn` again; loss on the second copy after its first word."""
    run = pieces.enc(" ".join(rng.sample(list(words), n)))
    space = pieces.enc(" ")  # the separator token before each whole-word token: not a target
    return Row(prompt_ids=run + pieces.enc("\n") + run[:1], response_ids=run[1:],
               loss_mask=[int([t] != space) for t in run[1:]], kind="repeat")


def recall_row(rng: random.Random, pieces: Pieces, keys: Sequence[str], values: Sequence[str],
               n_pairs: int) -> Row:
    """`k v ; k v ; ...` then the same keys in another order; loss on the second list's values."""
    ks = rng.sample(list(keys), n_pairs)
    vs = [rng.choice(values) for _ in ks]
    first = pieces.enc(" ; ".join(f"{k} {v}" for k, v in zip(ks, vs)) + "\n")
    order = list(range(n_pairs))
    rng.shuffle(order)
    response, mask = [], []
    for j, i in enumerate(order):
        key = pieces.enc((" ; " if j else "") + ks[i] + " ")
        val = pieces.enc(vs[i])
        response += key + val
        mask += [0] * len(key) + [1] * len(val)
    return Row(prompt_ids=first, response_ids=response, loss_mask=mask, kind="recall")


CONTEXT_KINDS = ("cloze", "long", "bind", "multi")


def with_name_copy(row: Row, name_ids: frozenset[int], weight: float) -> Row:
    """The row with its copy targets also weighed: every name token (`name_ids`) that already
    appeared earlier in the row and is not an answer token gets loss weight `weight`.

    A passage names its subject in every sentence and a question names a shown entity, so a
    context row holds ~5 such targets per passage against 1-4 answers: a dense signal for
    reproducing a name's code from an earlier position, the step where the answers' misses were
    (the argmax a name seen nowhere in the context). The whole row becomes the response (the
    first token the prompt), so `sft` scores it without knowing about prompts."""
    ids = list(row.prompt_ids) + list(row.response_ids)
    mask = [0.0] * len(row.prompt_ids) + [float(m) for m in row.loss_mask]
    seen = set()
    for i, t in enumerate(ids):
        if t in seen and t in name_ids and not mask[i]:
            mask[i] = weight
        seen.add(t)
    return dataclasses.replace(row, prompt_ids=ids[:1], response_ids=ids[1:], loss_mask=mask[1:])


def _conversation_row(c, kind: str) -> Row:
    """A recorded agent conversation (prompt, generated response, loss mask) as a training row."""
    return Row(prompt_ids=list(c.prompt_ids), response_ids=list(c.response_ids),
               loss_mask=[int(m) for m in c.loss_mask], kind=kind)


class Curriculum:
    """Seeded curriculum rows: `rows_for_step(step, n)` depends only on (seed, step), so a
    resumed run sees exactly the rows the interrupted one would have."""

    def __init__(self, vocab: ReadingVocab, builder: PromptBuilder, config: CurriculumConfig = CurriculumConfig(),
                 pool: str = "pretrain"):
        self.vocab, self.builder, self.config = vocab, builder, config
        self.names = vocab.pool(pool)
        self.pieces = Pieces(builder)
        keys = [n for kind in ("person", "city", "company") for n in self.names[kind]]
        self.recall_keys = keys
        self.recall_values = keys + [v for vs in vocab.values.values() for v in vs]
        self.name_ids = frozenset(vocab.ids[n] for pools in vocab.names.values() for names in pools.values()
                                  for n in names)
        self.kinds = [k for k, _ in config.mix]
        self.weights = [w for _, w in config.mix]

    def _world_rows(self, rng: random.Random) -> list[Row]:
        cfg = self.config
        seed = rng.randrange(2 ** 31)
        world = generate_world(seed, num_entities=cfg.world_entities, heldout_fraction=0.0, names=self.names,
                               wording=self.vocab.wording)
        kinds = rng.choices(self.kinds, self.weights, k=cfg.rows_per_world)
        rows: list[Row] = []
        for kind in kinds:
            if kind == "repeat":
                rows.append(repeat_row(rng, self.pieces, self.recall_values, rng.randint(*cfg.repeat_tokens)))
            elif kind == "recall":
                rows.append(recall_row(rng, self.pieces, self.recall_keys, self.recall_values,
                                       rng.randint(*cfg.recall_pairs)))
            elif kind == "cloze":
                rows.append(cloze_row(world, rng, self.pieces, rng.randint(*cfg.cloze_passages),
                                      cfg.cloze_questions))
            elif kind == "long":
                rows.append(long_row(world, rng, self.pieces, rng.randint(*cfg.long_passages), cfg.cloze_questions))
            elif kind == "multi":
                rows.append(long_row(world, rng, self.pieces, rng.randint(*cfg.long_passages),
                                     max(1, cfg.cloze_questions // 2), per_ask=2, kind="multi"))
            elif kind == "bind":
                rows.append(bind_row(world, rng, self.pieces, rng.randint(*cfg.long_passages),
                                     rng.randint(*cfg.bind_entities), cfg.cloze_questions))
        if cfg.name_copy:
            rows = [with_name_copy(r, self.name_ids, cfg.name_copy) if r.kind in CONTEXT_KINDS else r for r in rows]
        n_demo = kinds.count("demo")
        if n_demo and (cfg.demo_workflows, cfg.demo_objectives) != (("memsearcher",), (1,)):
            rows += self._mixed_demo_rows(world, rng, seed, n_demo)
        elif n_demo:
            # A demo has ~2.5 conversations; draw enough questions, keep n_demo conversations.
            questions = rng.sample(world.train, min(len(world.train), max(1, n_demo // 2)))
            demos = make_demonstrations(questions, self.builder, BM25Retriever.from_passages(world.corpus),
                                        seed=seed, config=DemoConfig(vague_query_rate=0.0, wrong_answer_rate=0.0,
                                                                     early_answer_rate=0.0, top_n=cfg.top_n,
                                                                     max_turns=cfg.max_turns))
            convs = demo_conversations(demos)
            rows += [_conversation_row(c, "demo") for c in rng.sample(convs, min(len(convs), n_demo))]
        return [r for r in rows if len(r) <= cfg.max_len and sum(r.loss_mask)]

    def _mixed_demo_rows(self, world, rng: random.Random, seed: int, n_demo: int) -> list[Row]:
        """~n_demo conversations of whole episodes (a demo has ~2 conversations on average over
        the formats), each episode in the next (workflow, objectives) pair from a random start,
        so every pair gets an equal share of episodes in expectation. A k-objective episode asks
        k distinct questions of the world at once (`<question> q1; q2 </question>`) and may take
        max_turns turns per objective."""
        cfg = self.config
        pairs = [(w, k) for k in cfg.demo_objectives for w in cfg.demo_workflows]
        start = rng.randrange(len(pairs))
        retriever = BM25Retriever.from_passages(world.corpus)
        rows = []
        for e in range(max(1, n_demo // 2)):
            workflow, k = pairs[(start + e) % len(pairs)]
            picked = rng.sample(world.train, min(len(world.train), k))
            question = join_objectives(picked, len(picked), seed=rng.randrange(2 ** 31))[0]
            demos = make_demonstrations([question], self.builder, retriever, seed=seed + e,
                                        config=DemoConfig(vague_query_rate=0.0, wrong_answer_rate=0.0,
                                                          early_answer_rate=0.0, top_n=cfg.top_n,
                                                          max_turns=cfg.max_turns * len(picked), workflow=workflow))
            rows += [_conversation_row(c, f"demo:{workflow}:{len(picked)}") for c in demo_conversations(demos)]
        return rows

    def rows_for_step(self, step: int, n: int) -> list[Row]:
        """n rows for training step `step` (fresh worlds each step)."""
        rng = random.Random(f"{self.config.seed}:{step}")
        rows: list[Row] = []
        while len(rows) < n:
            rows += self._world_rows(rng)
        rng.shuffle(rows)
        return rows[:n]


class PhasedCurriculum:
    """Curricula by training step: `phases` = [(first_step, Curriculum), ...] from step 0; the
    rows of a step come from the last phase begun by then (still a function of (seed, step))."""

    def __init__(self, phases: Sequence[tuple[int, Curriculum]]):
        starts = [s for s, _ in phases]
        if not phases or starts[0] != 0 or starts != sorted(set(starts)):
            raise ValueError(f"phases must start at step 0 with increasing first steps, got {starts}")
        self.phases = list(phases)

    def at(self, step: int) -> Curriculum:
        return [c for s, c in self.phases if s <= step][-1]

    def rows_for_step(self, step: int, n: int) -> list[Row]:
        return self.at(step).rows_for_step(step, n)
