"""Scripted demonstrations: parse as intended, match the rollout's rows, flaws at the configured rates."""
import dataclasses
import json

import pytest

from memsearcher_jax.agent.parsing import ActKind
from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.agent.rollout import AgentConfig, AgentRunner
from memsearcher_jax.data import demos as _demos
from memsearcher_jax.data.demos import FLAWS, DemoConfig, demo_stats, make_demonstrations
from memsearcher_jax.data.tokenizer import load_tokenizer
from memsearcher_jax.data.world_cache import prepare_world
from memsearcher_jax.qa_metrics import compute_reward, token_f1
from retrieval.bm25 import BM25Retriever
from tests.demo_checks import check_demonstration


def _jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    paths = prepare_world(str(tmp_path_factory.mktemp("world")), seed=3, num_entities=60)
    builder = PromptBuilder(load_tokenizer(paths.tokenizer_dir))
    retriever = BM25Retriever.from_passages(_jsonl(paths.corpus))
    return _jsonl(paths.train) + _jsonl(paths.heldout), builder, retriever


def test_every_demo_parses_as_intended(world):
    rows, builder, retriever = world
    demos = make_demonstrations(rows, builder, retriever, seed=0)
    assert len(demos) == len(rows)
    for d in demos:
        assert check_demonstration(d, builder) == [], (d.row["question"], d.flaw)
    clean = [d for d in demos if d.flaw is None]
    assert clean and all(compute_reward(d.trajectory.final.blocks, True, d.row["golden_answers"]).reward == 1.0
                         for d in clean)
    # A clean demo searches exactly once per hop and answers in the next turn.
    for d in clean:
        assert d.act_kinds == [ActKind.TOOL_CALLS] * d.row["hops"] + [ActKind.ANSWER]
        assert d.memories[-1] == " ".join(d.row["facts"])
    stats = demo_stats(demos)
    assert 0 < stats["mean_tokens"] <= stats["max_tokens"] < 1500


def test_check_catches_a_broken_demo(world):
    rows, builder, retriever = world
    demo = make_demonstrations(rows[:5], builder, retriever, seed=0, config=DemoConfig(0, 0, 0))[0]
    conv = demo.conversations[0]
    # Drop the closing </tool_call>: the act no longer classifies as a tool call.
    close_id = builder.encode("</tool_call>")[0]
    k = conv.response_ids.index(close_id)
    del conv.response_ids[k], conv.loss_mask[k], conv.sampler_logprobs[k]
    problems = check_demonstration(demo, builder)
    assert any("classifies as invalid, intended tool_calls" in p for p in problems), problems


@dataclasses.dataclass
class _Completion:
    tokens: list
    logprobs: list
    finish_reason: str = "stop"


class _ReplaySampler:
    """Answers each prompt with the tokens a demo generated after exactly that prefix: every
    maximal run of loss-masked tokens (an act or a memory update) keyed by all that precedes it."""

    def __init__(self, demos, eos_id):
        self.table = {}
        for d in demos:
            for c in d.conversations:
                pos = 0
                while pos < len(c.loss_mask):
                    if c.loss_mask[pos] == 0:
                        pos += 1
                        continue
                    end = pos
                    while end < len(c.loss_mask) and c.loss_mask[end] == 1:
                        end += 1
                    assert c.response_ids[end - 1] == eos_id
                    self.table[tuple(c.prompt_ids + c.response_ids[:pos])] = c.response_ids[pos:end]
                    pos = end

    def generate(self, prompts, **kw):
        return [_Completion(list(self.table[tuple(p)]), [0.0] * len(self.table[tuple(p)])) for p in prompts]


def test_demos_equal_what_the_rollout_records(world):
    """Replaying the demos' generated tokens through AgentRunner (real BM25) gives identical rows."""
    rows, builder, retriever = world
    demos = make_demonstrations(rows[:40], builder, retriever, seed=1,
                                config=DemoConfig(vague_query_rate=0.3, wrong_answer_rate=0.2, early_answer_rate=0.2))
    assert {d.flaw for d in demos} == set(FLAWS) | {None}
    # Questions repeat in the world (same text, other row), so replay one demo per runner call.
    for d in demos:
        runner = AgentRunner(builder, _ReplaySampler([d], builder.eos_id), retriever, AgentConfig())
        (traj,) = runner.run([d.row], group_size=1, seed=0)
        assert traj.end_reason == "answer"
        assert len(traj.conversations) == len(d.conversations)
        for got, want in zip(traj.conversations, d.conversations):
            assert got.prompt_ids == want.prompt_ids
            assert got.response_ids == want.response_ids
            assert got.loss_mask == want.loss_mask
            assert got.blocks == want.blocks and got.is_final == want.is_final
        assert traj.memories == d.memories


