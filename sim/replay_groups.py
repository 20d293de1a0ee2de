"""Numbering the points of a batch by what they share, as arrays: each point's group in order of first appearance.

The point planner (``sim.replay``) tells a batch's points apart by the objects they share (workload, machine, config
class) before any workload is hashed. Each point's index of each is an integer array; a group is a distinct tuple of
indices. :func:`combined` packs the tuple into one int64 code (mixed radix, compacted where the radix product would
pass 2**62); :func:`first_appearance` numbers the distinct codes by the first point that holds each -- with a table
over the codes and a scatter of minima where the code space is small next to the batch (a grid's depths and budgets:
no sort of half a million codes), else with ``np.unique``. Both give the same numbers.

Units: none (indices).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DENSE_PER_POINT = 4  # a table of codes at most this many entries per point (and 4,096 more) is used instead of a sort
_RADIX_LIMIT = 1 << 62


def combined(parts: Sequence[tuple[np.ndarray, int]]) -> tuple[np.ndarray, int]:
    """One int64 code per point for ``parts`` (each point's index, below its count), equal codes iff equal tuples of
    indices, and the codes' bound (every code below it). Pure."""
    code = np.zeros(len(parts[0][0]) if parts else 0, dtype=np.int64)
    size = 1
    for inv, count in parts:
        if size * max(count, 1) >= _RADIX_LIMIT:  # compact first: the codes in use, renumbered below the points' count
            _, code = np.unique(code, return_inverse=True)
            code = code.reshape(-1).astype(np.int64)
            size = int(code.max(initial=-1)) + 1
        code = code * max(count, 1) + np.asarray(inv, dtype=np.int64).reshape(-1)
        size *= max(count, 1)
    return code, size


def first_appearance(code_size: tuple[np.ndarray, int]) -> tuple[np.ndarray, list[int]]:
    """Each point's group (its distinct code's number, in order of the first point holding each; intp) and each
    group's first point, of :func:`combined`'s ``(codes, bound)``. Pure."""
    code, size = code_size
    n = len(code)
    if not n:
        return np.zeros(0, dtype=np.intp), []
    if size <= DENSE_PER_POINT * n + 4096:
        first = np.full(size, n, dtype=np.intp)
        np.minimum.at(first, code, np.arange(n, dtype=np.intp))
        present = np.flatnonzero(first < n)
        firsts = first[present]
        order = np.argsort(firsts, kind="stable")
        number = np.empty(size, dtype=np.intp)
        number[present[order]] = np.arange(len(order), dtype=np.intp)
        return number[code], firsts[order].tolist()
    _, first, inv = np.unique(code, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    number = np.empty(len(first), dtype=np.intp)
    number[order] = np.arange(len(first))
    return number[inv.reshape(-1)], first[order].tolist()
