"""Packing prompt suffixes into prefill rows: several short suffixes share one row of the
prefill grid (each attends only to itself and the shared prefix), so a ragged batch costs
about its real token count instead of rows x longest; then the host arrays of one call's
prefill (`layout_prefill`). Host-side NumPy only; unit-tested on its own.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from memsearcher_jax.sampling.buckets import BucketConfig, common_prefix_length


def pack_suffixes(lengths: list[int], width: int, pack: bool = True) -> tuple[list[tuple[int, int]], int]:
    """Place suffixes of `lengths` tokens into rows of `width` columns.

    Returns (row, first column) of each suffix and the number of rows used. pack: first fit
    in decreasing length order (each suffix into the first row with room); otherwise one
    suffix per row, right-aligned. Every length must be in [1, width].
    """
    for i, n in enumerate(lengths):
        if not 1 <= n <= width:
            raise ValueError(f"suffix {i} has {n} tokens; a prefill row holds 1 to {width}")
    if not pack:
        return [(i, width - n) for i, n in enumerate(lengths)], len(lengths)
    places: list[tuple[int, int]] = [(0, 0)] * len(lengths)
    used: list[int] = []  # columns filled per row
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        for r, u in enumerate(used):
            if u + n <= width:
                places[i] = (r, u)
                used[r] += n
                break
        else:
            places[i] = (len(used), 0)
            used.append(n)
    return places, len(used)


def distinct_suffixes(prompts: list[list[int]], plen: int, share_duplicates: bool) -> tuple[list[tuple], list[int]]:
    """The suffixes (past the first `plen` shared tokens) to prefill, and which one each prompt
    reads. share_duplicates: identical suffixes (a group's G samples at turn 0) are prefilled once."""
    seg_index: dict[tuple, int] = {}
    segments: list[tuple] = []
    seg_of_row = []
    for p in prompts:
        suffix = tuple(p[plen:])
        if not share_duplicates or suffix not in seg_index:
            seg_index[suffix] = len(segments)
            segments.append(suffix)
        seg_of_row.append(len(segments) - 1 if not share_duplicates else seg_index[suffix])
    return segments, seg_of_row


def prefix_arrays(prefix: list[int], slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ids, positions and validity [1, slots] of the shared prefix, left-padded in its bucket."""
    ids = np.zeros((1, slots), np.int32)
    pos = np.zeros((1, slots), np.int32)
    valid = np.zeros((1, slots), bool)
    if prefix:
        plen = len(prefix)
        ids[0, slots - plen:] = prefix
        pos[0, slots - plen:] = np.arange(plen)
        valid[0, slots - plen:] = True
    return ids, pos, valid


def grid_arrays(segments: list[tuple], places: list[tuple[int, int]], plen: int, grid_rows: int,
                width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The packed prefill grid [grid_rows, width]: token ids, positions (each suffix continues
    after the prefix) and which suffix fills each slot (-1: empty)."""
    ids = np.zeros((grid_rows, width), np.int32)
    pos = np.zeros((grid_rows, width), np.int32)
    seg = np.full((grid_rows, width), -1, np.int32)
    for i, (suffix, (r, c0)) in enumerate(zip(segments, places)):
        ids[r, c0:c0 + len(suffix)] = suffix
        pos[r, c0:c0 + len(suffix)] = np.arange(plen, plen + len(suffix))
        seg[r, c0:c0 + len(suffix)] = i
    return ids, pos, seg


def row_reads(seg_of_row: list[int], segments: list[tuple], places: list[tuple[int, int]], plen: int,
              batch: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each of `batch` rows reads its suffix, left-padded to `width` slots, from the grid:
    grid row [B], grid columns [B, width] (-1: padding) and the row's next position [B].
    Padding rows past the prompts (budget 0, done from the start, never emitted) read row 0's."""
    rows = np.zeros((batch,), np.int32)
    cols = np.full((batch, width), -1, np.int32)
    next_pos = np.zeros((batch,), np.int32)
    for j in range(batch):
        i = seg_of_row[j if j < len(seg_of_row) else 0]
        (r, c0), m = places[i], len(segments[i])
        rows[j], next_pos[j] = r, plen + m
        cols[j, width - m:] = np.arange(c0, c0 + m)
    return rows, cols, next_pos


class PrefillLayout(NamedTuple):
    """Everything one generate() call's prefill reads from the host, and the padded shapes
    (batch, prefix_slots, suffix_slots, grid_rows) that pick its compiled program."""

    batch: int                 # B: rows, rounded up to the batch bucket
    prefix_slots: int          # P: the shared prefix's bucket (0: no shared prefix)
    suffix_slots: int          # T: the longest suffix's bucket
    grid_rows: int             # rows of the packed prefill grid: always B (see layout_prefill)
    prefix: tuple              # (ids, positions, valid) [1, P]
    grid: tuple                # (ids, positions, suffix index) [grid_rows, T]
    reads: tuple               # (grid row [B], grid columns [B, T], next position [B])


def layout_prefill(prompts: list[list[int]], buckets: BucketConfig, batch_shards: int, share_prefix: bool | None,
                   share_duplicates: bool, pack: bool) -> PrefillLayout:
    """Lay a call's prompts out for the prefill: split off the shared prefix (share_prefix None:
    when it is at least buckets.min_shared_prefix tokens and there are several prompts, or any
    number when buckets.max_shared_prefix caps its length), pack the distinct suffixes into the
    grid, and record where each row reads its own suffix back.

    The grid has the batch bucket's rows, however few the packed suffixes fill: its shape then
    follows from (B, P, T) alone, the decode program's own key. Bucketing the rows the packing
    used apart from B made (B, grid rows) pairs multiply, and a training run met a new prefill
    program whenever the data first packed a batch bucket into a new row count (step 6 of the
    default run). A few empty grid rows cost little beside the decode that follows."""
    n = len(prompts)
    lens = [len(p) for p in prompts]
    shared = min(common_prefix_length(prompts), min(lens) - 1)  # each row keeps >= 1 suffix token
    if share_prefix is None:
        # With a cap, a lone prompt splits too: its prefix then takes the one shape every call's does.
        share_prefix = (n > 1 or buckets.max_shared_prefix > 0) and shared >= buckets.min_shared_prefix
    plen = buckets.prefix_tokens(shared) if share_prefix and shared > 0 else 0
    batch = buckets.batch(n, batch_shards)
    prefix_slots = buckets.prompt(plen) if plen else 0
    width = buckets.prompt(max(lens) - plen)
    segments, seg_of_row = distinct_suffixes(prompts, plen, share_duplicates)
    places, _ = pack_suffixes([len(x) for x in segments], width, pack)  # rows used <= suffixes <= n <= batch
    return PrefillLayout(batch=batch, prefix_slots=prefix_slots, suffix_slots=width, grid_rows=batch,
                         prefix=prefix_arrays(prompts[0][:plen], prefix_slots),
                         grid=grid_arrays(segments, places, plen, batch, width),
                         reads=row_reads(seg_of_row, segments, places, plen, batch, width))