def test_flaw_fractions_match_rates(world):
    rows, builder, retriever = world
    rates = DemoConfig(vague_query_rate=0.2, wrong_answer_rate=0.15, early_answer_rate=0.1, early_two_hop="first_hop")
    many = (rows * 4)[:1200]  # rows repeat; each draw is independent
    demos = make_demonstrations(many, builder, retriever, seed=7, config=rates)
    n = len(demos)
    for flaw, rate in zip(FLAWS, (0.2, 0.15, 0.1)):
        frac = sum(d.flaw == flaw for d in demos) / n
        assert abs(frac - rate) < 0.04, (flaw, frac, rate)
    wrong = [d for d in demos if not d.correct]
    assert all(compute_reward(d.trajectory.final.blocks, True, d.row["golden_answers"]).reward == 0.1 for d in wrong)
    # Early answers really answer before every hop is searched; vague demos search one extra time.
    for d in demos:
        searches = d.act_kinds.count(ActKind.TOOL_CALLS)
        if d.flaw == "early_answer":
            assert searches == d.row["hops"] - 1
        elif d.flaw is None or d.flaw == "wrong_answer":
            assert searches == d.row["hops"]
        else:
            assert searches in (d.row["hops"], d.row["hops"] + 1)
    assert sum(d.flaw == "vague_query" and d.act_kinds.count(ActKind.TOOL_CALLS) > d.row["hops"]
               for d in demos) > 0.7 * sum(d.flaw == "vague_query" for d in demos)
    # Same seed, same demos.
    again = make_demonstrations(many[:50], builder, retriever, seed=7, config=rates)
    assert [d.flaw for d in again] == [d.flaw for d in demos[:50]]


def test_zero_rates_give_clean_demos_and_bad_rates_are_rejected(world):
    rows, builder, retriever = world
    demos = make_demonstrations(rows[:30], builder, retriever, seed=0, config=DemoConfig(0, 0, 0))
    assert all(d.flaw is None and d.correct for d in demos)
    with pytest.raises(ValueError, match="flaw rates"):
        DemoConfig(vague_query_rate=0.6, wrong_answer_rate=0.5)
    with pytest.raises(ValueError, match="lacks 'queries'"):
        make_demonstrations([{"question": "q?", "golden_answers": ["a"], "hops": 1, "facts": ["f"],
                              "relation": "r", "subject": "s"}], builder, retriever)


def test_two_hop_early_rate_makes_stopping_the_habit(world):
    rows, builder, retriever = world
    two_hop = [r for r in rows if r["hops"] == 2]
    one_hop = [r for r in rows if r["hops"] == 1]
    cfg = DemoConfig(vague_query_rate=0.1, wrong_answer_rate=0.1, early_answer_rate=0.1, two_hop_early_rate=0.7,
                     early_two_hop="first_hop")
    many = (two_hop * 8)[:400]
    demos = make_demonstrations(many, builder, retriever, seed=3, config=cfg)
    frac = sum(d.flaw == "early_answer" for d in demos) / len(demos)
    assert abs(frac - 0.7) < 0.06, frac
    for d in demos:
        assert not check_demonstration(d, builder)
        if d.flaw == "early_answer":  # stopped after the first hop, boxing the bridge entity
            assert d.act_kinds.count(ActKind.TOOL_CALLS) == 1
            assert d.answer == d.row["intermediate"]
    # 1-hop demos keep the ordinary early-answer rate.
    ones = make_demonstrations((one_hop * 4)[:400], builder, retriever, seed=3, config=cfg)
    assert sum(d.flaw == "early_answer" for d in ones) / len(ones) < 0.2
    with pytest.raises(ValueError, match="two_hop_early_rate"):
        DemoConfig(two_hop_early_rate=1.5)


