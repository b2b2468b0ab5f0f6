"""Corpus reading and an on-disk document store.

Corpus format (Search-R1 / MemSearcher wiki-18): one JSON object per line,
`{"id": "123", "contents": "Title\\nPassage text"}`. Other keys are ignored.

`read_corpus` streams passages from such a file; `DocStore` is the on-disk
layout that a saved index directory carries: `docs.jsonl` (normalised
`{"id","contents"}` lines) plus `offsets.npy` (int64 byte offsets, [N + 1]).
Both are memory-mapped, so opening a 21M-passage store costs no RAM up front
and a lookup touches one line.
"""
from __future__ import annotations

import array
import dataclasses
import json
import mmap
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import numpy as np

from memsearcher_jax.errors import UserInputError


class CorpusFormatError(UserInputError):
    """A corpus line that is not a JSON object with a string `contents`."""


@dataclasses.dataclass
class ReadStats:
    """Counters filled in while a corpus is streamed."""

    lines: int = 0
    passages: int = 0
    skipped: int = 0
    duplicates: int = 0  # lines dropped by dedupe (an id seen before)
    first_errors: list[str] = dataclasses.field(default_factory=list)

    def skip(self, error: Exception) -> None:
        self.skipped += 1
        if len(self.first_errors) < 10:
            self.first_errors.append(str(error))


def parse_line(line: str, line_no: int) -> dict[str, str] | None:
    """Parse one corpus line into `{"id", "contents"}`; None for a blank line.

    Raises CorpusFormatError naming `line_no` (1-based) when the line is bad.
    A missing `id` falls back to the 0-based line index, as Search-R1 corpora do.
    """
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise CorpusFormatError(f"corpus line {line_no}: not valid JSON ({e.msg}); expected an object like "
                                '{"id": "...", "contents": "title\\ntext"}') from None
    if not isinstance(obj, dict):
        raise CorpusFormatError(f"corpus line {line_no}: expected a JSON object, got {type(obj).__name__}")
    contents = obj.get("contents")
    if not isinstance(contents, str):
        keys = sorted(obj)[:8]
        raise CorpusFormatError(f"corpus line {line_no}: missing string field 'contents' (keys present: {keys})")
    if not contents.strip():
        raise CorpusFormatError(f"corpus line {line_no}: 'contents' is empty (a passage needs text)")
    pid = obj.get("id", line_no - 1)
    return {"id": str(pid), "contents": contents}


def read_corpus(path: str, *, skip_bad: bool = False, dedupe: bool = False,
                stats: ReadStats | None = None) -> Iterator[dict[str, str]]:
    """Stream `{"id", "contents"}` passages from a jsonl corpus.

    A line that is not UTF-8, not a JSON object or has no text is an error naming its line;
    with `skip_bad` such lines are skipped and counted in `stats` (the first few messages
    kept). An id seen on an earlier line is an error too; with `dedupe` the later line is
    dropped (counted in stats.duplicates).
    """
    stats = stats if stats is not None else ReadStats()
    seen: set[str] = set()
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            stats.lines += 1
            try:
                passage = parse_line(_decode(raw, line_no), line_no)
            except CorpusFormatError as e:
                if not skip_bad:  # the way past it, named only where it was not taken
                    raise CorpusFormatError(f"{e}; --skip-bad-lines skips such lines (counted)") from None
                stats.skip(e)
                continue
            if passage is None:
                continue
            if passage["id"] in seen:
                if not dedupe:
                    raise CorpusFormatError(f"corpus line {line_no}: id {passage['id']!r} appeared on an earlier "
                                            "line; ids must be unique (--dedupe keeps the first of each id)")
                stats.duplicates += 1
                continue
            seen.add(passage["id"])
            stats.passages += 1
            yield passage


def _decode(raw: bytes, line_no: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorpusFormatError(f"corpus line {line_no}: not UTF-8 (byte {e.start}: {raw[e.start:e.start + 1]!r}); "
                                "re-encode the file") from None


class DocLookup(Protocol):
    """Row index -> passage; what retrievers need from a document store."""

    def __len__(self) -> int: ...

    def get(self, row: int) -> dict[str, str]: ...


class InMemoryDocs:
    """A list of passages held in RAM (tiny corpora, tests, the agent's toy runs)."""

    def __init__(self, passages: Sequence[dict[str, str]]):
        self._docs = [{"id": str(p["id"]), "contents": p["contents"]} for p in passages]

    def __len__(self) -> int:
        return len(self._docs)

    def get(self, row: int) -> dict[str, str]:
        return self._docs[row]

    def write(self, out_dir: str) -> int:
        return DocStore.write(self._docs, out_dir)


class DocStore:
    """Memory-mapped `docs.jsonl` + `offsets.npy`; row i is the i-th vector of the index."""

    DOCS = "docs.jsonl"
    OFFSETS = "offsets.npy"

    def __init__(self, directory: str):
        docs_path = os.path.join(directory, self.DOCS)
        offsets_path = os.path.join(directory, self.OFFSETS)
        for p in (docs_path, offsets_path):
            if not os.path.exists(p):
                raise FileNotFoundError(f"document store {directory!r} lacks {os.path.basename(p)}; "
                                        "expected a directory written by DocStore.write")
        self._offsets = np.load(offsets_path, mmap_mode="r")
        self._file = open(docs_path, "rb")
        size = os.fstat(self._file.fileno()).st_size
        # mmap of an empty file is an error; an empty store has nothing to read anyway.
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        if int(self._offsets[-1]) != size:
            raise ValueError(f"document store {directory!r}: offsets end at {int(self._offsets[-1])} but "
                             f"{self.DOCS} has {size} bytes; the store is truncated or mismatched")

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def get(self, row: int) -> dict[str, str]:
        if not 0 <= row < len(self):
            raise IndexError(f"document row {row} outside 0..{len(self) - 1}")
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        return json.loads(self._mm[start:end])

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
        self._file.close()

    @staticmethod
    def write(passages: Iterable[dict[str, str]], out_dir: str) -> int:
        """Write passages as a store under `out_dir`; returns how many were written."""
        writer = DocStoreWriter(out_dir)
        for p in passages:
            writer.add(p)
        return writer.close()


class DocStoreWriter:
    """Incremental writer, so the index builder streams the corpus once."""

    def __init__(self, out_dir: str):
        os.makedirs(out_dir, exist_ok=True)
        self._dir = out_dir
        self._f = open(os.path.join(out_dir, DocStore.DOCS), "wb")
        # array('q') keeps 21M offsets at 8 bytes each instead of a list of Python ints.
        self._offsets = array.array("q", [0])

    def add(self, passage: dict[str, str]) -> None:
        line = json.dumps({"id": str(passage["id"]), "contents": passage["contents"]}, ensure_ascii=False)
        data = line.encode("utf-8") + b"\n"
        self._f.write(data)
        self._offsets.append(self._offsets[-1] + len(data))

    def close(self) -> int:
        self._f.close()
        np.save(os.path.join(self._dir, DocStore.OFFSETS), np.frombuffer(self._offsets, dtype=np.int64))
        return len(self._offsets) - 1
