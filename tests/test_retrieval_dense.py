"""Dense retrieval quality on a generated corpus with one known gold passage per query.

Thresholds. Each query names four attributes of its gold passage (city, kind of building,
material, and a paraphrase of the founder); every other passage differs in at least one of
(city, building, material, founder), and many share two or three. A keyword-free sentence
encoder that works at all puts the gold passage in the top 5 almost always (a random ranking
gets 5/800 = 0.6%), so flat recall@5 must be >= 0.95 and recall@1 >= 0.85. Approximate
indexes are compared to flat both on gold recall and on overlap with flat's exact top 5:
IVF-Flat (nprobe 4 of 20 cells) and HNSW lose at most 0.03 recall@5; IVF-PQ (48 x 6-bit
codes, lossy) at most 0.08.
"""
import numpy as np
import pytest

from retrieval.base import Hit
from retrieval.corpus import InMemoryDocs
from retrieval.dense import DenseRetriever, build_dense_index
from retrieval.encoder import DenseEncoder
from retrieval.index import IndexConfig, build_index, read_manifest
from retrieval.loading import load_retriever
from tests.assets import minilm_encoder_dir
from tests.synthetic_corpus import generate, recall_at_k

N_PASSAGES, N_QUERIES = 800, 200


@pytest.fixture(scope="module")
def setup():
    passages, queries, gold = generate(N_PASSAGES, seed=0)
    enc = DenseEncoder.from_pretrained(minilm_encoder_dir())
    vecs = enc.encode_passages([p["contents"] for p in passages])
    return passages, queries[:N_QUERIES], gold[:N_QUERIES], enc, vecs


def _retriever(setup, cfg):
    passages, _, _, enc, vecs = setup
    return DenseRetriever(build_index(vecs, cfg), InMemoryDocs(passages), enc, cfg)


def _overlap(a, b):
    return float(np.mean([len({h.id for h in x} & {h.id for h in y}) / max(len(y), 1) for x, y in zip(a, b)]))


def test_flat_recall_and_result_shape(setup):
    _, queries, gold, _, _ = setup
    flat = _retriever(setup, IndexConfig())
    res = flat.search(queries, top_n=5)
    r5, r1 = recall_at_k(res, gold, 5), recall_at_k(res, gold, 1)
    print(f"flat recall@5={r5:.3f} recall@1={r1:.3f}")
    assert r5 >= 0.95 and r1 >= 0.85, (r5, r1)
    assert all(len(h) == 5 for h in res)
    scores = [[x.score for x in h] for h in res]
    assert all(s == sorted(s, reverse=True) for s in scores)  # best first
    assert all(-1.0 - 1e-5 <= x <= 1.0 + 1e-5 for s in scores for x in s)  # cosine of unit vectors


@pytest.mark.parametrize("cfg, margin, min_overlap", [
    (IndexConfig("ivf_flat", nlist=20, nprobe=4), 0.03, 0.85),
    (IndexConfig("hnsw", hnsw_m=16, ef_search=32), 0.03, 0.95),
    (IndexConfig("ivf_pq", nlist=20, nprobe=4, pq_m=48, pq_nbits=6), 0.08, 0.6),
], ids=["ivf_flat", "hnsw", "ivf_pq"])
def test_approximate_indexes_within_margin_of_flat(setup, cfg, margin, min_overlap):
    _, queries, gold, _, _ = setup
    flat = _retriever(setup, IndexConfig()).search(queries, 5)
    approx = _retriever(setup, cfg).search(queries, 5)
    r_flat, r_approx, ov = recall_at_k(flat, gold, 5), recall_at_k(approx, gold, 5), _overlap(approx, flat)
    print(f"{cfg.type}: recall@5={r_approx:.3f} (flat {r_flat:.3f}), overlap with flat top-5={ov:.3f}")
    assert r_approx >= r_flat - margin
    assert ov >= min_overlap


def test_top_n_larger_than_corpus_and_empty_batch(setup):
    passages, _, _, enc, _ = setup
    tiny = DenseRetriever.build(passages[:3], enc)
    res = tiny.search(["a lighthouse", "a bridge"], top_n=10)
    assert [len(h) for h in res] == [3, 3]
    assert tiny.search([], 5) == []
    with pytest.raises(ValueError, match="top_n=0"):
        tiny.search(["x"], 0)


def test_streamed_build_save_load_matches_in_memory(setup, tmp_path):
    passages, queries, _, enc, vecs = setup
    out = str(tmp_path / "idx")
    cfg = IndexConfig("ivf_flat", nlist=8, nprobe=8, train_size=300)  # trains after the first chunks
    assert build_dense_index(iter(passages[:400]), enc, out, cfg, chunk_size=128, progress=False) == 400
    m = read_manifest(out)
    assert (m["kind"], m["dim"], m["count"], m["index_type"], m["encoder_name"]) == (
        "dense", 384, 400, "ivf_flat", "model")
    loaded = load_retriever(out)
    assert isinstance(loaded, DenseRetriever) and len(loaded) == 400
    # nprobe == nlist makes IVF exhaustive, so it must agree with exact search on the same vectors.
    exact = DenseRetriever(build_index(vecs[:400]), InMemoryDocs(passages[:400]), enc)
    a, b = loaded.search(queries[:20], 5), exact.search(queries[:20], 5)
    assert [[h.id for h in x] for x in a] == [[h.id for h in x] for x in b]
    np.testing.assert_allclose([[h.score for h in x] for x in a], [[h.score for h in x] for x in b], atol=1e-4)
    # save() of an in-memory retriever writes the same layout; loading it reproduces the hits.
    exact.save(str(tmp_path / "flat"))
    again = load_retriever(str(tmp_path / "flat"))
    assert again.search(queries[:3], 2) == exact.search(queries[:3], 2)
    assert isinstance(again.search(queries[:1], 1)[0][0], Hit)
