"""BM25 retrieval (bm25s): the encoder-free `Retriever`.

    from retrieval.bm25 import BM25Retriever
    r = BM25Retriever.from_passages([{"id": "1", "contents": "Paris\\nParis is the capital of France."}, ...])
    r.search(["capital of france"], top_n=3)   # [[Hit(id="1", contents=..., score=...)]]

Passages that share no term with the query are not returned, so a list may be shorter than top_n.
Saved layout: `manifest.json` (kind "bm25"), `bm25/` (bm25s arrays, memory-mapped on load), `docs/`.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence

import numpy as np

from memsearcher_jax.errors import UserInputError
from retrieval.base import Hit, hits_wanted
from retrieval.corpus import DocLookup, DocStore, DocStoreWriter, InMemoryDocs
from retrieval.index import BM25_DIR, DOCS_DIR, read_manifest, write_manifest


def _bm25s():
    """bm25s, imported lazily (it is heavy). It sets its own logger to DEBUG on import and then
    logs an INFO line for every empty query; a rollout can send many, and they are harmless."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


def _tokenize(texts: Sequence[str], return_ids: bool):
    return _bm25s().tokenize(list(texts), stopwords="en", return_ids=return_ids, show_progress=False)


class BM25Retriever:
    def __init__(self, model, docs: DocLookup):
        self.model, self.docs = model, docs
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.docs)

    @classmethod
    def from_passages(cls, passages: Sequence[dict], k1: float = 1.5, b: float = 0.75) -> BM25Retriever:
        """Index `{"id", "contents"}` passages in memory."""
        docs = InMemoryDocs(passages)
        if len(docs) == 0:
            raise ValueError("BM25Retriever.from_passages: no passages to index")
        return cls(_index([docs.get(i)["contents"] for i in range(len(docs))], k1, b), docs)

    def search(self, queries: list[str], top_n: int) -> list[list[Hit]]:
        k = hits_wanted(top_n, len(self.docs))
        if not queries:
            return []
        vocab = self.model.vocab_dict
        # Unknown terms are dropped: bm25s would look them up in its vocabulary and fail.
        tokens = [[t for t in q if t in vocab] for q in _tokenize(queries, return_ids=False)]
        with self._lock:
            rows, scores = self.model.retrieve(tokens, k=k, show_progress=False, n_threads=0)
        out = []
        for rrow, srow in zip(np.asarray(rows), np.asarray(scores)):
            out.append([Hit(id=(d := self.docs.get(int(r)))["id"], contents=d["contents"], score=float(s))
                        for r, s in zip(rrow, srow) if s > 0])
        return out

    def save(self, out_dir: str) -> None:
        os.makedirs(out_dir, exist_ok=True)
        self.model.save(os.path.join(out_dir, BM25_DIR), show_progress=False)
        DocStore.write((self.docs.get(i) for i in range(len(self.docs))), os.path.join(out_dir, DOCS_DIR))
        _write_manifest(out_dir, len(self.docs), self.model)

    @classmethod
    def load(cls, index_dir: str, mmap: bool = True) -> BM25Retriever:
        bm25s = _bm25s()
        m = read_manifest(index_dir)
        if m["kind"] != "bm25":
            raise ValueError(f"{index_dir!r} holds a {m['kind']!r} index, not bm25")
        try:
            model = bm25s.BM25.load(os.path.join(index_dir, BM25_DIR), mmap=mmap, show_progress=False)
            docs = DocStore(os.path.join(index_dir, DOCS_DIR))
        except (ValueError, OSError, KeyError, EOFError) as e:  # a damaged array, JSON or store file
            where = _unreadable_file(index_dir) or f"a file in {os.path.join(index_dir, BM25_DIR)}"
            raise UserInputError(f"the BM25 index in {index_dir} cannot be read: {where} is damaged or missing "
                                 f"({type(e).__name__}: {str(e)[:200]}); rebuild it with `memsearcher-jax index`"
                                 ) from None
        return cls(model, docs)


def _unreadable_file(index_dir: str) -> str | None:
    """The first file of a saved BM25 index that does not parse (bm25s's own errors name none)."""
    import json

    from retrieval.corpus import DocStore

    for sub in (BM25_DIR, DOCS_DIR):
        folder = os.path.join(index_dir, sub)
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        for name in names:
            path = os.path.join(folder, name)
            try:
                if name.endswith(".npy"):
                    np.load(path, mmap_mode="r")
                elif name.endswith(".json"):
                    with open(path, encoding="utf-8") as f:
                        json.load(f)
            except (ValueError, OSError, EOFError):
                return path
    docs = os.path.join(index_dir, DOCS_DIR)
    try:
        DocStore(docs).close()
    except (ValueError, OSError):
        return os.path.join(docs, DocStore.DOCS)
    return None


def _index(texts: list[str], k1: float = 1.5, b: float = 0.75):
    tokens = _tokenize(texts, return_ids=True)
    if not tokens.vocab:  # bm25s would fail with "max() arg is an empty sequence"
        raise UserInputError(f"none of the {len(texts)} passages holds a word BM25 can index (every word is an "
                             "English stopword or punctuation): give passages with text")
    model = _bm25s().BM25(k1=k1, b=b)
    model.index(tokens, show_progress=False)
    return model


def _write_manifest(out_dir: str, count: int, model) -> None:
    write_manifest(out_dir, {"kind": "bm25", "encoder_name": None, "encoder": None, "dim": None,
                             "count": int(count), "index_type": "bm25",
                             "index": {"k1": float(model.k1), "b": float(model.b)}})


def build_bm25_index(passages: Iterable[dict], out_dir: str, k1: float = 1.5, b: float = 0.75) -> int:
    """Stream passages into the doc store, then index their text with bm25s (which holds tokens in RAM)."""
    writer = DocStoreWriter(os.path.join(out_dir, DOCS_DIR))
    texts = []
    for p in passages:
        writer.add(p)
        texts.append(p["contents"])
    count = writer.close()
    if count == 0:
        raise ValueError("the corpus has no passages; nothing to index")
    model = _index(texts, k1, b)
    del texts
    model.save(os.path.join(out_dir, BM25_DIR), show_progress=False)
    _write_manifest(out_dir, count, model)
    return count
