"""Packing prompt suffixes into prefill rows: several short suffixes share one row of the
prefill grid (each attends only to itself and the shared prefix), so a ragged batch costs
about its real token count instead of rows x longest. Pure Python; unit-tested on its own.
"""
from __future__ import annotations


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
