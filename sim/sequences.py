"""Parallel sequences on one cache: which cell holds which sequence's row.

A sequence's *row* r is its r-th token (its position); a *cell* is one row of
the cache in one stream. Over a cache split into streams (``--no-kv-unified``)
sequence s owns stream s, and its row r is that stream's cell r. Over a
unified cache (one stream shared by all n sequences) the cells are assigned
as llama.cpp assigns them when n prompts are prefilled in one batch and then
decoded together, one token each per step (``Workload.writes``):

* the prompts lie end to end: rows 0..c_s of sequence s are the cells
  o_s .. o_s + c_s, with o_s = c_0 + ... + c_{s-1};
* the rows after a prompt are interleaved after all prompts: row c_s + t of
  sequence s is cell C + t*n + s, with C = c_0 + ... + c_{n-1}.

So a row below c_s stays in the sequence's prompt block: after a context
shift or a reset, a sequence's rows are compacted into the start of its own
block. Every (sequence, row) has its own cell, on either cache.

A sequence attends only to its own rows 0..r -- llama.cpp's KQ mask, which lets
through the cells whose sequence id is s and whose position is <= r.
:meth:`SequenceCells.cells_of` gives those cells as at most two slices of one
stream (the prompt block, then the interleaved rows with step n), so a kernel
gathers them with basic slicing, on NumPy and CuPy alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate


@dataclass(frozen=True)
class CellSlice:
    """Cells ``start, start + step, ... < stop`` of stream ``stream``, in row order."""

    stream: int
    start: int
    stop: int
    step: int = 1

    def __len__(self) -> int:
        return len(range(self.start, self.stop, self.step))


@dataclass(frozen=True)
class SequenceCells:
    """The cell of every row of ``len(contexts)`` sequences (``contexts``: prompt rows per sequence)."""

    contexts: tuple[int, ...]
    unified: bool
    cells_per_stream: int

    @property
    def n(self) -> int:
        return len(self.contexts)

    @property
    def _bases(self) -> tuple[int, ...]:
        """First cell of each prompt block of the unified cache, then the sum of the prompts."""
        return (0, *accumulate(self.contexts))

    def cell(self, seq: int, row: int) -> tuple[int, int]:
        """(stream, cell) of row ``row`` of sequence ``seq``."""
        if not self.unified:
            return seq, row
        c, bases = self.contexts[seq], self._bases
        return 0, bases[seq] + row if row < c else bases[-1] + (row - c) * self.n + seq

    def owner(self, stream: int, cell: int) -> tuple[int, int]:
        """(sequence, row) held by ``cell`` of ``stream``: the inverse of :meth:`cell`."""
        if not self.unified:
            return stream, cell
        bases = self._bases
        if cell < bases[-1]:
            seq = next(s for s in range(self.n) if cell < bases[s + 1])
            return seq, cell - bases[seq]
        t, seq = divmod(cell - bases[-1], self.n)
        return seq, self.contexts[seq] + t

    def cells_of(self, seq: int, rows: int) -> tuple[CellSlice, ...]:
        """The cells of rows 0..``rows`` (end excluded) of ``seq``, in row order: at most two slices."""
        if not self.unified:
            return (CellSlice(seq, 0, rows),)
        c, bases = self.contexts[seq], self._bases
        out = [CellSlice(0, bases[seq], bases[seq] + min(rows, c))]
        if rows > c:
            first = bases[-1] + seq
            out.append(CellSlice(0, first, first + (rows - c - 1) * self.n + 1, self.n))
        return tuple(out)

    def capacity(self, seq: int) -> int:
        """How many rows of ``seq`` the cache holds."""
        if not self.unified:
            return self.cells_per_stream
        c, bases = self.contexts[seq], self._bases
        return min(c, self.cells_per_stream - bases[seq]) + len(range(bases[-1] + seq, self.cells_per_stream, self.n))

    def runs(self, rows: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        """The cells of rows ``row0..row1`` of each ``(seq, row0, row1)``, merged into runs (stream, first, end)."""
        cells = sorted({self.cell(s, r) for s, r0, r1 in rows for r in range(r0, r1)})
        out: list[tuple[int, int, int]] = []
        for stream, c in cells:
            if out and out[-1][0] == stream and out[-1][2] == c:
                out[-1] = (stream, out[-1][1], c + 1)
            else:
                out.append((stream, c, c + 1))
        return out
