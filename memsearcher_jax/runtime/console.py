"""The jobs' log lines: a tag and the time, flushed at once (they interleave with progress bars)."""
from __future__ import annotations

import time


def log(msg: str, tag: str = "memsearcher-jax") -> None:
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {msg}", flush=True)
