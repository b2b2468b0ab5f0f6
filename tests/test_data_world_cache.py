"""prepare_world: builds once, reuses after, never leaves a half-written entry."""
import json
import os

import pytest

from memsearcher_jax.data import world_cache
from memsearcher_jax.data.synthetic import load_world


def test_build_then_reuse(tmp_path, monkeypatch):
    paths = world_cache.prepare_world(str(tmp_path), seed=2, num_entities=30, extra_texts=["You are an agent."])
    world = load_world(paths.world_dir)
    assert len(world.corpus) == 30
    with open(paths.stats) as f:
        stats = json.load(f)
    assert stats["passages"] == 30 and stats["train_questions"] == len(world.train) > 0
    assert 0 < stats["mean_question_tokens"] < stats["mean_passage_tokens"]
    assert os.path.isfile(os.path.join(paths.tokenizer_dir, "tokenizer_config.json"))

    def boom(*a, **k):
        raise AssertionError("rebuilt a cached world")

    monkeypatch.setattr(world_cache, "_build", boom)
    again = world_cache.prepare_world(str(tmp_path), seed=2, num_entities=30, extra_texts=["You are an agent."])
    assert again == paths
    # Other arguments are other entries (and would need a build).
    with pytest.raises(AssertionError, match="rebuilt"):
        world_cache.prepare_world(str(tmp_path), seed=2, num_entities=30, extra_texts=["Other prompt."])
    assert [d for d in os.listdir(tmp_path) if d.startswith(".tmp-")] == []


def test_failed_build_leaves_nothing(tmp_path, monkeypatch):
    def fail(*a, **k):
        raise RuntimeError("tokenizer crashed")

    monkeypatch.setattr(world_cache, "train_tokenizer", fail)
    with pytest.raises(RuntimeError, match="tokenizer crashed"):
        world_cache.prepare_world(str(tmp_path), seed=1, num_entities=20)
    assert os.listdir(tmp_path) == []


def test_lost_race_uses_winner(tmp_path, monkeypatch):
    # Another writer finishes first: our rename fails, and the winner's entry is used.
    real_build = world_cache._build

    def build_and_lose(tmp, *args):
        real_build(tmp, *args)
        final = os.path.join(str(tmp_path), world_cache.cache_key(*args))
        real_build(final + ".w", *args)
        os.rename(final + ".w", final)

    monkeypatch.setattr(world_cache, "_build", build_and_lose)
    paths = world_cache.prepare_world(str(tmp_path), seed=4, num_entities=20)
    assert load_world(paths.world_dir).seed == 4
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(paths.root)]


def test_whole_name_tokens_and_fact_split_are_their_own_entries(tmp_path):
    from tokenizers import Tokenizer

    pieces = world_cache.prepare_world(str(tmp_path), seed=2, num_entities=40)
    whole = world_cache.prepare_world(str(tmp_path), seed=2, num_entities=40, whole_names=True)
    by_fact = world_cache.prepare_world(str(tmp_path), seed=2, num_entities=40, heldout_by="fact")
    assert len({pieces.world_dir, whole.world_dir, by_fact.world_dir}) == 3
    names = [p["contents"].split("\n")[0] for p in load_world(pieces.world_dir).corpus]

    def tokens_per_name(paths):
        tok = Tokenizer.from_file(os.path.join(paths.tokenizer_dir, "tokenizer.json"))
        return sum(len(tok.encode(" " + n).ids) for n in names) / len(names)

    # Syllable pieces by default; whole names let BPE merge them (fewer tokens per name).
    assert tokens_per_name(whole) < tokens_per_name(pieces)
    assert load_world(by_fact.world_dir).corpus == load_world(pieces.world_dir).corpus


def test_an_edited_template_is_a_new_entry(tmp_path, monkeypatch):
    # The key holds the world's wording, not only the arguments: a reworded sentence must not
    # reuse a world (and tokenizer) written in the old one.
    from memsearcher_jax.data import synthetic

    before = world_cache.prepare_world(str(tmp_path), seed=3, num_entities=20)
    person = dict(synthetic.ONE_HOP["person"])
    question, query, _ = person["works_for"]
    person["works_for"] = (question, query, "{s} works for the company called {a}.")
    monkeypatch.setitem(synthetic.ONE_HOP, "person", person)
    after = world_cache.prepare_world(str(tmp_path), seed=3, num_entities=20)
    assert after.root != before.root
    texts = [p["contents"] for p in load_world(after.world_dir).corpus]
    assert any("works for the company called" in t for t in texts)
    assert not any("works for the company called" in t for t in (p["contents"] for p in
                                                                 load_world(before.world_dir).corpus))
