"""What the race checker reports, and the byte ranges it compares.

An *operation* (:class:`Op`) is one thing that touched memory -- a copy, a
kernel, a CPU split or a free -- named by its kind, its name, the actor it ran
on (the host or a stream) and the split the host was at. A *hazard*
(:class:`Hazard`) is two operations of different actors that access
overlapping bytes of one buffer, at least one a write, neither ordered before
the other; ``describe`` says it in one line. :class:`CopySeen` is a copy as
the backend saw it (for delivery accounting in tests).

The checker (``backends.checked``) compares operations by their byte ranges:
a copy reads each source row of its ranges (a strided range row by row) and
writes each destination range; a kernel, CPU split or free accesses its
declared ``Access``es. The functions here turn both into ranges: a new
operation's as a flat list (:func:`copy_ranges`, :func:`work_ranges`), a kept
one's once, per buffer with its bounds (:func:`ranges_of`).

Units: bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backends.base import Buffer, CopyRange

# An accessed byte range: (buffer, lo, hi, write).
Range = tuple[Buffer, int, int, bool]
# A stream's operation the host does not know of yet (a *kept item*), as a list
# [tick, actor, src, dst, what, found, name, context]: a copy has its source and
# destination buffers, its CopyRanges in ``what`` and its tag as ``name``; a kernel has
# src = dst = None, its Work.accesses in ``what`` and its name. ``found`` is None until the
# item is first compared with something, then its Found; ``context`` is the split the host was at.
Item = list[Any]
# A kept item's accesses, made when it is first compared: (the item, its writes, its reads), each
# per buffer as [lowest byte, highest byte + 1, its (lo, hi) ranges in order].
Found = tuple[Item, dict[Buffer, list[Any]], dict[Buffer, list[Any]]]


@dataclass(frozen=True)
class Op:
    """One operation that touched memory: what, on which actor, while the host was at which split."""

    kind: str  # "copy" | "kernel" | "cpu" | "free"
    name: str
    actor: str
    context: str

    def describe(self) -> str:
        return f"{self.kind} {self.name!r} on {self.actor} (host at {self.context or 'start'})"


@dataclass(frozen=True)
class Hazard:
    """Two unordered accesses to overlapping bytes of one buffer, at least one a write."""

    buffer: str
    lo: int
    hi: int
    first: Op
    first_write: bool
    second: Op
    second_write: bool

    @property
    def kind(self) -> str:
        return "write/write" if self.first_write and self.second_write else "read/write"

    def describe(self) -> str:
        def rw(w: bool) -> str:
            return "writes" if w else "reads"

        return (
            f"{self.kind} on {self.buffer}[{self.lo}:{self.hi}]: {self.first.describe()} {rw(self.first_write)}, "
            f"{self.second.describe()} {rw(self.second_write)}, unordered"
        )


@dataclass(frozen=True)
class CopySeen:
    """A copy as the backend saw it (for delivery accounting in tests)."""

    stream: str
    dst: Buffer
    src: Buffer
    ranges: tuple[CopyRange, ...]
    tag: str


def copy_ranges(src: Buffer, dst: Buffer, ranges: Sequence[CopyRange]) -> list[Range]:
    """A copy's accesses, in order: per range its source rows (reads), then its destination (a write)."""
    out: list[Range] = []
    for r in ranges:
        n = r.nbytes
        if n <= 0:
            continue
        if r.rows == 1:
            out.append((src, r.src_offset, r.src_offset + n, False))
        else:
            out += [(src, o, o + w, False) for o, w in r.src_rows()]
        out.append((dst, r.dst_offset, r.dst_offset + n, True))
    return out


def work_ranges(accesses: Sequence[Any]) -> list[Range]:
    """A kernel's or CPU split's declared ``Access``es as ranges (empty ones left out; a strided one row by row)."""
    out: list[Range] = []
    for x in accesses:
        if x.nbytes <= 0:
            continue
        if x.repeat == 1:
            out.append((x.buffer, x.offset, x.offset + x.nbytes, x.write))
        else:
            out += [(x.buffer, o, o + x.nbytes, x.write) for o in range(x.offset, x.offset + x.repeat * x.pitch, x.pitch)]
    return out


def ranges_of(item: Item) -> Found:
    """(item, its writes, its reads), each per buffer, computed when the item is first compared and kept in it."""
    src, dst, what = item[2], item[3], item[4]
    found: Found = (item, {}, {})
    if src is not None:  # a copy reads src and writes dst
        reads: list[tuple[int, int]] = []
        writes: list[tuple[int, int]] = []
        for r in what:
            n = r.nbytes
            if n <= 0:
                continue
            if r.rows == 1:
                reads.append((r.src_offset, r.src_offset + n))
            else:
                reads += [(o, o + w) for o, w in r.src_rows()]
            writes.append((r.dst_offset, r.dst_offset + n))
        if writes:
            found[1][dst] = [min(writes)[0], max(hi for _, hi in writes), writes]
            found[2][src] = [min(reads)[0], max(hi for _, hi in reads), reads]
        item[5] = found
        return found
    for buf, lo, hi, write in work_ranges(what):
        by_buf = found[1] if write else found[2]
        entry = by_buf.get(buf)
        if entry is None:
            by_buf[buf] = [lo, hi, [(lo, hi)]]
        else:
            if lo < entry[0]:
                entry[0] = lo
            if hi > entry[1]:
                entry[1] = hi
            entry[2].append((lo, hi))
    item[5] = found
    return found
