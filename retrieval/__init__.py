"""Retrieval for memsearcher-jax: corpora, a JAX dense encoder, FAISS/BM25 indexes, HTTP service and client.

The agent only sees the small `Retriever` interface in `retrieval.base`.
"""
from retrieval.base import Hit, Retriever

__all__ = ["Hit", "Retriever"]