def test_early_two_hop_no_search_guesses_and_every_searching_demo_finishes_its_hops(world):
    """early_two_hop="no_search": an early 2-hop answer is a guess before any search (a value of
    the asked relation's kind, never the bridge entity); every 2-hop demo that searches searches
    both hops. The rest of the script (which rows, which flaws) is the same as with "first_hop"."""
    rows, builder, retriever = world
    two_hop = [r for r in rows if r["hops"] == 2][:120]
    rates = dict(vague_query_rate=0.1, wrong_answer_rate=0.05, early_answer_rate=0.6)
    stop = make_demonstrations(two_hop, builder, retriever, seed=5,
                               config=DemoConfig(**rates, early_two_hop="first_hop"))
    guess = make_demonstrations(two_hop, builder, retriever, seed=5,
                                config=DemoConfig(**rates, early_two_hop="no_search"))
    assert [d.flaw for d in stop] == [d.flaw for d in guess]
    early = [d for d in guess if d.flaw == "early_answer"]
    assert 0.45 < len(early) / len(guess) < 0.75, len(early)
    for d_stop, d in zip(stop, guess):
        assert not check_demonstration(d, builder)
        searches = d.act_kinds.count(ActKind.TOOL_CALLS)
        if d.flaw == "early_answer":
            assert searches == 0 and d.act_kinds == [ActKind.ANSWER]
            assert d.answer != d.row["intermediate"] and token_f1(d.answer, d.row["golden_answers"]) == 0.0
            assert d_stop.act_kinds.count(ActKind.TOOL_CALLS) == 1 and d_stop.answer == d_stop.row["intermediate"]
        else:
            assert searches >= 2 and d.answer == d_stop.answer
    guessed_values = {d.answer for d in early}
    assert len(guessed_values) > 3  # drawn from the relation's values, not one fixed word
    with pytest.raises(ValueError, match="early_two_hop"):
        DemoConfig(early_two_hop="after_the_second")


_FLAWED = dict(vague_query_rate=0.3, wrong_answer_rate=0.2, early_answer_rate=0.2)


@pytest.fixture(scope="module")
def flawed_memsearcher(world):
    """Every row's flawed demonstration (seed 2) in the memsearcher format: the script the other
    formats are compared with by two tests, which only read it."""
    rows, builder, retriever = world
    return make_demonstrations(rows, builder, retriever, seed=2, config=DemoConfig(**_FLAWED))


def test_react_demos_equal_what_the_rollout_records(world):
    """ReAct-format demos: one growing conversation; replaying their acts through AgentRunner's
    react workflow (real BM25) gives exactly the recorded row, context lengths and searches."""
    rows, builder, retriever = world
    demos = make_demonstrations(rows[:40], builder, retriever, seed=1, config=DemoConfig(**_FLAWED, react_share=1.0))
    assert {d.flaw for d in demos} == set(FLAWS) | {None}
    assert all(d.workflow == "react" for d in demos)
    for d in demos:
        assert check_demonstration(d, builder) == [], (d.row["question"], d.flaw)
        (conv,) = d.conversations
        assert conv.prompt_ids == builder.react_context(d.row["question"]) and conv.is_final
        assert d.memories == [] and d.trajectory.memories == []
        # One masked observation per search, acts (each ending <|im_end|>) all in the loss mask.
        runs = [m for k, m in enumerate(conv.loss_mask) if k == 0 or m != conv.loss_mask[k - 1]]
        assert runs == [1, 0] * d.act_kinds.count(ActKind.TOOL_CALLS) + [1]
        assert conv.response_ids.count(builder.think_id) == len(d.act_kinds) - 1  # re-opened after each observation
    for d in demos:  # one demo per runner call: questions repeat in the world
        runner = AgentRunner(builder, _ReplaySampler([d], builder.eos_id), retriever, AgentConfig(workflow="react"))
        (traj,) = runner.run([d.row], group_size=1, seed=0)
        assert traj.end_reason == "answer"
        (got,), (want,) = traj.conversations, d.conversations
        assert got.prompt_ids == want.prompt_ids
        assert got.response_ids == want.response_ids
        assert got.loss_mask == want.loss_mask
        assert got.blocks == want.blocks and got.is_final and got.ended_with_eos
        assert traj.context_tokens == d.trajectory.context_tokens
        assert traj.num_searches == d.trajectory.num_searches == d.act_kinds.count(ActKind.TOOL_CALLS)
        assert traj.memories == []


