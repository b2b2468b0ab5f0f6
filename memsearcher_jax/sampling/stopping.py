"""Stop conditions: stop token ids and multi-token stop sequences, as one padded table.

A stop token id is a stop sequence of length 1. The decode loop keeps, per row, a window of
its last W generated tokens and compares it with every sequence right-aligned, so matching
costs O(num_sequences * W) per step and never looks at prompt tokens.
"""
from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from memsearcher_jax.sampling.buckets import bucket

NO_TOKEN = -1  # window filler: never equal to a real token id
PAD_STOP = -2  # left padding of shorter stop sequences (ignored through the lengths)


def normalize_stops(stop_token_ids: Sequence[int], stop_sequences: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """All stops as a deduplicated list of token tuples (ids become 1-tuples); order kept."""
    out: list[tuple[int, ...]] = []
    for i in stop_token_ids:
        out.append((int(i),))
    for s in stop_sequences:
        seq = tuple(int(t) for t in s)
        if not seq:
            raise ValueError("stop_sequences must not contain an empty sequence")
        out.append(seq)
    seen, unique = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    return unique


def pack_stops(stops: Sequence[tuple[int, ...]], min_count: int = 4,
               min_width: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Stops -> (table int32 [N, W], lengths int32 [N]), right-aligned, sizes bucketed.

    Unused rows have length 0 and never match. N and W are powers of two >= the minimums,
    so new stop lists rarely change the compiled shapes.
    """
    n = bucket(len(stops), min_count)
    w = bucket(max((len(s) for s in stops), default=1), min_width)
    table = np.full((n, w), PAD_STOP, np.int32)
    lengths = np.zeros((n,), np.int32)
    for i, s in enumerate(stops):
        table[i, w - len(s):] = s
        lengths[i] = len(s)
    return table, lengths


def stop_hits(window: jnp.ndarray, table: jnp.ndarray, lengths: jnp.ndarray) -> jnp.ndarray:
    """Does each row's window end with any stop sequence?

    window [B, W] (last W generated tokens, oldest first, NO_TOKEN where none yet);
    table [N, W] right-aligned; lengths [N]. Returns bool [B].
    """
    w = table.shape[1]
    col = jnp.arange(w)
    relevant = col[None, :] >= (w - lengths)[:, None]  # [N, W]: the last len(s) columns
    eq = window[:, None, :] == table[None, :, :]  # [B, N, W]
    match = jnp.all(eq | ~relevant[None], axis=-1) & (lengths > 0)[None, :]
    return jnp.any(match, axis=-1)


def push_window(window: jnp.ndarray, tokens: jnp.ndarray, active: jnp.ndarray) -> jnp.ndarray:
    """Append tokens [B] to window [B, W] on active rows (oldest token drops out)."""
    shifted = jnp.concatenate([window[:, 1:], tokens[:, None].astype(window.dtype)], axis=1)
    return jnp.where(active[:, None], shifted, window)


def find_stop(tokens: Sequence[int], stops: Sequence[tuple[int, ...]]) -> int | None:
    """Reference: the length of the shortest prefix of `tokens` that ends with a stop, or None."""
    for end in range(1, len(tokens) + 1):
        for s in stops:
            if end >= len(s) and tuple(tokens[end - len(s):end]) == tuple(s):
                return end
    return None
