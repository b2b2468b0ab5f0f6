"""Coverage in every report (issue 83 item 3): how much of each task an episode searched, in the
evaluation's metrics (rl/evaluation.py) and bench/paper_tables.py's tables, and where react's
history outgrows what the base reads."""
from __future__ import annotations

import json

import pytest

from memsearcher_jax.agent.rollout import AgentConfig, AgentRunner
from memsearcher_jax.agent.trajectory import Trajectory
from memsearcher_jax.bases import DEFAULT_BASE
from memsearcher_jax.rl.evaluation import COVERAGE_KEYS, coverage_metrics, evaluate, mentions
from tests.bench_loader import load_bench
from tests.test_demos import _ReplaySampler


def test_a_query_mentions_an_entity_by_its_whole_name_in_any_case():
    assert mentions("bolin born year", "Bolin") and mentions("Where is BOLIN?", "Bolin")
    assert not mentions("Bolinar born year", "Bolin") and not mentions("xbolin", "Bolin")
    assert not mentions("Bolin", "") and mentions("Pisocorp founder", "Pisocorp")


def _episode(queries, end="answer"):
    t = Trajectory(traj_id=0, group_id=0, question="q", golds=["a"])
    t.record_searches(queries, [[object()] * 2 for _ in queries])
    t.end_reason = end
    return t


ONE = {"subject": "Bolin", "hops": 1}
TWO = {"subject": "Zumatek", "intermediate": "Gebin", "hops": 2}


def test_coverage_metrics_by_hand():
    """Three episodes: a pair whose 2-hop question was searched on both hops; a pair that answered
    after searching only the 1-hop question; a single 2-hop question searched on its first hop
    only (its question counts as searched) that ran out of turns."""
    questions = [{"objectives": [ONE, TWO]}, {"objectives": [ONE, TWO]}, TWO]
    trajs = [_episode(["bolin year", "Zumatek founder", "Gebin city"]), _episode(["Bolin year", "bolin job"]),
             _episode(["zumatek founder"], end="max_turns")]
    m = coverage_metrics(trajs, questions)
    assert m["coverage"] == pytest.approx(4 / 5)             # of 5 questions, the second pair's TWO unsearched
    assert m["hop_coverage"] == pytest.approx(5 / 8)         # hops: 3 of 3, 1 of 3, 1 of 2
    assert m["searches_per_question"] == pytest.approx((3 / 2 + 2 / 2 + 1 / 1) / 3)
    assert m["hops_per_question"] == pytest.approx((3 / 2 + 3 / 2 + 2) / 3)
    assert m["searches_per_hop"] == pytest.approx(6 / 8)
    assert m["early_answer_rate"] == pytest.approx(1 / 3)    # only the second answered with a question unsearched
    assert set(m) == set(COVERAGE_KEYS) - {"passages", "passages_max"}
    # Questions without subjects (real data): nothing to count against.
    assert coverage_metrics(trajs[:1], [{"question": "q", "golden_answers": ["a"]}]) == {}


@pytest.fixture(scope="module")
def demo_world():
    from memsearcher_jax.agent.prompts import PromptBuilder
    from memsearcher_jax.bases import DEFAULT_BASE
    from memsearcher_jax.data.synthetic import generate_world, join_objectives
    from memsearcher_jax.data.tokenizer import load_tokenizer
    from memsearcher_jax.data.vocab import ReadingVocab
    from retrieval.bm25 import BM25Retriever

    vocab = ReadingVocab.load(DEFAULT_BASE)
    world = generate_world(11, num_entities=30, heldout_fraction=0.0, names=vocab.pool("reserved"),
                           wording=vocab.wording)
    builder = PromptBuilder(load_tokenizer(DEFAULT_BASE), style="compact", default_top_n=2)
    return builder, BM25Retriever.from_passages(world.corpus), join_objectives(world.train[:40], 2, seed=3)[:10]


