"""JSON Lines, read and written one way everywhere: a world's files, a run's metrics log.

(A QA dataset's rows go through data/qa.py's reader, which also checks each row's fields.)
"""
from __future__ import annotations

import json
import os
from typing import Any


def read_jsonl(path: str) -> list[Any]:
    """Every non-blank line of `path` as JSON; ValueError naming the file and line of one that is not."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not a JSON object per line ({e})") from e
    return rows


def read_jsonl_if_exists(path: str) -> list[Any]:
    """read_jsonl, or [] where there is no such file (a run that has logged nothing yet)."""
    return read_jsonl(path) if os.path.isfile(path) else []


def write_jsonl(path: str, rows: list[Any]) -> None:
    """One JSON line per row (unicode kept as it is)."""
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