def test_react_share_mixes_formats_without_changing_the_script(world, flawed_memsearcher):
    rows, builder, retriever = world
    mem = flawed_memsearcher
    react = make_demonstrations(rows, builder, retriever, seed=2, config=DemoConfig(**_FLAWED, react_share=1.0))
    mixed = make_demonstrations(rows, builder, retriever, seed=2, config=DemoConfig(**_FLAWED, react_share=0.5))
    assert all(d.workflow == "memsearcher" for d in mem)
    # Same searches, flaws and answers whichever format records them.
    for m, r, x in zip(mem, react, mixed):
        assert m.flaw == r.flaw == x.flaw and m.answer == r.answer == x.answer
        assert m.act_kinds == r.act_kinds == x.act_kinds
        same = m if x.workflow == "memsearcher" else r
        assert [(c.prompt_ids, c.response_ids, c.loss_mask) for c in x.conversations] == \
               [(c.prompt_ids, c.response_ids, c.loss_mask) for c in same.conversations]
        assert check_demonstration(x, builder) == []
    share = demo_stats(mixed)["frac_react"]
    assert abs(share - 0.5) < 0.1, share
    # Both formats of every flaw occur in the mix.
    for flaw in set(FLAWS) | {None}:
        assert {d.workflow for d in mixed if d.flaw == flaw} == {"memsearcher", "react"}, flaw
    with pytest.raises(ValueError, match="react_share"):
        DemoConfig(react_share=1.5)


def test_check_catches_a_broken_react_demo(world):
    rows, builder, retriever = world
    two_hop = [r for r in rows if r["hops"] == 2][:3]
    demo = make_demonstrations(two_hop, builder, retriever, seed=0, config=DemoConfig(0, 0, 0, react_share=1.0))[0]
    conv = demo.conversations[0]
    # Drop the <think> pre-fill that ends the first observation: the next act starts bare.
    k = conv.response_ids.index(builder.think_id)
    del conv.response_ids[k], conv.loss_mask[k], conv.sampler_logprobs[k]
    problems = check_demonstration(demo, builder)
    assert any("no masked tool-response observation" in p for p in problems), problems
    assert any("recorded context" in p for p in problems), problems
    # A react recording checked as the memsearcher format fails loudly.
    fresh = make_demonstrations(two_hop, builder, retriever, seed=0, config=DemoConfig(0, 0, 0, react_share=1.0))[0]
    assert check_demonstration(fresh, builder) == []
    fresh.workflow = "memsearcher"
    assert any("prompt is not memsearcher_context" in p for p in check_demonstration(fresh, builder))


# ---------------------------------------------------------------- every workflow's format, several objectives

def _replay(d, builder, retriever, workflow, max_turns=5):
    from memsearcher_jax.agent.workflows.summary import DEMO_SUMMARY_BUDGET  # where the demonstrator summarizes

    runner = AgentRunner(builder, _ReplaySampler([d], builder.eos_id), retriever,
                         AgentConfig(workflow=workflow, max_turns=max_turns, summary_budget=DEMO_SUMMARY_BUDGET))
    (traj,) = runner.run([d.row], group_size=1, seed=0)
    return traj


