"""Copies as plain data, checked and shaped once for every machine.

:class:`CopyRange` is one piece of a copy (1D, or rows of a 2D copy);
:func:`copy_calls` is the one rule for which ranges go as one 2D copy, and
:class:`CopyPlan` what a machine's copy hook runs (``backends.base.plan_copy``
checks a copy against its buffers and makes one). Pure: nothing here blocks or
touches a device. Units: bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class _CopyRangeFields(NamedTuple):
    src_offset: int
    dst_offset: int
    nbytes: int
    rows: int = 1
    src_pitch: int = 0


class CopyRange(_CopyRangeFields):
    """One piece of a copy: ``nbytes`` from ``src_offset`` to ``dst_offset``.

    With ``rows`` > 1 the piece is 2D: ``rows`` rows of ``nbytes // rows``
    bytes, ``src_pitch`` apart in the source, packed in the destination (a
    head slice of a window, one ``cudaMemcpy2DAsync``). Immutable (a tuple: the
    scheduler builds thousands a token, and a frozen dataclass costs 1.5 us each
    to construct). Raises ValueError for a negative offset or size, or rows that do not split it.
    """

    __slots__ = ()

    def __new__(cls, src_offset: int, dst_offset: int, nbytes: int, rows: int = 1, src_pitch: int = 0) -> CopyRange:
        if src_offset < 0 or dst_offset < 0 or nbytes < 0:
            raise ValueError(f"CopyRange offsets and nbytes must be >= 0, got {(src_offset, dst_offset, nbytes)}")
        if rows != 1 and (rows < 1 or nbytes % rows or src_pitch < nbytes // rows):
            raise ValueError(f"CopyRange rows must split nbytes evenly with src_pitch >= row width, got "
                             f"{nbytes} B in {rows} rows {src_pitch} apart")
        return tuple.__new__(cls, (src_offset, dst_offset, nbytes, rows, src_pitch))

    def __repr__(self) -> str:
        return (f"CopyRange(src_offset={self[0]}, dst_offset={self[1]}, nbytes={self[2]}, rows={self[3]}, "
                f"src_pitch={self[4]})")

    @property
    def width(self) -> int:
        return self.nbytes // self.rows

    @property
    def src_span(self) -> int:
        """Bytes of the source the piece reaches over (from ``src_offset``)."""
        return self.nbytes if self.rows == 1 else (self.rows - 1) * self.src_pitch + self.width

    def src_rows(self) -> list[tuple[int, int]]:
        """(offset, bytes) of each source row."""
        if self.rows == 1:
            return [(self.src_offset, self.nbytes)]
        return [(self.src_offset + i * self.src_pitch, self.width) for i in range(self.rows)]


class CopyCall(NamedTuple):
    """One copy a machine issues: ``height`` rows of ``width`` bytes, ``src_pitch`` / ``dst_pitch`` apart.

    ``height`` 1 is a 1D copy (``cudaMemcpyAsync``), more a 2D one (``cudaMemcpy2DAsync``).
    """

    src_offset: int
    dst_offset: int
    width: int
    height: int = 1
    src_pitch: int = 0
    dst_pitch: int = 0

    @property
    def nbytes(self) -> int:
        return self.width * self.height

    def pieces(self) -> list[tuple[int, int, int]]:
        """(source offset, destination offset, bytes) of each row."""
        return [(self.src_offset + i * self.src_pitch, self.dst_offset + i * self.dst_pitch, self.width) for i in range(self.height)]


class KeptRanges(tuple):  # type: ignore[type-arg]
    """A tuple of ``CopyRange``s its maker keeps and copies again and again (the scheduler's ordered window of one
    window size, ``sim.transport.deliveries.ordered_copy``): a machine may plan a copy of it once per pair of buffers."""

    __slots__ = ()


class CopyPlan(NamedTuple):
    """A copy checked and shaped once (:func:`plan_copy`): its direction, the calls to issue, its bytes."""

    to_device: bool
    calls: tuple[CopyCall, ...]
    nbytes: int

    def pieces(self) -> list[tuple[int, int, int]]:
        """(source offset, destination offset, bytes) of every row of every call, in order."""
        return [p for c in self.calls for p in c.pieces()]


def ranges_2d(ranges: Sequence[CopyRange]) -> tuple[int, int, int, int] | None:
    """``(width, height, src_pitch, dst_pitch)`` when several ranges form one 2D copy, else None.

    Two or more contiguous ranges (``rows`` 1) of one length > 0 whose source
    and destination offsets each advance by a constant stride no smaller than
    that length (the pitches a ``cudaMemcpy2DAsync`` accepts).
    """
    if len(ranges) < 2:
        return None
    first = ranges[0]
    width = first.nbytes
    sp = ranges[1].src_offset - first.src_offset
    dp = ranges[1].dst_offset - first.dst_offset
    if width <= 0 or sp < width or dp < width or first.rows != 1:
        return None
    a = first
    for b in ranges[1:]:
        if b.nbytes != width or b.rows != 1 or b.src_offset - a.src_offset != sp or b.dst_offset - a.dst_offset != dp:
            return None
        a = b
    return width, len(ranges), sp, dp


def copy_calls(ranges: Sequence[CopyRange]) -> tuple[CopyCall, ...]:
    """The calls a copy of ``ranges`` is made of: the one rule every machine shapes its copies by.

    Ranges that form one 2D copy (:func:`ranges_2d`) are one call; otherwise
    each non-empty range is one call: 1D, or 2D for a strided range (its rows
    packed in the destination).
    """
    if len(ranges) == 1:  # the common case: one range, no 2D rule to test
        r = ranges[0]
        if not r.nbytes:
            return ()
        return (CopyCall(r.src_offset, r.dst_offset, r.nbytes) if r.rows == 1
                else CopyCall(r.src_offset, r.dst_offset, r.width, r.rows, r.src_pitch, r.width),)
    shape = ranges_2d(ranges)
    if shape is not None:
        return (CopyCall(ranges[0].src_offset, ranges[0].dst_offset, *shape),)
    return tuple(
        CopyCall(r.src_offset, r.dst_offset, r.nbytes) if r.rows == 1
        else CopyCall(r.src_offset, r.dst_offset, r.width, r.rows, r.src_pitch, r.width)
        for r in ranges
        if r.nbytes
    )
