"""The synthetic world: deterministic, leak-free splits, answers grounded in gold passages."""
import json
import re

import numpy as np
import pytest

from memsearcher_jax.data.synthetic import World, generate_world, load_world, save_world


@pytest.fixture(scope="module")
def world() -> World:
    return generate_world(seed=0)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def test_same_seed_same_world_and_different_seed_differs(world):
    again = generate_world(seed=0)
    assert again.corpus == world.corpus and again.train == world.train and again.heldout == world.heldout
    other = generate_world(seed=1)
    assert other.corpus != world.corpus
    assert {r["question"] for r in other.train} != {r["question"] for r in world.train}


def test_sizes_follow_num_entities():
    small = generate_world(seed=3, num_entities=20)
    big = generate_world(seed=3, num_entities=200)
    assert len(small.corpus) == 20 and len(big.corpus) == 200
    assert len(big.train) > 5 * len(small.train) / 2


def test_splits_disjoint_and_both_hops_present(world):
    train_q = [r["question"] for r in world.train]
    held_q = [r["question"] for r in world.heldout]
    assert len(set(train_q)) == len(train_q) and len(set(held_q)) == len(held_q)
    assert not set(train_q) & set(held_q)
    ids = [r["id"] for r in world.train + world.heldout]
    assert len(set(ids)) == len(ids)
    for split in (world.train, world.heldout):
        assert {r["hops"] for r in split} == {1, 2}


@pytest.fixture(scope="module", params=["entity", "fact"])
def split_world(request) -> tuple[str, World]:
    return request.param, generate_world(seed=0, heldout_by=request.param)


def test_heldout_reads_a_fact_no_training_question_reads(split_world):
    kind, world = split_world
    # A fact = (entity, relation). Training questions must never read a held-out question's
    # unseen fact, so held-out accuracy measures retrieval, not memorisation.
    def facts(row):
        rels = row["relation"].split("/")
        ents = [row["subject"]] + ([row["intermediate"]] if row["hops"] == 2 else [])
        return set(zip(ents, rels))

    seen = set().union(*(facts(r) for r in world.train))
    for row in world.heldout:
        assert facts(row) - seen, row["question"]
    # And (entity split) the held-out 2-hop chains are not chains used in training; a fact split
    # may reuse a chain's first hop, never its held-out fact (checked above).
    if kind == "fact":
        return
    train_chains = {(r["subject"], r["intermediate"]) for r in world.train if r["hops"] == 2}
    held_chains = {(r["subject"], r["intermediate"]) for r in world.heldout if r["hops"] == 2}
    assert not train_chains & held_chains


def test_questions_normalised(world):
    for row in world.train + world.heldout:
        q = row["question"]
        assert q == q.strip() and q.endswith("?")
        assert row["golden_answers"] and all(isinstance(a, str) and a for a in row["golden_answers"])


def test_gold_answer_appears_in_its_gold_passage(world):
    passages = {p["id"]: p for p in world.corpus}
    for row in world.train + world.heldout:
        last = passages[row["gold_passage_ids"][-1]]["contents"]
        assert row["golden_answers"][0] in _words(last) or row["golden_answers"][0] in last
        assert row["facts"][-1] in last  # the supporting sentence is verbatim in the passage
        for fact, pid in zip(row["facts"], row["gold_passage_ids"]):
            assert fact in passages[pid]["contents"]


def test_two_hop_facts_in_two_different_passages(world):
    passages = {p["id"]: p for p in world.corpus}
    two_hop = [r for r in world.train + world.heldout if r["hops"] == 2]
    assert len(two_hop) > 50
    for row in two_hop:
        first, second = row["gold_passage_ids"]
        assert first != second
        p1, p2 = passages[first]["contents"], passages[second]["contents"]
        # Hop 1 names the intermediate entity; only hop 2 holds the answer.
        assert row["intermediate"] in _words(p1) or row["intermediate"] in p1
        assert row["golden_answers"][0].lower() not in p1.lower()
        assert p2.split("\n")[0] == row["intermediate"]  # hop 2 is the intermediate's own passage
        assert row["golden_answers"][0].lower() not in row["question"].lower()


def test_corpus_layout(world):
    for p in world.corpus:
        assert set(p) == {"id", "contents"}
        title, text = p["contents"].split("\n", 1)
        assert title and text.startswith(title)
    # Titles (entity names) are unique, so a name query has one right passage.
    titles = [p["contents"].split("\n")[0] for p in world.corpus]
    assert len(set(titles)) == len(titles)