@pytest.mark.parametrize("workflow", ["mem1", "memory_ops"])
def test_new_formats_equal_what_the_rollout_records(world, workflow):
    """mem1 and memory_ops demos: replaying their generated tokens through AgentRunner's workflow
    (real BM25) gives identical rows, carried memories and per-call token records."""
    rows, builder, retriever = world
    demos = make_demonstrations(rows[:40], builder, retriever, seed=1, config=DemoConfig(**_FLAWED, workflow=workflow))
    assert {d.flaw for d in demos} == set(FLAWS) | {None} and all(d.workflow == workflow for d in demos)
    for d in demos:
        assert check_demonstration(d, builder) == [], (d.row["question"], d.flaw)
        traj = _replay(d, builder, retriever, workflow)
        assert traj.end_reason == "answer" and len(traj.conversations) == len(d.conversations)
        for got, want in zip(traj.conversations, d.conversations):
            assert (got.prompt_ids, got.response_ids, got.loss_mask) == (want.prompt_ids, want.response_ids,
                                                                         want.loss_mask)
            assert got.blocks == want.blocks and got.is_final == want.is_final
        assert traj.memories == d.memories == d.trajectory.memories
        assert traj.memory_tokens == d.trajectory.memory_tokens and traj.calls == d.trajectory.calls
        if workflow == "mem1":  # the act alone is trained; the state opens each later act's thinking
            assert all(c.loss_mask == [1] * len(c.response_ids) for c in d.conversations)
        if d.flaw is None:
            facts = " ".join(d.row["facts"])
            if workflow == "mem1":
                assert d.conversations[-1].blocks[-1].startswith(f"<think>{facts} ")
            else:
                assert d.memories[-1] == "\n".join(f"[{i}] {f}" for i, f in enumerate(d.row["facts"], 1))


def test_every_format_records_the_same_script(world, flawed_memsearcher):
    rows, builder, retriever = world
    assert DemoConfig(**_FLAWED, workflow="memsearcher") == DemoConfig(**_FLAWED)  # the fixture's config
    by_format = {"memsearcher": flawed_memsearcher,
                 **{w: make_demonstrations(rows, builder, retriever, seed=2, config=DemoConfig(**_FLAWED, workflow=w))
                    for w in ("react", "mem1", "memory_ops", "summary", "fold")}}
    for demos in zip(*by_format.values()):
        assert len({(d.flaw, d.answer, tuple(d.act_kinds), d.trajectory.num_searches) for d in demos}) == 1
    with pytest.raises(ValueError, match="recorded formats"):
        DemoConfig(workflow="mem2")


def test_a_new_workflows_demos_come_from_its_own_file(world):
    """A memory design is one file: a workflow registered with its ScriptRecorder (here, one whose
    memory keeps only the newest found sentence) gets the demonstrator's script in its format,
    with nothing added to data/demos.py, and replaying the demos through AgentRunner records the
    same rows. A workflow without a recorder is refused as a demo format."""
    from memsearcher_jax.agent.parsing import extract_memory
    from memsearcher_jax.agent.workflows import ScriptRecorder, Workflow, base, recorded_workflows, register

    class LastFactRecorder(ScriptRecorder):
        def new_turn(self):
            return self.new_conversation(self.b.memsearcher_context(self.t.question, self.t.memory))

        def observe_and_update(self, conv, hits, memory, new_fact, note):
            kept = new_fact or self.t.memory or note  # the newest sentence only
            self.second(conv, self.b.observation([hits]), f"<memory>{kept}</memory>")
            self.t.memory = kept
            self.t.memories.append(kept)
            self.t.memory_tokens.append(self.b.memory_tokens(kept))
            self.t.num_searches += 1

        def recorded_memories(self, script_memories):
            return list(self.t.memories)

    class LastFact(Workflow):
        name = "test_last_fact"
        second_call = True
        recorder = LastFactRecorder

        def open_turn(self, t, turn, b, cfg):
            self.new_conversation(t, b.memsearcher_context(t.question, t.memory), turn)

        def observe(self, t, results, b, cfg):
            t.final.add_injected(b.observation(results, cfg.max_observation_tokens))

        def after_second(self, t, text, b, cfg):
            t.memory = extract_memory(text)
            t.memories.append(t.memory)
            t.memory_tokens.append(b.memory_tokens(t.memory))

    class NoDemos(Workflow):
        name = "test_no_demos"

    rows, builder, retriever = world
    two_hop = [r for r in rows if int(r["hops"]) == 2][:10]
    assert len(two_hop) == 10
    try:
        register(LastFact)
        register(NoDemos)
        assert "test_last_fact" in recorded_workflows() and "test_no_demos" not in recorded_workflows()
        demos = make_demonstrations(two_hop, builder, retriever, seed=0,
                                    config=DemoConfig(0, 0, 0, workflow="test_last_fact"))
        assert len(demos) == 10
        for d in demos:
            assert d.workflow == "test_last_fact" and d.memories == [d.row["facts"][0], d.row["facts"][1]]
            traj = _replay(d, builder, retriever, "test_last_fact")
            assert traj.end_reason == "answer" and traj.memories == d.memories
            for got, want in zip(traj.conversations, d.conversations, strict=True):
                assert (got.prompt_ids, got.response_ids, got.loss_mask) == (want.prompt_ids, want.response_ids,
                                                                             want.loss_mask)
        with pytest.raises(ValueError, match="recorded formats"):
            DemoConfig(workflow="test_no_demos")
        # The warm start of a workflow without a recorder is refused with the rest of the config.
        from memsearcher_jax.rules.config_rules import config_problems
        from memsearcher_jax.settings.config_utils import load_config
        cfg = load_config("configs/default.py", [("agent.workflow", "test_no_demos")])
        assert any("agent.workflow='test_no_demos' has no recorder" in p for p in config_problems(cfg))
        cfg = load_config("configs/default.py", [("agent.workflow", "test_no_demos"), ("sft.steps", "0")])
        assert not any("has no recorder" in p for p in config_problems(cfg))
    finally:
        base._REGISTRY.pop("test_last_fact", None)
        base._REGISTRY.pop("test_no_demos", None)


