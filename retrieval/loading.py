"""Open any saved index directory as a `Retriever`, dispatching on its manifest's kind."""
from __future__ import annotations

import dataclasses

from retrieval.bm25 import BM25Retriever
from retrieval.dense import DenseRetriever
from retrieval.encoder import DenseEncoder, EncoderConfig
from retrieval.index import IndexConfig, read_manifest


def load_retriever(index_dir: str, *, encoder_dir: str | None = None, nprobe: int | None = None,
                   ef_search: int | None = None):
    """index_dir -> DenseRetriever or BM25Retriever.

    `encoder_dir` overrides the encoder path stored in the manifest (an index built on one
    machine, served on another); `nprobe` / `ef_search` override the query-time knobs.
    """
    m = read_manifest(index_dir)
    if m["kind"] == "bm25":
        return BM25Retriever.load(index_dir)
    enc_cfg = EncoderConfig(**m["encoder"])
    if encoder_dir is not None:
        enc_cfg = dataclasses.replace(enc_cfg, model_dir=encoder_dir)
    cfg = IndexConfig(**m["index"])
    overrides = {k: v for k, v in (("nprobe", nprobe), ("ef_search", ef_search)) if v is not None}
    cfg = dataclasses.replace(cfg, **overrides)
    return DenseRetriever.load(index_dir, encoder=DenseEncoder(enc_cfg), index_config=cfg)
