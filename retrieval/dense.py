"""Dense retrieval: DenseEncoder + FAISS index + document store behind `Retriever`.

In process, on a small corpus:

    from retrieval.dense import DenseRetriever
    from retrieval.encoder import DenseEncoder
    enc = DenseEncoder.from_pretrained(minilm_encoder_dir())
    r = DenseRetriever.build([{"id": "1", "contents": "Paris\\nParis is ..."}, ...], enc)
    hits = r.search(["capital of france"], top_n=5)      # [[Hit(id, contents, score), ...]]

From a saved directory (what `memsearcher-jax index` writes):

    r = DenseRetriever.load("indexes/wiki18-e5")          # encoder dir from the manifest
"""
from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from memsearcher_jax.errors import UserInputError
from retrieval.base import Hit, hits_wanted
from retrieval.corpus import DocLookup, DocStore, DocStoreWriter, InMemoryDocs
from retrieval.encoder import DenseEncoder, EncoderConfig
from retrieval.index import (
    DOCS_DIR,
    FAISS_FILE as INDEX_FILE,
    IndexBuilder,
    IndexConfig,
    build_index,
    read_manifest,
    set_search_params,
    write_manifest,
)


class DenseRetriever:
    """search(queries, top_n) -> one list of Hit per query, best (highest inner product) first."""

    def __init__(self, index, docs: DocLookup, encoder: DenseEncoder, index_config: IndexConfig | None = None):
        if index.ntotal != len(docs):
            raise ValueError(f"index holds {index.ntotal} vectors but the document store has {len(docs)} passages")
        if index.d != encoder.dim:
            raise ValueError(f"index dimension {index.d} does not match encoder dimension {encoder.dim}")
        self.index, self.docs, self.encoder = index, docs, encoder
        self.index_config = index_config or IndexConfig()
        self._lock = threading.Lock()  # the jitted encoder and FAISS search run one batch at a time

    def __len__(self) -> int:
        return len(self.docs)

    @classmethod
    def build(cls, passages: Sequence[dict], encoder: DenseEncoder, index_config: IndexConfig | None = None,
              progress: bool = False) -> DenseRetriever:
        """Encode passages (`{"id", "contents"}`) in memory and index them."""
        docs = InMemoryDocs(passages)
        cfg = index_config or IndexConfig()
        vecs = encoder.encode_passages([docs.get(i)["contents"] for i in range(len(docs))], progress=progress)
        return cls(build_index(vecs, cfg), docs, encoder, cfg)

    def search(self, queries: list[str], top_n: int) -> list[list[Hit]]:
        k = hits_wanted(top_n, len(self.docs))
        if not queries:
            return []
        with self._lock:
            q = self.encoder.encode_queries(queries)
            scores, rows = self.index.search(np.ascontiguousarray(q), k)
        out = []
        for srow, rrow in zip(scores, rows):
            hits = []
            for s, r in zip(srow, rrow):
                if r < 0:  # IVF/HNSW may return fewer than k
                    continue
                d = self.docs.get(int(r))
                hits.append(Hit(id=d["id"], contents=d["contents"], score=float(s)))
            out.append(hits)
        return out

    def save(self, out_dir: str) -> None:
        import faiss

        os.makedirs(out_dir, exist_ok=True)
        faiss.write_index(self.index, os.path.join(out_dir, INDEX_FILE))
        if isinstance(self.docs, InMemoryDocs):
            self.docs.write(os.path.join(out_dir, DOCS_DIR))
        else:
            DocStore.write((self.docs.get(i) for i in range(len(self.docs))), os.path.join(out_dir, DOCS_DIR))
        _write_dense_manifest(out_dir, self.encoder.config, self.index_config, self.index.ntotal, self.encoder.dim)

    @classmethod
    def load(cls, index_dir: str, encoder: DenseEncoder | None = None, mmap: bool = True,
             index_config: IndexConfig | None = None) -> DenseRetriever:
        """Open a saved directory; `encoder` defaults to the one recorded in the manifest."""
        import faiss

        m = read_manifest(index_dir)
        if m["kind"] != "dense":
            raise ValueError(f"{index_dir!r} holds a {m['kind']!r} index; use retrieval.load_retriever")
        cfg = index_config or IndexConfig(**m["index"])
        if encoder is None:
            encoder = DenseEncoder(EncoderConfig(**m["encoder"]))
        flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap and cfg.type == "flat" else 0
        path = os.path.join(index_dir, INDEX_FILE)
        try:
            index = faiss.read_index(path, flags)
        except RuntimeError as e:  # faiss reports a short or damaged file as a RuntimeError
            detail = (str(e).strip().splitlines() or [""])[-1][:200]
            raise UserInputError(f"{path} cannot be read ({detail}): it is truncated or damaged; rebuild the index "
                                 "with `memsearcher-jax index`") from None
        set_search_params(index, cfg)
        return cls(index, DocStore(os.path.join(index_dir, DOCS_DIR)), encoder, cfg)


def _write_dense_manifest(out_dir: str, enc: EncoderConfig, cfg: IndexConfig, count: int, dim: int) -> None:
    write_manifest(out_dir, {
        "kind": "dense", "encoder_name": enc.name, "encoder": enc.to_json(), "dim": int(dim),
        "count": int(count), "index_type": cfg.type, "index": dataclasses.asdict(cfg),
    })


def build_dense_index(passages: Iterable[dict], encoder: DenseEncoder, out_dir: str,
                      index_config: IndexConfig | None = None, chunk_size: int = 8192,
                      progress: bool = True, callback: Callable[[int], object] | None = None) -> int:
    """Stream a corpus once: write the doc store, encode in chunks, add to FAISS, save. Returns the count.

    Memory is one chunk of text plus the index itself (plus `train_size` vectors for IVF types).
    The progress bar (passages, passages/s) and `callback(n)` advance after every encoder batch,
    not per chunk; a chunk is sorted by length as a whole, so its batches are homogeneous.
    """
    import faiss

    cfg = index_config or IndexConfig()
    os.makedirs(out_dir, exist_ok=True)
    writer = DocStoreWriter(os.path.join(out_dir, DOCS_DIR))
    builder = IndexBuilder(encoder.dim, cfg)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(desc="index", unit="psg")
    chunk: list[str] = []

    def on_batch(n: int) -> None:
        if bar is not None:
            bar.update(n)
        if callback is not None:
            callback(n)

    def flush():
        builder.add(encoder.encode_passages(chunk, callback=on_batch))
        chunk.clear()

    for p in passages:
        writer.add(p)
        chunk.append(p["contents"])
        if len(chunk) >= chunk_size:
            flush()
    if chunk:
        flush()
    count = writer.close()
    if bar is not None:
        bar.close()
    if count == 0:
        raise ValueError("the corpus has no passages; nothing to index")
    index = builder.finish()
    faiss.write_index(index, os.path.join(out_dir, INDEX_FILE))
    _write_dense_manifest(out_dir, encoder.config, builder.config, index.ntotal, encoder.dim)  # nlist as built
    return count