@pytest.fixture(scope="module")
def two_objective_rows(world):
    from memsearcher_jax.data.synthetic import join_objectives

    rows, _, _ = world
    return join_objectives(rows[:60], 2, seed=0)


@pytest.mark.parametrize("workflow", ["memsearcher", "react", "mem1", "memory_ops", "summary", "fold"])
def test_two_objective_demos(world, two_objective_rows, workflow):
    """Objectives one after the other, one answer "a1; a2"; a flaw hits one objective; the rollout
    replays them; the reward (0.1 + 0.9 x mean per-objective F1) is 1 for a clean demo and 0.55
    for a flawed one (one objective of two right)."""
    from memsearcher_jax.qa_metrics import compute_reward as score

    _, builder, retriever = world
    cfg = DemoConfig(**_FLAWED, workflow=workflow, max_turns=6)
    demos = make_demonstrations(two_objective_rows, builder, retriever, seed=4, config=cfg)
    assert {d.flaw for d in demos} == set(FLAWS) | {None}
    for d in demos:
        objs = d.row["objectives"]
        assert check_demonstration(d, builder) == [], (d.row["question"], d.flaw)
        assert d.answer == "; ".join(d.answers) and len(d.answers) == 2
        searches = d.act_kinds.count(ActKind.TOOL_CALLS)
        hops = sum(o["hops"] for o in objs)
        assert searches == {None: hops, "wrong_answer": hops, "early_answer": hops - 1}.get(d.flaw, searches)
        reward = score(d.trajectory.final.blocks, True, d.row["golden_answers"]).reward
        if d.flaw is None:
            assert d.answers == [o["golden_answers"][0] for o in objs] and reward == 1.0
        elif d.flaw != "vague_query":
            assert reward == pytest.approx(0.1 + 0.9 * 0.5)
            assert sum(a == o["golden_answers"][0] for a, o in zip(d.answers, objs)) == 1
    for d in demos[:12]:
        traj = _replay(d, builder, retriever, workflow, max_turns=6)
        assert traj.end_reason == "answer"
        assert [(c.prompt_ids, c.response_ids, c.loss_mask) for c in traj.conversations] == \
               [(c.prompt_ids, c.response_ids, c.loss_mask) for c in d.conversations]


def test_a_vague_search_that_does_not_fit_is_dropped(world, two_objective_rows):
    _, builder, retriever = world
    two_two_hop = [r for r in two_objective_rows if all(o["hops"] == 2 for o in r["objectives"])]
    assert two_two_hop
    demos = make_demonstrations(two_two_hop, builder, retriever, seed=0,
                                config=DemoConfig(vague_query_rate=1.0, wrong_answer_rate=0, early_answer_rate=0,
                                                  max_turns=5))
    assert all(d.flaw is None and len(d.act_kinds) == 5 for d in demos)
    roomy = make_demonstrations(two_two_hop, builder, retriever, seed=0,
                                config=DemoConfig(vague_query_rate=1.0, wrong_answer_rate=0, early_answer_rate=0,
                                                  max_turns=6))
    assert all(d.flaw == "vague_query" for d in roomy)


