"""FAISS index construction and the saved-index directory layout.

Index types (all inner product, so unit vectors give cosine scores):
- "flat":     exact IndexFlatIP (the paper's choice; default).
- "ivf_flat": inverted lists over k-means cells, full vectors; `nlist`, `nprobe`.
- "ivf_pq":   inverted lists with product-quantised codes; `nlist`, `nprobe`, `pq_m`, `pq_nbits`.
- "hnsw":     graph search on full vectors; `hnsw_m`, `ef_construction`, `ef_search`.

A saved directory holds `manifest.json`, `index.faiss` (dense) or `bm25/` (BM25),
and `docs/` (a DocStore). The manifest records kind, encoder, dimension, count,
index type and parameters, so `serve-retriever --index DIR` needs nothing else.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np

from memsearcher_jax.errors import UserInputError

INDEX_TYPES = ("flat", "ivf_flat", "ivf_pq", "hnsw")
MANIFEST = "manifest.json"
FORMAT_VERSION = 1
# The entries an index directory's writers make, in one place: `index --overwrite` replaces
# exactly these (an index of the other kind's files included) and keeps anything else.
DOCS_DIR = "docs"
FAISS_FILE = "index.faiss"
BM25_DIR = "bm25"
INDEX_ENTRIES = (MANIFEST, DOCS_DIR, FAISS_FILE, BM25_DIR)


@dataclasses.dataclass(frozen=True)
class IndexConfig:
    type: str = "flat"
    nlist: int = 1024
    nprobe: int = 32
    pq_m: int = 16
    pq_nbits: int = 8
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    # IVF/PQ train on this many vectors (buffered from the start of the corpus).
    train_size: int = 262_144

    def __post_init__(self):
        if self.type not in INDEX_TYPES:
            raise ValueError(f"index type {self.type!r}; expected one of {INDEX_TYPES}")
        for name in ("nlist", "nprobe", "pq_m", "pq_nbits", "hnsw_m", "ef_construction", "ef_search", "train_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"index parameter {name}={getattr(self, name)} must be >= 1")

    @property
    def needs_training(self) -> bool:
        return self.type in ("ivf_flat", "ivf_pq")


def _faiss():
    import faiss

    return faiss


def new_index(dim: int, config: IndexConfig, n_train: int | None = None):
    """An empty FAISS index; `n_train` caps nlist so k-means has >= 39 points per cell."""
    faiss = _faiss()
    ip = faiss.METRIC_INNER_PRODUCT
    if config.type == "flat":
        return faiss.IndexFlatIP(dim)
    if config.type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, ip)
        index.hnsw.efConstruction = config.ef_construction
        index.hnsw.efSearch = config.ef_search
        return index
    nlist = config.nlist if n_train is None else max(1, min(config.nlist, n_train // 39))
    quantizer = faiss.IndexFlatIP(dim)
    if config.type == "ivf_flat":
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, ip)
    else:
        if dim % config.pq_m:
            raise ValueError(f"ivf_pq: dimension {dim} is not divisible by pq_m={config.pq_m}")
        index = faiss.IndexIVFPQ(quantizer, dim, nlist, config.pq_m, config.pq_nbits, ip)
    index.nprobe = min(config.nprobe, nlist)
    return index


class IndexBuilder:
    """Feed embeddings chunk by chunk; IVF types buffer `train_size` vectors, train, then add.

    vectors: [n, dim] float32 per `add` call. `finish()` returns the populated index.
    """

    def __init__(self, dim: int, config: IndexConfig):
        self.dim, self.config = dim, config
        self._index = None if config.needs_training else new_index(dim, config)
        self._buffer: list[np.ndarray] = []
        self._buffered = 0

    def add(self, vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"embeddings of shape {vectors.shape}; expected [n, {self.dim}]")
        if self._index is not None:
            self._index.add(vectors)
            return
        self._buffer.append(vectors)
        self._buffered += len(vectors)
        if self._buffered >= self.config.train_size:
            self._train_and_flush()

    def _train_and_flush(self) -> None:
        data = np.concatenate(self._buffer) if self._buffer else np.zeros((0, self.dim), np.float32)
        if len(data) == 0:
            raise ValueError("cannot train an IVF index on an empty corpus")
        train = data[: self.config.train_size]
        self._index = new_index(self.dim, self.config, n_train=len(train))
        used = _faiss().extract_index_ivf(self._index).nlist
        if used != self.config.nlist:  # k-means needs >= 39 vectors per cell: say so, and record what was built
            print(f"warning: nlist {self.config.nlist} lowered to {used} for {len(train)} training vectors "
                  "(k-means needs >= 39 per cell)", file=sys.stderr)
            self.config = dataclasses.replace(self.config, nlist=used)
        if self.config.type == "ivf_pq" and len(train) < 2 ** self.config.pq_nbits:
            raise ValueError(f"ivf_pq with pq_nbits={self.config.pq_nbits} needs >= {2 ** self.config.pq_nbits} "
                             f"training vectors, got {len(train)}; lower pq_nbits or use flat")
        self._index.train(train)
        self._index.add(data)
        self._buffer, self._buffered = [], 0

    def finish(self):
        if self._index is None:
            self._train_and_flush()
        return self._index


def build_index(vectors: np.ndarray, config: IndexConfig | None = None):
    """All embeddings at once: [N, dim] float32 -> populated FAISS index."""
    builder = IndexBuilder(vectors.shape[1], config or IndexConfig())
    builder.add(vectors)
    return builder.finish()


def set_search_params(index, config: IndexConfig) -> None:
    """Apply query-time knobs (nprobe / efSearch) after loading."""
    faiss = _faiss()
    if config.type in ("ivf_flat", "ivf_pq"):
        ivf = faiss.extract_index_ivf(index)
        ivf.nprobe = min(config.nprobe, ivf.nlist)
    elif config.type == "hnsw":
        index.hnsw.efSearch = config.ef_search


def write_manifest(out_dir: str, manifest: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    body = {"format_version": FORMAT_VERSION, **manifest}
    with open(os.path.join(out_dir, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(body, f, indent=2, sort_keys=True)


def read_manifest(index_dir: str) -> dict:
    path = os.path.join(index_dir, MANIFEST)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{index_dir!r} has no {MANIFEST}; expected a directory written by "
                                "`memsearcher-jax index`")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (ValueError, OSError) as e:  # JSON and UTF-8 errors are ValueErrors
        raise UserInputError(f"{path} cannot be read ({type(e).__name__}: {e}): the index is damaged; rebuild it "
                             "with `memsearcher-jax index`") from None
    if not isinstance(manifest, dict):
        raise UserInputError(f"{path}: expected a JSON object, got {type(manifest).__name__}; rebuild the index "
                             "with `memsearcher-jax index`")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise UserInputError(f"{path}: format_version {manifest.get('format_version')!r}; expected {FORMAT_VERSION}")
    if manifest.get("kind") not in ("dense", "bm25"):
        raise UserInputError(f"{path}: kind {manifest.get('kind')!r}; expected 'dense' or 'bm25'")
    return manifest