@pytest.mark.parametrize("workflow", ["memsearcher", "react"])
def test_evaluate_reports_coverage_of_replayed_episodes(demo_world, workflow):
    """Two-question demonstrations replayed through evaluate: clean ones search every question once
    per hop (coverage 1, one search per hop, no early answer); with one question skipped and its
    answer guessed (the demonstrator's "skip" flaw) half the questions go unsearched and every episode
    answers early. The keys evaluate reported before stay as they were."""
    from memsearcher_jax.data.demos import DemoConfig, make_demonstrations

    builder, retriever, rows = demo_world
    got = {}
    for name, cfg in (("clean", DemoConfig(0, 0, 0, workflow=workflow, max_turns=6, top_n=3)),
                      ("skip", DemoConfig(0, 0, 1.0, workflow=workflow, max_turns=6, early_several="skip", top_n=3))):
        demos = make_demonstrations(rows, builder, retriever, seed=0, config=cfg)
        runner = AgentRunner(builder, _ReplaySampler(demos, builder.eos_id), retriever,
                             AgentConfig(workflow=workflow, max_turns=6, default_top_n=2))
        got[name] = evaluate(runner, [d.row for d in demos], batch=4)
        hops = sum(o["hops"] for d in demos for o in d.row["objectives"])
        assert got[name]["searches_per_hop"] == pytest.approx(sum(d.trajectory.num_searches for d in demos) / hops)
    clean, skip = got["clean"], got["skip"]
    assert clean["coverage"] == clean["hop_coverage"] == 1.0 and clean["searches_per_hop"] == 1.0
    assert clean["early_answer_rate"] == 0.0 and clean["em"] == 1.0
    assert skip["coverage"] == 0.5 and skip["early_answer_rate"] == 1.0 and skip["searches_per_hop"] < 1.0
    assert clean["hops_per_question"] == skip["hops_per_question"] >= 1.0
    # Three passages per search (the demonstrator's top_n): react's history holds every one of them.
    assert clean["passages"] == pytest.approx(3 * clean["searches"]) and clean["passages_max"] >= clean["passages"]
    for key in ("em", "f1", "reward", "format_ok", "turns", "peak_tokens", "peak_tokens_max", "tokens_per_question",
                "searches", "prompt_tokens_by_turn", "trajectories", "results"):
        assert key in clean, key
    json.dumps({k: v for k, v in clean.items() if k in COVERAGE_KEYS})  # plain floats: results.json takes them


@pytest.fixture(scope="module")
def bench():
    return load_bench("paper_tables")


def test_the_bench_reads_the_shipped_bases_probe_and_context_window(bench):
    limit = bench.reading_limit(DEFAULT_BASE)
    assert list(limit["by_length"]) == [2, 8, 16] and limit["context_window"] == 4096
    # reading_v8 reads 99.6 / 97.5 / 93.7% at 2 / 8 / 16 passages: under 95% first at 16.
    assert limit["below_at"] == 16 and bench.reading_limit(DEFAULT_BASE, threshold=0.98)["below_at"] == 8
    assert bench.reading_limit(DEFAULT_BASE, threshold=0.5)["below_at"] is None
    assert bench.probe_at(limit, 5.5) == "97.5% at 8" and bench.probe_at(limit, 2) == "99.6% at 2"
    assert bench.probe_at(limit, 40).startswith("beyond the probe (93.7% at 16")
    assert bench.probe_at(json.loads(json.dumps(limit)), 9) == "93.7% at 16"  # as results.json holds it
    caption = bench.reading_caption(limit)
    assert "below 95% from 16 passages" in caption and "4096 tokens" in caption
    assert "no reading probe" in bench.reading_caption(bench.reading_limit("/nonexistent"))


def test_the_tables_report_coverage_and_reacts_history(bench):
    cell = {"em": 0.5, "peak_tokens": 900.0, "peak_tokens_max": 1500.0, "coverage": 0.75, "hop_coverage": 0.6,
            "searches_per_question": 1.25, "hops_per_question": 1.5, "searches_per_hop": 0.8333,
            "early_answer_rate": 0.4, "passages": 7.5, "passages_max": 20.0}
    old = {"em": 0.4, "peak_tokens": 300.0}  # a phase evaluated before coverage was reported
    results = {"react": {"grpo": {2: cell, 4: old}, "warm_start": {2: old}}, "memsearcher": {"grpo": {2: old}}}
    table = bench.table5(results, (2, 4))
    assert "| react | GRPO | 2 | 75.0 | 60.0 | 1.25 | 1.50 | 0.83 | 40.0 | 7.5 / 20 | 900 / 1500 |" in table
    assert table.count("\n") == 2  # header, rule, the one cell that has coverage
    limit = bench.reading_limit(DEFAULT_BASE)
    reading = bench.reading_table(results, limit, (2, 4))
    assert "| 2 | 7.5 / 20 | 900 / 1500 | 97.5% at 8 | beyond the probe (93.7% at 16) |" in reading
    assert reading.count("\n") == 2


def test_the_coverage_reward_pays_each_searched_question_by_hand():
    """rl.coverage_coef: a pair with both subjects searched gains the whole coefficient, a pair with
    one of two half of it, an episode with no search nothing; EM and F1 never move; 0 returns the
    very results."""
    from memsearcher_jax.qa_metrics import RewardResult
    from memsearcher_jax.rl.grpo import with_coverage

    trajs = [_episode(["bolin year", "Zumatek founder"]), _episode(["Bolin year"]), _episode([])]
    for t in trajs:
        t.subjects = ["Bolin", "Zumatek"]
    results = [RewardResult(reward=r, em=r, f1=r, format_ok=True, answer="x") for r in (1.0, 0.5, 0.5)]
    shaped = with_coverage(results, trajs, 0.4)
    assert [r.reward for r in shaped] == pytest.approx([1.4, 0.7, 0.5])
    assert [(r.em, r.f1) for r in shaped] == [(r.em, r.f1) for r in results]
    assert all(a is b for a, b in zip(with_coverage(results, trajs, 0.0), results))