@pytest.mark.parametrize("early_two_hop", ["first_hop", "no_search"])
def test_several_objective_demos_search_every_objective_before_answering(world, early_two_hop):
    """With several objectives the demonstrator never answers one question and guesses the rest:
    every objective is searched (its first fact comes back in an observation); an
    early answer stops a 2-hop objective after its first hop and boxes the bridge entity; a row of
    1-hop objectives gets a wrong answer instead. Single questions keep their early guesses."""
    from memsearcher_jax.data.synthetic import join_objectives

    rows, builder, retriever = world
    cfg = DemoConfig(vague_query_rate=0.2, wrong_answer_rate=0.1, early_answer_rate=0.6, early_two_hop=early_two_hop,
                     max_turns=10)
    for n in (2, 3):
        demos = make_demonstrations(join_objectives(rows[:60], n, seed=1), builder, retriever, seed=2, config=cfg)
        early = [d for d in demos if d.flaw == "early_answer"]
        assert early and any(d.flaw == "wrong_answer" for d in demos)
        for d in demos:
            assert check_demonstration(d, builder) == [], (d.row["question"], d.flaw)
            seen = " ".join(builder.decode([t for t, m in zip(c.response_ids, c.loss_mask) if m == 0])
                            for c in d.conversations)
            for o in d.row["objectives"]:  # searched: its first fact came back in an observation
                assert o["facts"][0] in seen, (d.flaw, o["question"])
        for d in early:
            stopped = [(o, a) for o, a in zip(d.row["objectives"], d.answers) if a != o["golden_answers"][0]]
            assert len(stopped) == 1 and stopped[0][0]["hops"] == 2 and stopped[0][1] == stopped[0][0]["intermediate"]
            assert d.act_kinds.count(ActKind.TOOL_CALLS) == sum(o["hops"] for o in d.row["objectives"]) - 1
    singles = make_demonstrations(rows[:60], builder, retriever, seed=2, config=cfg)
    assert any(d.flaw == "early_answer" and d.act_kinds == [ActKind.ANSWER] for d in singles)


def test_early_several_skip_leaves_one_objective_unsearched_and_finishes_the_rest(world):
    """early_several="skip": an early answer to several objectives leaves one objective (of any
    kind) unsearched and guesses its answer (never its bridge entity, zero F1); every other
    objective has all its hops found and its gold answer. Which rows and flaws is unchanged, and
    "first_hop" (the default) still stops a 2-hop objective after its first hop."""
    from memsearcher_jax.data.synthetic import join_objectives

    rows, builder, retriever = world
    rates = dict(vague_query_rate=0.1, wrong_answer_rate=0.05, early_answer_rate=0.6, max_turns=10)
    joined = join_objectives(rows[:80], 2, seed=3)
    stop = make_demonstrations(joined, builder, retriever, seed=4, config=DemoConfig(**rates))
    skip = make_demonstrations(joined, builder, retriever, seed=4, config=DemoConfig(**rates, early_several="skip"))
    for d_stop, d in zip(stop, skip):  # the same flaws, but a row of 1-hop objectives can now skip one
        one_hop_row = all(o["hops"] == 1 for o in d.row["objectives"])
        assert d_stop.flaw == d.flaw or (one_hop_row and (d_stop.flaw, d.flaw) == ("wrong_answer", "early_answer"))
    early = [d for d in skip if d.flaw == "early_answer"]
    assert len(early) >= 8
    skipped_hops = set()
    for d_stop, d in zip(stop, skip):
        assert check_demonstration(d, builder) == []
        seen = " ".join(builder.decode([t for t, m in zip(c.response_ids, c.loss_mask) if m == 0])
                        for c in d.conversations)
        written = " ".join(builder.decode([t for t, m in zip(c.response_ids, c.loss_mask) if m == 1])
                           for c in d.conversations)
        objs = d.row["objectives"]
        if d.flaw != "early_answer":
            assert d.answers == d_stop.answers
            continue
        unsearched = [k for k, o in enumerate(objs) if not any(q in written for q in o["queries"])]
        assert len(unsearched) == 1, (d.row["question"], written)
        k = unsearched[0]
        skipped_hops.add(objs[k]["hops"])
        assert d.answers[k] != objs[k].get("intermediate") and token_f1(d.answers[k], objs[k]["golden_answers"]) == 0.0
        for j, o in enumerate(objs):
            if j != k:  # every hop searched and found
                assert all(q in written for q in o["queries"]) and all(f in seen for f in o["facts"])
                assert d.answers[j] == o["golden_answers"][0]
        assert d.act_kinds.count(ActKind.TOOL_CALLS) == sum(o["hops"] for j, o in enumerate(objs) if j != k)
        # The default stops a 2-hop objective one hop short and boxes its bridge instead.
        assert any(a == o.get("intermediate") for o, a in zip(objs, d_stop.answers)) or d_stop.flaw == "wrong_answer"
    assert skipped_hops == {1, 2}  # the skipped objective is drawn among all, not only 2-hop ones
    with pytest.raises(ValueError, match="early_several"):
        DemoConfig(early_several="halfway")


