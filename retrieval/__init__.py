"""Retrieval for memsearcher-jax: corpora, a JAX dense encoder, FAISS/BM25 indexes, HTTP service and client.

The agent only sees the small `Retriever` interface in `retrieval.base`:
`search(queries: list[str], top_n: int) -> list[list[Hit]]`, batched over all live trajectories.

In process, on a tiny corpus (no encoder, no files):

    from retrieval.bm25 import BM25Retriever
    r = BM25Retriever.from_passages([{"id": "1", "contents": "Paris\\nParis is the capital of France."}])
    r.search(["capital of france"], top_n=5)

Dense, with the JAX encoder:

    from retrieval.dense import DenseRetriever
    from retrieval.encoder import DenseEncoder
    r = DenseRetriever.build(passages, DenseEncoder.from_pretrained("/path/to/e5-base-v2"))

A saved index directory (`memsearcher-jax index ...`): `retrieval.load_retriever(DIR)`.
A running server (ours, MemSearcher's or Search-R1's): `retrieval.client.HTTPRetriever(URL, api=...)`.
Modules: corpus (jsonl reader, mmap doc store), bert + encoder (JAX BERT, pooling conventions),
index (FAISS types, manifest, the directory's entries), staging (an index built beside --out and
moved in when whole), dense, bm25, loading, server, client, cli. The synthetic test corpus
lives in tests/synthetic_corpus.py.
"""
from retrieval.base import ERROR_HIT_ID, Hit, Retriever


def load_retriever(index_dir: str, **kwargs):
    """Open a saved index directory (dense or BM25); see retrieval.loading.load_retriever."""
    from retrieval.loading import load_retriever as _load

    return _load(index_dir, **kwargs)


__all__ = ["ERROR_HIT_ID", "Hit", "Retriever", "load_retriever"]
