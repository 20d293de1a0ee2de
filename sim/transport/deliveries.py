"""The pure half of the pipelined path: where every staged window goes, as delivery records.

No backend is involved: given one device's staged splits (in graph order), the
slot layout (a piece's span in a slot: its window padded to the alignment, or
the stream's whole stride when streams are not packed) and where each slot
starts, :func:`plan_deliveries` returns one :class:`Delivery` per staged split.
Delivery ``o`` *is* staged split ``o``'s window (``Delivery.split`` names it):
it goes into slot ``o mod n_slots``; its ``early`` ranges (the stable prefix,
rows below the ubatch) are what the transfer stream copies ahead of time, its
``late`` ranges (the rows written this ubatch) what the consumer stream copies
at the split, and ``windows`` the bindings the split's kernels read (offsets in
the slot's buffer). The executor (``sim.transport.scheduler``) issues them.

One walk of a delivery: split ``gpu_attn_l7`` is staged split 1; with depth 1
the ring holds 3 slots, so delivery 1 goes to slot 1 at ``base = 1 x
slot_alloc_bytes``; its K window's prefix rows are an early range
``(src = the K block's first row, dst = base, n = prefix bytes)`` and its
last rows a late range right after; the executor issues the early range on the
transfer stream after split ``gpu0`` is enqueued (``o <= consumed + N``),
having made that stream wait on ``release[1]`` if slot 1 was used before, then
records ``ready[1]``; at ``gpu_attn_l7`` the consumer stream copies the late
range, waits on ``ready[1]``, runs the kernels over ``windows`` and records
``release[1]``.

Units: bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.base import CopyRange, KeptRanges
from sim.bindings import window
from sim.graph import DecodeGraph, Split, StagedInput, WindowPiece

SpanFn = Callable[[int, int], int]  # (window bytes, the stream's reserved stride) -> bytes in a slot
PrefixFn = Callable[[StagedInput, int, int, int], int]
WindowEntry = tuple[str, int, int]  # (binding name, offset, bytes)


@dataclass(frozen=True)
class Delivery:
    """Staged split ``split``'s windows: slot, early and late copy ranges, and the kernel bindings."""

    o: int
    split: int
    slot: int
    base: int
    early: tuple[CopyRange, ...]
    late: tuple[CopyRange, ...]
    parts: tuple[tuple[tuple[WindowEntry, ...], tuple[WindowEntry, ...]], ...]  # per staged input, window_parts
    #: ``Schedule.fresh_on_device``: (offset in the target, bytes) of each row the producing split writes into the
    #: slot itself (the rows written this graph); the early ranges are the window less these rows, and nothing is late.
    fresh: tuple[tuple[int, int], ...] = ()

    @property
    def windows(self) -> tuple[WindowEntry, ...]:
        """Every binding the split's kernels read: per input its whole window, then its per-stream parts."""
        return tuple(e for whole, parts in self.parts for e in whole + parts)

    @property
    def early_bytes(self) -> int:
        return sum(r.nbytes for r in self.early)

    @property
    def late_bytes(self) -> int:
        return sum(r.nbytes for r in self.late)


def align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def stable_early(p: WindowPiece) -> int:
    """The early bytes of piece ``p``: its stable prefix, in whole rows when it is strided (as ``Ring.early_bytes``)."""
    return p.prefix_bytes if p.rows == 1 else p.prefix_bytes // p.width * p.width


