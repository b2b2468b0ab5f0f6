"""Dense text encoder: tokenizer + JAX BERT + pooling, with e5 and sentence-transformers conventions.

    enc = DenseEncoder.from_pretrained(minilm_encoder_dir())          # convention="auto"
    q = enc.encode_queries(["who wrote hamlet"])                       # [1, 384] float32, unit norm
    p = enc.encode_passages(texts, progress=True)                      # [N, 384]
    p = enc.encode_passages(texts, callback=bar.update)                # callback(n) after every batch

Conventions:
- "e5": "query: " / "passage: " prefixes, mean pooling over the attention mask, L2 norm
  (e5-base-v2, the paper's encoder).
- "sentence-transformers": no prefixes, mean pooling, L2 norm when the checkpoint's
  modules.json lists a Normalize module (all-MiniLM-L6-v2 does).
- "auto": sentence-transformers when modules.json exists, e5 when the directory name has "e5".

Throughput (XLA CPU, MiniLM-L6, passages of 100-200 tokens; `python bench/retriever.py`):
- encode() sorts a call's texts by token count, so each batch holds passages of similar length
  (build_dense_index passes a whole --chunk-size chunk per call).
- Lengths pad to a multiple of 16 up to 256 tokens, 32 up to 512 (at most 1/8 above 128
  tokens): 16, 32, ..., 256, 288, ... The old powers of two padded a 130-token batch to 256.
- A batch of `batch_size` texts runs as micro-batches of at most `max_batch_tokens` padded
  tokens (on CPU by default 256 per core, at least 512; unlimited elsewhere): on a 2-core CPU
  a [4, 144] forward ran 1.4x the passages/s of a [64, 144] one (the [tokens, 1536] FFN
  activations stay in cache), and a 512-token budget beat 1024 and 2048 end to end. More
  cores split the rows of each matmul, hence the per-core scaling (not measured beyond 2 cores).
Shapes are bucketed (micro-batch rows to a power of two, length as above) so the jitted
forward compiles a few dozen times at most, not per batch; `warmup()` compiles query shapes.
The progress callback and bar still advance per `batch_size` batch.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from retrieval.bert import load_bert

CONVENTIONS = ("e5", "sentence-transformers", "auto")
# Micro-batch budget on CPU (padded tokens per forward call, per core); see the module docstring.
CPU_BATCH_TOKENS_PER_CORE = 256
CPU_MIN_BATCH_TOKENS = 512


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
    """Powers of two from `start`, then `limit` (batch buckets)."""
    out, b = [], start
    while b < limit:
        out.append(b)
        b *= 2
    return out + [limit]


def _length_buckets(limit: int, step: int = 16) -> list[int]:
    """Padded lengths: multiples of `step` up to 8 * step, then steps of 1/8 of the octave
    (multiples of 16 up to 256, of 32 up to 512, ...), then `limit`."""
    out, b = [], step
    while b < limit:
        out.append(b)
        b += max(step, (1 << (b.bit_length() - 1)) // 8)
    return out + [limit]


def _pick(buckets: list[int], n: int) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"size {n} exceeds the largest bucket {buckets[-1]}")


class DenseEncoder:
    """Batched, jitted text -> unit vectors. Thread-compatible (one search thread at a time)."""

    def __init__(self, config: EncoderConfig, max_batch_tokens: int | None = None):
        """max_batch_tokens: padded tokens per forward call (a batch runs as micro-batches of at
        most this many rows x padded length, at least one row); None = 256 per CPU core (at least
        512) on CPU, no limit on other backends; 0 = no limit. A speed knob only: outputs do not
        change, and it is not part of `config` (nor of an index manifest)."""
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
        self._len_buckets = _length_buckets(config.max_length)
        self._batch_buckets = _buckets(config.batch_size, 1)
        if max_batch_tokens is None:
            max_batch_tokens = 0
            if jax.default_backend() == "cpu":
                max_batch_tokens = max(CPU_MIN_BATCH_TOKENS, CPU_BATCH_TOKENS_PER_CORE * (os.cpu_count() or 1))
        if max_batch_tokens < 0:
            raise ValueError(f"max_batch_tokens={max_batch_tokens}; expected >= 0 (0 = no limit)")
        self.max_batch_tokens = max_batch_tokens

    @classmethod
    def from_pretrained(cls, model_dir: str, convention: str = "auto", *, max_batch_tokens: int | None = None,
                        **overrides) -> DenseEncoder:
        return cls(resolve_config(model_dir, convention, **overrides), max_batch_tokens=max_batch_tokens)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def _max_rows(self, t: int) -> int:
        """Rows per forward call at padded length t: the largest batch bucket within the token budget."""
        if not self.max_batch_tokens:
            return self._batch_buckets[-1]
        fit = [b for b in self._batch_buckets if b * t <= self.max_batch_tokens]
        return fit[-1] if fit else 1

    def _forward_rows(self, ids: list[list[int]]):
        """One forward call: ids (len <= a batch bucket) -> ([bucket, D] device array, n)."""
        n = len(ids)
        b = _pick(self._batch_buckets, n)
        t = _pick(self._len_buckets, max(len(x) for x in ids))
        arr = np.zeros((b, t), dtype=np.int32)
        mask = np.zeros((b, t), dtype=np.int32)
        for i, x in enumerate(ids):
            arr[i, : len(x)] = x
            mask[i, : len(x)] = 1
        return self._forward(self._state, jnp.asarray(arr), jnp.asarray(mask)), n

    def _encode_ids(self, ids: list[list[int]]) -> np.ndarray:
        """One batch (len <= batch_size, ideally sorted by length) -> [len(ids), D], as micro-batches
        of at most `_max_rows(padded length)` rows, each padded to its own length bucket."""
        outs, s = [], 0
        while s < len(ids):
            rows = self._max_rows(_pick(self._len_buckets, len(ids[s])))
            # Shrink until the micro-batch's own longest text fits the budget too.
            while rows > 1 and rows > self._max_rows(_pick(self._len_buckets, max(len(x) for x in ids[s: s + rows]))):
                rows //= 2
            outs.append(self._forward_rows(ids[s: s + rows]))  # dispatched asynchronously
            s += rows
        return np.concatenate([np.asarray(o[:n], dtype=np.float32) for o, n in outs])

    def encode(self, texts: Sequence[str], *, prefix: str = "", progress: bool = False,
               callback: Callable[[int], object] | None = None) -> np.ndarray:
        """texts -> [N, D] float32. Sorted by token count internally so batches stay homogeneous.

        progress: a tqdm bar of its own; callback(n): called after every batch with the number of
        texts it held (the counts sum to N), e.g. an outer bar's `update`.
        """
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
            if callback is not None:
                callback(len(rows))
        if bar is not None:
            bar.close()
        return out

    def warmup(self, max_tokens: int = 64) -> int:
        """Compile the shapes encode() uses for inputs of up to `max_tokens` tokens (query-sized),
        so a server's first requests do not pay XLA compile time. Returns how many shapes ran."""
        n = 0
        for t in (b for b in self._len_buckets if b <= max(max_tokens, self._len_buckets[0])):
            for b in (b for b in self._batch_buckets if b <= self._max_rows(t)):
                ids = np.zeros((b, t), np.int32)
                self._forward(self._state, jnp.asarray(ids), jnp.asarray(np.ones_like(ids))).block_until_ready()
                n += 1
        return n

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self.encode(queries, prefix=self.config.query_prefix)

    def encode_passages(self, passages: Sequence[str], progress: bool = False,
                        callback: Callable[[int], object] | None = None) -> np.ndarray:
        return self.encode(passages, prefix=self.config.passage_prefix, progress=progress, callback=callback)
