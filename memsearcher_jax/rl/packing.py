"""How the learner lays out its rows: loss windows, blocks, and sequence packing (rl.pack_rows).

The conversations of a log-prob pass or a mini-batch go first-fit into rows as wide as the
longest one's bucket (`GRPOLearner.row_width`), each a segment that attends only to itself with
positions from 0. Every per-token array (weights included) moves with its token, so the weighted
loss sum, and with it every aggregation mode, is the unpacked one. Pure numpy, tested on
hand-made lengths (tests/test_packing.py).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from memsearcher_jax.sampling.buckets import bucket


@dataclasses.dataclass(frozen=True)
class Packing:
    """Where `first_fit` put each conversation: conversation i (its lengths[i] real tokens) in
    packed row row[i] from slot offset[i]; num_rows rows of `width` slots."""

    row: np.ndarray
    offset: np.ndarray
    lengths: np.ndarray
    num_rows: int
    width: int

    def slots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For every real token, flat: (its conversation, its slot there, its packed row, its slot there)."""
        conv = np.repeat(np.arange(len(self.lengths)), self.lengths)
        within = np.arange(conv.size) - np.repeat(np.cumsum(self.lengths) - self.lengths, self.lengths)
        return conv, within, self.row[conv], self.offset[conv] + within


def first_fit(lengths: np.ndarray, width: int) -> Packing:
    """First-fit decreasing: the longest conversation first, each into the first row with room for
    it, a new row when none has. At least one row (an all-empty batch keeps one of padding)."""
    lengths = np.asarray(lengths, np.int64)
    if lengths.size and lengths.max() > width:
        raise ValueError(f"a conversation of {lengths.max()} tokens cannot fit packed rows of {width}")
    row, offset = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
    room: list[int] = []
    for i in np.argsort(-lengths, kind="stable"):
        n = int(lengths[i])
        r = next((k for k, free in enumerate(room) if free >= n), len(room))
        if r == len(room):
            room.append(width)
        row[i], offset[i] = r, width - room[r]
        room[r] -= n
    return Packing(row, offset, lengths, max(len(room), 1), width)


def pack_segments(arrays: dict[str, np.ndarray], packing: Packing) -> dict[str, np.ndarray]:
    """Per-token arrays [n, S] of n conversations laid out as `packing` says: [num_rows, width]
    each (0 in padding), plus "segments" (the conversation's index; -1 in padding) and
    "positions" (from 0 in each conversation)."""
    conv, within, row, slot = packing.slots()
    shape = (packing.num_rows, packing.width)
    out = {}
    for k, a in arrays.items():
        out[k] = np.zeros(shape, a.dtype)
        out[k][row, slot] = a[conv, within]
    out["segments"] = np.full(shape, -1, np.int32)
    out["segments"][row, slot] = conv
    out["positions"] = np.zeros(shape, np.int32)
    out["positions"][row, slot] = within
    return out


def packed_targets(loss_mask: np.ndarray, width: int, min_window: int) -> np.ndarray:
    """The target positions a loss over packed rows reads, [R, W] int32: each row's loss positions
    (every segment's generated tokens), then other positions (weight 0) up to W, sorted and
    distinct, all >= 1. W is the whole-octave bucket (from min_window) of the most loss positions
    a row has, at most width - 1: the head runs on these alone, as `loss_windows` does unpacked
    (one window over several segments would span most of the row)."""
    mask = np.asarray(loss_mask)[:, 1:width] != 0
    w = min(bucket(max(int(mask.sum(axis=1).max()), 1), min_window), width - 1)
    return np.sort(np.argsort(~mask, axis=1, kind="stable")[:, :w] + 1, axis=1).astype(np.int32)


def block_rows(n: int, cap: int, least: int = 1) -> int:
    """Rows of one call over n packed rows: n's half-octave bucket (1, 2, 3, 4, 6, 8, 12, ...: a
    handful of shapes, at most a third of the rows spare) as a multiple of `least` (the mesh's batch
    shards, so the rows still split over them), at most `cap` (what the planner sized)."""
    return min(bucket(n, least, steps_per_octave=2, multiple_of=least), cap)


def loss_windows(loss_mask: np.ndarray, width: int, min_window: int) -> np.ndarray:
    """The target positions whose log-probs a loss over these rows reads: [R, W] int32, row i's
    W consecutive positions covering every position of loss_mask[i] (all its generated tokens).

    W is the whole-octave bucket (from min_window) of the longest row's span, at most width - 1,
    so a run meets a handful of window shapes. A window that would run past the last column is
    moved left to end there, so every position is distinct and real; a row with no loss
    positions (a padding row) gets positions 1..W."""
    mask = np.asarray(loss_mask)[:, :width] != 0
    has = mask.any(axis=1)
    first = np.where(has, np.argmax(mask, axis=1), 1)
    last = np.where(has, width - 1 - np.argmax(mask[:, ::-1], axis=1), 1)
    if has.any() and first[has].min() < 1:
        raise ValueError("loss_mask marks position 0, which no earlier token predicts")
    w = min(bucket(int((last - first).max()) + 1, min_window), width - 1)
    start = np.minimum(first, width - w)  # >= 1: first >= 1 (checked above) and w <= width - 1
    return (start[:, None] + np.arange(w)[None, :]).astype(np.int32)


def real_lengths(attention: np.ndarray) -> np.ndarray:
    """Tokens up to and including each right-padded row's last real one [R] (0: an empty row)."""
    real = attention != 0
    return np.where(real.any(axis=1), real.shape[1] - np.argmax(real[:, ::-1], axis=1), 0)


def fit_block(a: np.ndarray, rows: int, width: int | None = None) -> np.ndarray:
    """a [n <= rows, ...] zero-padded to `rows` rows and, for [n, S] arrays, cut or zero-padded to
    `width` columns (the columns cut hold padding only: width covers every row's tokens)."""
    if width is not None:
        a = a[:, :width] if a.shape[1] >= width else np.pad(a, ((0, 0), (0, width - a.shape[1])))
    if a.shape[0] < rows:
        a = np.concatenate([a, np.zeros((rows - a.shape[0],) + a.shape[1:], a.dtype)])
    return a