@pytest.mark.parametrize("wording", [_demos.NO_RESULT_NOTE, _demos.FACT_SHAPED_NO_RESULT])
def test_a_search_that_found_nothing_leaves_the_configured_note(world, wording):
    """A search that found nothing leaves a note in memory, worded as sft.no_result_note says. The
    fact-shaped "X: no result." (bench/paper_tables.py) opens with its subject and shares no word with a
    think: worded "Nothing found about X yet." sampled pair updates closed it with </think>
    (docs/lab/2026-11-29-four-designs-seed0-and-sampled-episodes.md); the default keeps that wording,
    which the single-question job learns more from (docs/lab/2026-11-30-default-job-after-the-no-result-note.md)."""
    import re

    from memsearcher_jax.data import demos as demos_mod

    rows, builder, retriever = world
    demos = make_demonstrations(rows, builder, retriever, seed=0, config=DemoConfig(1.0, 0, 0, no_result_note=wording))
    noted = 0
    for d in demos:
        subject = d.row["subject"]
        note = wording.format(s=subject)
        updates = [b for c in d.conversations for b in builder.tokenizer.decode(c.response_ids).split("<memory>")[1:]]
        if note in d.memories[0] if d.memories else False:
            noted += 1
            assert d.memories[0] == note, d.memories[0]   # nothing found yet: the note is the whole memory
            assert any(u.split("</memory>")[0] == note for u in updates), updates
        for u in updates:  # every update closes as a memory, never as a think
            assert "</memory>" in u and "</think>" not in u.split("</memory>")[0], u
    assert noted >= len(demos) // 4, noted  # the vague path leaves the note (when the vague search misses)
    other = demos_mod.FACT_SHAPED_NO_RESULT if wording == demos_mod.NO_RESULT_NOTE else demos_mod.NO_RESULT_NOTE
    assert not any(other.format(s=d.row["subject"]) in m for d in demos for m in d.memories)
    if wording == demos_mod.FACT_SHAPED_NO_RESULT:
        thinks = [v for k, v in vars(demos_mod).items() if k.startswith("THINK_")]
        think_words = {w.lower() for t in thinks for w in re.findall(r"[A-Za-z]+", t) if w != "e"}
        note_words = {w.lower() for w in re.findall(r"[A-Za-z]+", wording.format(s=""))}
        assert note_words and not note_words & think_words, note_words & think_words


@pytest.mark.parametrize("note", ["nothing here", "{s} and {s}", "{subject} none", "{s}", "{s} {0}", "  {s} "])
def test_a_no_result_note_without_its_subject_is_refused(note):
    with pytest.raises(ValueError, match="no_result_note"):
        DemoConfig(no_result_note=note)


def test_the_default_job_and_the_tables_word_the_note_as_measured():
    """The default job keeps the wording its base was pretrained on; the tables the fact-shaped one."""
    import bench.paper_tables as pt
    from memsearcher_jax.app.experiment import demo_config
    from memsearcher_jax.data import demos as demos_mod
    from memsearcher_jax.settings.config_utils import load_config

    assert demo_config(load_config("configs/default.py", [])).no_result_note == demos_mod.NO_RESULT_NOTE
    assert pt.BENCH["sft.no_result_note"] == demos_mod.FACT_SHAPED_NO_RESULT
    pinned = load_config("configs/default.py", [(k, str(v)) for k, v in pt.BENCH.items()])
    assert demo_config(pinned).no_result_note == demos_mod.FACT_SHAPED_NO_RESULT
