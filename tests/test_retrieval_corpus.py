"""Corpus reading, the memory-mapped doc store, BM25, and saved-index round trips."""
import json

import numpy as np
import pytest

from retrieval.base import Hit, Retriever
from retrieval.bm25 import BM25Retriever, build_bm25_index
from retrieval.corpus import CorpusFormatError, DocStore, ReadStats, read_corpus
from retrieval.index import IndexConfig, build_index, read_manifest
from retrieval.loading import load_retriever
from tests.synthetic_corpus import generate, recall_at_k


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_read_corpus_streams_passages_and_defaults_id(tmp_path):
    f = _write(tmp_path / "c.jsonl", [
        json.dumps({"id": "7", "contents": '"Paris"\nParis is in France.', "extra": 1}),
        "",
        json.dumps({"contents": "No id\ntext"}),
    ])
    got = list(read_corpus(f))
    assert got == [{"id": "7", "contents": '"Paris"\nParis is in France.'}, {"id": "2", "contents": "No id\ntext"}]


@pytest.mark.parametrize("bad, needle", [
    ("{not json", "line 2: not valid JSON"),
    (json.dumps({"id": "1", "text": "x"}), "line 2: missing string field 'contents'"),
    (json.dumps(["a", "b"]), "line 2: expected a JSON object"),
])
def test_bad_corpus_line_names_the_line(tmp_path, bad, needle):
    f = _write(tmp_path / "c.jsonl", [json.dumps({"id": "0", "contents": "a\nb"}), bad,
                                      json.dumps({"id": "2", "contents": "c\nd"})])
    with pytest.raises(CorpusFormatError, match=needle):
        list(read_corpus(f))
    stats = ReadStats()
    got = list(read_corpus(f, skip_bad=True, stats=stats))
    assert [p["id"] for p in got] == ["0", "2"]
    assert (stats.lines, stats.passages, stats.skipped) == (3, 2, 1)
    assert "line 2" in stats.first_errors[0]


def test_doc_store_round_trip_unicode_and_random_access(tmp_path):
    passages = [{"id": str(i), "contents": f"Title {i} – 東京\ntext with \"quotes\" and \\n {i}"} for i in range(500)]
    assert DocStore.write(passages, str(tmp_path / "docs")) == 500
    store = DocStore(str(tmp_path / "docs"))
    assert len(store) == 500
    for i in (0, 17, 499):
        assert store.get(i) == passages[i]
    with pytest.raises(IndexError, match="outside 0..499"):
        store.get(500)
    # A truncated data file is detected on open rather than returning garbage.
    docs = tmp_path / "docs" / "docs.jsonl"
    docs.write_bytes(docs.read_bytes()[:-10])
    with pytest.raises(ValueError, match="truncated"):
        DocStore(str(tmp_path / "docs"))


def test_bm25_from_passages_ranks_the_matching_passage_first():
    r = BM25Retriever.from_passages([
        {"id": "a", "contents": "Paris\nParis is the capital of France."},
        {"id": "b", "contents": "Berlin\nBerlin is the capital of Germany."},
        {"id": "c", "contents": "Cats\nCats are small mammals."},
    ])
    assert isinstance(r, Retriever)
    res = r.search(["capital of germany", "zzzz unknownword", "small cats"], top_n=2)
    assert [h.id for h in res[0]] == ["b", "a"] and res[0][0].score > res[0][1].score > 0
    assert res[1] == []  # no shared term: nothing, rather than arbitrary passages
    assert res[2][0] == Hit(id="c", contents="Cats\nCats are small mammals.", score=res[2][0].score)


def test_bm25_saved_directory_round_trip(tmp_path):
    passages, queries, gold = generate(300, seed=1)
    corpus = _write(tmp_path / "c.jsonl", [json.dumps(p) for p in passages])
    assert build_bm25_index(read_corpus(corpus), str(tmp_path / "idx")) == 300
    m = read_manifest(str(tmp_path / "idx"))
    assert (m["kind"], m["count"], m["index_type"]) == ("bm25", 300, "bm25")
    loaded = load_retriever(str(tmp_path / "idx"))
    mem = BM25Retriever.from_passages(passages)
    a, b = loaded.search(queries[:50], 5), mem.search(queries[:50], 5)
    assert [[h.id for h in x] for x in a] == [[h.id for h in x] for x in b]
    assert recall_at_k(a, gold[:50], 5) > 0.9


def test_index_config_rejects_unknown_type_and_bad_params():
    with pytest.raises(ValueError, match="expected one of"):
        IndexConfig(type="annoy")
    with pytest.raises(ValueError, match="nprobe=0"):
        IndexConfig(type="ivf_flat", nprobe=0)


def test_flat_index_is_exact_inner_product():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 16)).astype(np.float32)
    q = rng.normal(size=(5, 16)).astype(np.float32)
    scores, rows = build_index(x).search(q, 3)
    expect = np.argsort(-(q @ x.T), axis=1)[:, :3]
    np.testing.assert_array_equal(rows, expect)
    np.testing.assert_allclose(scores, np.take_along_axis(q @ x.T, expect, 1), rtol=1e-5)


def test_missing_manifest_is_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        load_retriever(str(tmp_path))


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=0, max_size=20), st.text(min_size=0, max_size=200)), max_size=30))
def test_doc_store_round_trips_arbitrary_text(tmp_path_factory, rows):
    passages = [{"id": i, "contents": c} for i, c in rows]
    d = str(tmp_path_factory.mktemp("store"))
    assert DocStore.write(passages, d) == len(passages)
    store = DocStore(d)
    assert [store.get(k) for k in range(len(store))] == passages
    store.close()
