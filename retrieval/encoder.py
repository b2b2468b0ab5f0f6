"""Dense text encoder: tokenizer + JAX BERT + pooling, with e5 and sentence-transformers conventions.

    enc = DenseEncoder.from_pretrained(minilm_encoder_dir())          # convention="auto"
    q = enc.encode_queries(["who wrote hamlet"])                       # [1, 384] float32, unit norm
    p = enc.encode_passages(texts, progress=True)                      # [N, 384]

Conventions:
- "e5": "query: " / "passage: " prefixes, mean pooling over the attention mask, L2 norm
  (e5-base-v2, the paper's encoder).
- "sentence-transformers": no prefixes, mean pooling, L2 norm when the checkpoint's
  modules.json lists a Normalize module (all-MiniLM-L6-v2 does).
- "auto": sentence-transformers when modules.json exists, e5 when the directory name has "e5".

Shapes are bucketed (batch to a power of two up to `batch_size`, length to the next of
16/32/.../max_length) so the jitted forward compiles a handful of times, not per batch.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from retrieval.bert import load_bert

CONVENTIONS = ("e5", "sentence-transformers", "auto")


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    model_dir: str
    convention: str = "auto"
    pooling: str = "mean"  # "mean" | "cls"
    query_prefix: str = ""
    passage_prefix: str = ""
    normalize: bool = True
    max_length: int = 256
    batch_size: int = 64
    dtype: str = "float32"

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.model_dir))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def resolve_config(model_dir: str, convention: str = "auto", **overrides) -> EncoderConfig:
    """Fill prefixes/pooling/normalisation from a convention; explicit overrides win."""
    if convention not in CONVENTIONS:
        raise ValueError(f"encoder convention {convention!r}; expected one of {CONVENTIONS}")
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"encoder directory {model_dir!r} does not exist; expected a local HF BERT checkpoint")
    modules = os.path.join(model_dir, "modules.json")
    if convention == "auto":
        if os.path.exists(modules):
            convention = "sentence-transformers"
        elif "e5" in os.path.basename(os.path.normpath(model_dir)).lower():
            convention = "e5"
        else:
            raise ValueError(f"cannot tell the convention of encoder {model_dir!r} (no modules.json, no 'e5' in "
                             "its name); pass convention='e5' or 'sentence-transformers'")
    base: dict = {"model_dir": model_dir, "convention": convention, "pooling": "mean"}
    if convention == "e5":
        base.update(query_prefix="query: ", passage_prefix="passage: ", normalize=True, max_length=512)
    else:
        normalize = False
        if os.path.exists(modules):
            with open(modules, encoding="utf-8") as f:
                normalize = any("Normalize" in m.get("type", "") for m in json.load(f))
        base.update(normalize=normalize)
        st_cfg = os.path.join(model_dir, "sentence_bert_config.json")
        if os.path.exists(st_cfg):
            with open(st_cfg, encoding="utf-8") as f:
                base["max_length"] = int(json.load(f).get("max_seq_length", 256))
    base.update({k: v for k, v in overrides.items() if v is not None})
    return EncoderConfig(**base)


def _buckets(limit: int, start: int) -> list[int]:
    out, b = [], start
    while b < limit:
        out.append(b)
        b *= 2
    return out + [limit]


def _pick(buckets: list[int], n: int) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"size {n} exceeds the largest bucket {buckets[-1]}")


class DenseEncoder:
    """Batched, jitted text -> unit vectors. Thread-compatible (one search thread at a time)."""

    def __init__(self, config: EncoderConfig):
        from tokenizers import Tokenizer

        self.config = config
        if config.pooling not in ("mean", "cls"):
            raise ValueError(f"pooling {config.pooling!r}; expected 'mean' or 'cls'")
        tok_path = os.path.join(config.model_dir, "tokenizer.json")
        if not os.path.exists(tok_path):
            raise FileNotFoundError(f"encoder {config.model_dir!r} has no tokenizer.json")
        self.tokenizer = Tokenizer.from_file(tok_path)
        self.tokenizer.no_padding()  # we pad to buckets ourselves
        self.tokenizer.enable_truncation(max_length=config.max_length)
        model = load_bert(config.model_dir, dtype=jnp.dtype(config.dtype))
        if config.max_length > model.cfg.max_position:
            raise ValueError(f"max_length {config.max_length} exceeds the model's {model.cfg.max_position} positions")
        self.dim = model.cfg.hidden_size
        graphdef, state = nnx.split(model)
        self._state = state
        pooling, normalize = config.pooling, config.normalize

        @jax.jit
        def forward(state, ids, mask):
            hidden = nnx.merge(graphdef, state)(ids, mask)  # [B, T, H]
            if pooling == "cls":
                pooled = hidden[:, 0]
            else:
                m = mask[..., None].astype(jnp.float32)
                pooled = (hidden * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
            if normalize:
                pooled = pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
            return pooled

        self._forward = forward
        self._len_buckets = _buckets(config.max_length, 16)
        self._batch_buckets = _buckets(config.batch_size, 1)

    @classmethod
    def from_pretrained(cls, model_dir: str, convention: str = "auto", **overrides) -> "DenseEncoder":
        return cls(resolve_config(model_dir, convention, **overrides))

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def _encode_ids(self, ids: list[list[int]]) -> np.ndarray:
        """One bucketed batch: ids (len <= batch_size) -> [len(ids), D]."""
        n = len(ids)
        b = _pick(self._batch_buckets, n)
        t = _pick(self._len_buckets, max(len(x) for x in ids))
        arr = np.zeros((b, t), dtype=np.int32)
        mask = np.zeros((b, t), dtype=np.int32)
        for i, x in enumerate(ids):
            arr[i, : len(x)] = x
            mask[i, : len(x)] = 1
        out = self._forward(self._state, jnp.asarray(arr), jnp.asarray(mask))
        return np.asarray(out[:n], dtype=np.float32)

    def encode(self, texts: Sequence[str], *, prefix: str = "", progress: bool = False) -> np.ndarray:
        """texts -> [N, D] float32. Sorted by length internally so buckets stay tight."""
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        ids = self.tokenize([prefix + t for t in texts])
        order = np.argsort([len(x) for x in ids], kind="stable")
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        bs = self.config.batch_size
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc="encode", unit="psg")
        for s in range(0, len(ids), bs):
            rows = order[s : s + bs]
            out[rows] = self._encode_ids([ids[i] for i in rows])
            if bar is not None:
                bar.update(len(rows))
        if bar is not None:
            bar.close()
        return out

    def warmup(self, max_tokens: int = 64) -> int:
        """Compile every batch bucket for the length buckets up to `max_tokens` (query-sized inputs),
        so a server's first requests do not pay XLA compile time. Returns how many shapes compiled."""
        n = 0
        for t in (b for b in self._len_buckets if b <= max(max_tokens, self._len_buckets[0])):
            for b in self._batch_buckets:
                ids = np.zeros((b, t), np.int32)
                self._forward(self._state, jnp.asarray(ids), jnp.asarray(np.ones_like(ids))).block_until_ready()
                n += 1
        return n

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self.encode(queries, prefix=self.config.query_prefix)

    def encode_passages(self, passages: Sequence[str], progress: bool = False) -> np.ndarray:
        return self.encode(passages, prefix=self.config.passage_prefix, progress=progress)