def test_bm25_finds_each_hop_passage_from_its_query(world):
    bm25s = pytest.importorskip("bm25s")
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([p["contents"] for p in world.corpus], show_progress=False),
                    show_progress=False)
    queries, gold = [], []
    for row in world.train + world.heldout:
        for q, pid in zip(row["queries"], row["gold_passage_ids"]):
            queries.append(q)
            gold.append(int(pid))
    top, _ = retriever.retrieve(bm25s.tokenize(queries, show_progress=False), k=1, show_progress=False)
    assert np.mean(top[:, 0] == np.array(gold)) == 1.0


def test_save_and_load_round_trip(world, tmp_path):
    paths = save_world(world, str(tmp_path))
    for key in ("corpus", "train", "heldout"):
        with open(paths[key]) as f:
            first = json.loads(f.readline())
        assert "id" in first
    loaded = load_world(str(tmp_path))
    assert loaded == world


def test_load_world_names_missing_files(tmp_path):
    (tmp_path / "corpus.jsonl").write_text('{"id": "0", "contents": "A\\nA."}\n')
    with pytest.raises(FileNotFoundError, match=r"train\.jsonl.*synthetic world directory"):
        load_world(str(tmp_path))


def test_fact_split_shares_names_but_not_facts():
    by_entity, by_fact = generate_world(seed=0), generate_world(seed=0, heldout_by="fact")
    assert by_fact.corpus == by_entity.corpus  # the same world, split differently
    assert sorted(r["question"] for r in by_fact.train + by_fact.heldout) == \
        sorted(r["question"] for r in by_entity.train + by_entity.heldout)
    train_subjects = {r["subject"] for r in by_fact.train}
    shared = sum(r["subject"] in train_subjects for r in by_fact.heldout) / len(by_fact.heldout)
    assert shared > 0.9  # held-out questions ask about entities training questions ask about
    entity_shared = sum(r["subject"] in {t["subject"] for t in by_entity.train} for r in by_entity.heldout)
    assert entity_shared / len(by_entity.heldout) < shared
    assert 0.1 < len(by_fact.heldout) / len(by_fact.train + by_fact.heldout) < 0.5
    with pytest.raises(ValueError, match="heldout_by"):
        generate_world(seed=0, heldout_by="random")


def test_question_split_holds_out_questions_not_facts():
    by_entity, by_q = generate_world(seed=0), generate_world(seed=0, heldout_by="question")
    assert by_q.corpus == by_entity.corpus
    train_qs, held_qs = {r["question"] for r in by_q.train}, {r["question"] for r in by_q.heldout}
    assert not train_qs & held_qs  # no question in both splits
    assert train_qs | held_qs == {r["question"] for r in by_entity.train + by_entity.heldout}
    n = len(by_q.train) + len(by_q.heldout)
    assert len(by_q.heldout) == round(0.15 * n)
    # Unlike the entity split, most held-out facts are read by some training question as well.
    def facts(row):
        ents = [row["subject"]] + ([row["intermediate"]] if row["hops"] == 2 else [])
        return set(zip(ents, row["relation"].split("/")))

    seen = set().union(*(facts(r) for r in by_q.train))
    covered = sum(facts(r) <= seen for r in by_q.heldout) / len(by_q.heldout)
    assert covered > 0.5
    assert {r["hops"] for r in by_q.heldout} == {1, 2}
    assert generate_world(seed=0, heldout_by="question").heldout == by_q.heldout  # seeded


def test_wording_v2_rewords_two_sentences_and_nothing_else():
    from memsearcher_jax.data.synthetic import ONE_HOP, REWORDED, one_hop_templates

    v1, v2 = generate_world(3, num_entities=40, wording="v1"), generate_world(3, num_entities=40, wording="v2")
    assert v1.entities == v2.entities
    assert [(r["question"], r["golden_answers"], r["queries"]) for r in v1.train + v1.heldout] == \
        [(r["question"], r["golden_answers"], r["queries"]) for r in v2.train + v2.heldout]
    for old, new in zip(v1.corpus, v2.corpus):
        name = old["contents"].split("\n")[0]
        e = v1.entities[name]
        expected = old["contents"]
        for (etype, rel), sentence in REWORDED["v2"].items():
            if e["type"] == etype:
                was = one_hop_templates("v1")[etype][rel][2].format(s=name, a=e[rel])
                assert was in expected
                expected = expected.replace(was, sentence.format(s=name, a=e[rel]))
        assert new["contents"] == expected
    assert sum("works for the company called" in p["contents"] for p in v2.corpus) == \
        sum(e["type"] == "person" for e in v2.entities.values())
    assert any("makes the product called" in p["contents"] for p in v2.corpus)
    # A 2-hop question's facts are the reworded sentences too.
    wf = next(r for r in v2.train + v2.heldout if r["relation"].startswith("works_for/"))
    assert "works for the company called" in wf["facts"][0]
    assert one_hop_templates("v1") == ONE_HOP
    with pytest.raises(ValueError, match=r"wording 'v9'.*v1, v2"):
        generate_world(3, num_entities=40, wording="v9")