def piece_range(p: WindowPiece, dst_offset: int, start: int, end: int) -> CopyRange:
    """The copy of bytes ``[start, end)`` of piece ``p`` (whole rows for a strided piece) to ``dst_offset + start``."""
    if p.rows == 1:
        return CopyRange(p.src_offset + start, dst_offset + start, end - start)
    w = p.width
    return CopyRange(p.src_offset + start // w * p.src_pitch, dst_offset + start, end - start, (end - start) // w, p.src_pitch)


@functools.cache
def span_fn(pack_streams: bool, alignment: int) -> SpanFn:
    """Bytes a piece takes in a slot, from its window bytes and its stream's stride: the window padded (packed) or
    the stream's whole stride (unpacked). Called as ``span(p.nbytes, p.reserve_bytes)``. One function per
    arguments (kept), so a span names its layout in the caches below."""
    if pack_streams:
        return lambda nbytes, reserve: align_up(nbytes, alignment)
    return lambda nbytes, reserve: align_up(max(nbytes, reserve), alignment)


def slot_entries(splits: Sequence[Split], span: SpanFn) -> tuple[int, dict[int, list[tuple[StagedInput, int]]]]:
    """(bytes one slot needs, split index -> (input, offset in the slot)) for a device's staged splits."""
    need = 0
    entries: dict[int, list[tuple[StagedInput, int]]] = {}
    for s in splits:
        off = 0
        lst = []
        for inp in s.staged:
            lst.append((inp, off))
            off += slot_span(inp, span)
        entries[s.index] = lst
        need = max(need, off)
    return need, entries


def slot_span(inp: StagedInput, span: SpanFn) -> int:
    """Bytes ``inp`` takes in a slot: its pieces' spans. A function of its layout, kept by ``inp.layout_id``. Pure."""

    def make() -> int:
        if inp.extent:  # the pieces at their cache stride, gaps included
            return span(inp.extent_bytes, inp.extent_bytes)
        return sum(span(p.nbytes, p.reserve_bytes) for p in inp.pieces)

    return make() if inp.layout_id < 0 else _kept(_SPANS, (inp.layout_id, span), make)  # type: ignore[no-any-return]


def full_need(split: Split, graph: DecodeGraph, span: SpanFn) -> int:
    """What the split's slot would need with every window at the full context (kept per layout and window sizes)."""
    return sum(_full_span(inp, graph, span) for inp in split.staged)


def _full_span(inp: StagedInput, graph: DecodeGraph, span: SpanFn) -> int:
    """Bytes ``inp`` would take in a slot at the full context: a function of its layout and the two window sizes."""

    def make() -> int:
        scale = graph.full_window_rows / max(1, graph.window_rows)
        if inp.extent:
            extent = inp.pieces[-1].src_offset - inp.pieces[0].src_offset + int(inp.pieces[-1].nbytes * scale)
            return span(extent, extent)
        return sum(span(int(p.nbytes * scale), p.reserve_bytes) for p in inp.pieces)

    key = (inp.layout_id, span, graph.full_window_rows, graph.window_rows)
    return make() if inp.layout_id < 0 else _kept(_FULL, key, make)  # type: ignore[no-any-return]


_WINDOWS: dict[tuple[int, str, int, SpanFn], tuple[tuple[WindowEntry, ...], tuple[WindowEntry, ...]]] = {}
_ORDERED: dict[tuple[int, int, SpanFn], tuple[tuple[CopyRange, ...], int]] = {}
_SPANS: dict[tuple[int, SpanFn], int] = {}
_FULL: dict[tuple[int, SpanFn, int, int], int] = {}
KEPT_LAYOUTS = 1 << 16  # entries per cache; a full one is emptied (ids are never reused, so nothing kept goes stale)


def _kept(cache: dict[Any, Any], key: Any, make: Callable[[], Any]) -> Any:
    got = cache.get(key)
    if got is None:
        if len(cache) >= KEPT_LAYOUTS:
            cache.clear()
        got = cache[key] = make()
    return got


def window_parts(inp: StagedInput, start: int, span: SpanFn) -> tuple[tuple[WindowEntry, ...], tuple[WindowEntry, ...]]:
    """``inp`` as the kernels read it from ``start``: (the whole window, ``window:<name>``; with several streams each
    stream's part, ``window:<name>#<i>``, inside it, else nothing). A function of the name and the pieces' layout,
    kept by both (``inp.layout_id``: see ``sim.graph.StagedInput``). Pure."""
    if inp.layout_id < 0:
        return _window_parts(inp, start, span)
    return _kept(_WINDOWS, (inp.layout_id, inp.name, start, span), lambda: _window_parts(inp, start, span))  # type: ignore[no-any-return]


def _window_parts(inp: StagedInput, start: int, span: SpanFn) -> tuple[tuple[WindowEntry, ...], tuple[WindowEntry, ...]]:
    if len(inp.pieces) == 1:
        return ((window(inp.name), start, inp.nbytes),), ()
    if inp.extent:  # each stream's part at its offset in the cache, from the first piece's
        first = inp.pieces[0].src_offset
        return (((window(inp.name), start, inp.extent_bytes),),
                tuple((window(inp.name, i), start + p.src_offset - first, p.nbytes) for i, p in enumerate(inp.pieces)))
    out, off, end = [], start, start
    for i, p in enumerate(inp.pieces):
        out.append((window(inp.name, i), off, p.nbytes))
        end = off + p.nbytes
        off += span(p.nbytes, p.reserve_bytes)
    return ((window(inp.name), start, end - start),), tuple(out)


def ordered_copy(inp: StagedInput, start: int, span: SpanFn) -> tuple[tuple[CopyRange, ...], int]:
    """(the ranges, bytes spanned) of ``inp`` copied whole to ``start`` (the ordered path): one range per piece, each
    at its span; an ``extent`` window in one range from its first piece's start to its last piece's end. A function of
    the pieces' layout, kept by ``inp.layout_id``. Pure."""

    def make() -> tuple[tuple[CopyRange, ...], int]:
        if inp.extent:
            nbytes = inp.extent_bytes
            return KeptRanges([CopyRange(inp.pieces[0].src_offset, start, nbytes)]), span(nbytes, nbytes)
        off, ranges = start, []
        for p in inp.pieces:
            ranges.append(piece_range(p, off, 0, p.nbytes))
            off += span(p.nbytes, p.reserve_bytes)
        return KeptRanges(ranges), off - start

    return make() if inp.layout_id < 0 else _kept(_ORDERED, (inp.layout_id, start, span), make)  # type: ignore[no-any-return]


def fresh_eligible(split: Split) -> bool:
    """Whether the fresh-rows schedule can serve ``split``: every staged input one contiguous piece (one stream, whole
    rows), so a row's offset in the window is its offset in the cache block. Pure."""
    return bool(split.staged) and all(len(inp.pieces) == 1 and inp.pieces[0].rows == 1 for inp in split.staged)


def _holes(p: WindowPiece, start: int, rows: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ``rows`` (cache offset, bytes) inside piece ``p`` at or past byte ``start`` of it, as (start, end) in it."""
    out = []
    for off, n in rows:
        a = off - p.src_offset
        if a >= start and a + n <= p.nbytes:
            out.append((a, a + n))
    return sorted(out)


def in_pieces(ranges: Sequence[CopyRange], piece_bytes: int) -> list[tuple[CopyRange, ...]]:
    """``ranges`` cut into copies of at most ``piece_bytes`` (0: one copy of them all); a strided range is cut at
    whole rows. Pure."""
    if not piece_bytes:
        return [tuple(ranges)]
    out: list[tuple[CopyRange, ...]] = []
    for r in ranges:
        if r.rows == 1:
            out += [(CopyRange(r.src_offset + a, r.dst_offset + a, min(piece_bytes, r.nbytes - a)),)
                    for a in range(0, r.nbytes, piece_bytes)]
            continue
        per = max(1, piece_bytes // r.width)
        for i in range(0, r.rows, per):
            k = min(per, r.rows - i)
            out.append((CopyRange(r.src_offset + i * r.src_pitch, r.dst_offset + i * r.width, k * r.width, k, r.src_pitch),))
    return out


def plan_deliveries(order: Sequence[Split], entries: dict[int, list[tuple[StagedInput, int]]], n_slots: int,
                    slot_base: Callable[[int], int], span: SpanFn, early_of: PrefixFn | None = None,
                    one_cell_early: bool = False, fresh: Mapping[int, Sequence[tuple[int, int]]] | None = None,
                    first_slot: int = 0) -> list[Delivery]:
    """One delivery per staged split of ``order``. Pure: reads no backend.

    ``slot_base(slot)`` is the slot's byte offset in the buffer deliveries go
    to; ``early_of(input, piece, prefix_bytes, nbytes)`` the early bytes of one
    piece (its stable prefix, in whole rows for a strided piece); None: the
    prefix as the graph gives it (:func:`stable_early`).
    ``one_cell_early`` sizes each stream's early range from one cell (the
    ``one-cell-range`` mutation): the late ranges still start where the full
    prefix ends, so the rest of the prefix is never delivered.
    ``fresh`` (``Schedule.fresh_on_device``): staged split index -> the cache
    rows (offset, bytes) its layer's CPU split writes this graph; such a
    split's delivery is all early: the window up to its top written row, less
    those rows past the stable prefix, which ``Delivery.fresh`` names in the
    slot (the producing split writes them). The rows above the top written row
    are the window's padding (the window is sized from that row): no sequence
    attends them this graph, and they are not sent (the reference sends them
    late, with the rows).
    ``first_slot``: delivery o goes to slot ``(first_slot + o) mod n_slots``
    (``Schedule.across_tokens``: the slots go on round from the last graph's).
    """
    if any(inp.extent for split in order for inp, _ in entries[split.index]):
        raise ValueError("a window copied as one extent (kv-copy span: upstream llama.cpp's ordered copy of a split cache) "
                         "has no pipelined delivery; allowed: depth 0, or kv-copy streams")
    out = []
    for o, split in enumerate(order):
        slot = (first_slot + o) % n_slots
        base = slot_base(slot)
        early: list[CopyRange] = []
        late: list[CopyRange] = []
        parts: list[tuple[tuple[WindowEntry, ...], tuple[WindowEntry, ...]]] = []
        rows = fresh.get(split.index) if fresh else None
        own: list[tuple[int, int]] = []
        for inp, entry_off in entries[split.index]:
            off = base + entry_off
            for i, p in enumerate(inp.pieces):
                e = early_of(inp, i, p.prefix_bytes, p.nbytes) if early_of else stable_early(p)
                if rows is not None:  # the window less the rows its producer writes into the slot: all early
                    own += [(off + a, b - a) for a, b in _holes(p, 0, rows)]  # what the producer writes, all of it
                    at = 0  # early: the piece less the rows past e (a stale e would deliver rows the producer writes)
                    cuts = _holes(p, e, rows)
                    for a, b in cuts:
                        if a > at:
                            early.append(piece_range(p, off, at, a))
                        at = b
                    if p.nbytes > at and not cuts:  # above the top row written: padding no sequence attends, not sent
                        early.append(piece_range(p, off, at, p.nbytes))
                    off += span(p.nbytes, p.reserve_bytes)
                    continue
                if p.nbytes > e:
                    late.append(piece_range(p, off, e, p.nbytes))
                if e and len(inp.pieces) > 1 and one_cell_early:
                    e = min(e, p.cell_bytes or p.width)
                if e:
                    early.append(piece_range(p, off, 0, e))
                off += span(p.nbytes, p.reserve_bytes)
            parts.append(window_parts(inp, base + entry_off, span))
        out.append(Delivery(o, split.index, slot, base, tuple(early), tuple(late), tuple(parts), tuple(own)))
    return out
