"""A happens-before race checker that wraps any machine, and is a machine itself.

``CheckedBackend(inner)`` is a ``backends.machine.Machine`` whose hooks do the
checker's bookkeeping and call ``inner``'s hooks (the base keeps every
invariant once, at the checker's door); ``launch`` and ``run_host``, which have
no hooks, it watches and hands to ``inner``; the members it does not watch are
``inner``'s own (bound once). On the way it keeps *vector clocks* for the actors that
can touch memory: the host thread and each stream. The clocks follow the
orderings a CUDA program can rely on, at enqueue time:

* the host's operations are ordered among themselves (program order);
* enqueueing an item on a stream joins the host's clock into the stream (the
  item starts after everything the host did before enqueueing it), and items
  of one stream are ordered (stream order);
* ``record`` snapshots the stream's clock into the event; ``wait_event`` joins
  that snapshot into the waiting stream (an event wait on a never-recorded
  event orders nothing, as in CUDA);
* ``synchronize`` joins the stream's clock into the host; ``wait_host`` joins
  the event's snapshot; a copy from pageable host memory blocks the host, so
  it joins the copy's stream into the host.

Every operation's memory accesses count: a copy reads its source ranges and
writes its destination ranges (``CopyRange``, 2D pieces row by row), a kernel
or CPU split accesses ``Work.accesses``, and ``free`` writes the whole buffer
(memory returned while a copy is in flight is a race too). Two accesses of
different actors to overlapping bytes of one buffer, at least one a write,
whose earlier one does not happen before the later one, are a *hazard*,
reported with both operations (kind, name, actor, the split the host was at),
the buffer and the byte range (``backends.hazards`` holds the report and
the range helpers).

**What is kept: the operations in flight.** A stream's operation can only be
unordered with a later one while the host has not synchronized past it:
everything enqueued later joins the host's clock, and a host operation is
ordered before everything enqueued after it. So the checker keeps, per
stream, just the operations the host does not know of yet (in enqueue order;
a ``synchronize`` empties the stream's list, any join of the host's clock
drops what it now covers), and checks an operation only against the kept
operations of the *other* actors that its own clock does not cover. When
there are none, the common case in a decode loop that synchronizes often, an
operation costs a tick, one record and one appended item: its byte ranges are
looked at only when something unordered with it is in flight, and then only
those in-flight operations are compared. A host operation's accesses are
checked and never kept.

The checker only looks at what the host program enqueues; it does not need
real bytes, so it runs in timing-only simulations too. ``run``,
``describe`` and ``xp`` are the inner machine's; a copy the machines refuse
(``backends.base.plan_copy``, in the base's ``copy``) raises before the checker counts it.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence
from typing import Any

from backends.base import Access, Buffer, CopyPlan, CopyRange, Event, HostOp, Stream, Work
from backends.hazards import CopySeen, Found, Hazard, Item, Op, copy_ranges, ranges_of, work_ranges
from backends.machine import Machine

__all__ = ["CheckedBackend", "CopySeen", "Hazard", "Op"]

HOST = 0
_TICK = operator.itemgetter(0)  # the tick of a kept item

#: The members of the inner machine the checker does not watch: bound to the checker as they are (no layer).
PASSED = ("now_s", "device_count", "describe", "run", "alloc_host", "free_bytes", "timeline", "clear_timeline", "xp")


class CheckedBackend(Machine):
    """A machine over ``inner``, with a happens-before check of every buffer access. Never blocks on its own."""

    def __init__(self, inner: Machine, max_examples: int = 5, record_copies: bool = False) -> None:
        self.inner = inner
        self.name = f"checked({inner.name})"
        self.max_examples = max_examples
        self.record_copies = record_copies
        self.copies: list[CopySeen] = []
        self.hazard_count = 0
        self.examples: list[Hazard] = []
        self._actors: list[str] = ["host"]
        self._clocks: list[list[int]] = [[0]]
        self._host = self._clocks[HOST]  # the host's clock; every join and new actor updates it in place
        self._actor_of: dict[Stream, int] = {}
        self._events: dict[Event, list[int]] = {}
        self._kept: list[list[Item]] = [[]]  # per actor, its operations the host does not know of (the host's stays empty)
        self._others: list[tuple[tuple[int, list[Item]], ...]] = [()]  # per actor, (actor, kept) of every stream but itself
        self._pairs: set[tuple[int, int, int, int]] = set()  # (actor, tick) of the first operation, then of the second
        self._context = ""  # the name of the split the host is at
        self._waited: list[bool] = [False]  # per stream: joined an event snapshot since the host last joined its clock
        for member in PASSED:
            setattr(self, member, getattr(inner, member))

    # Only the Protocol's unwatched members are bound (the inner machine is ``.inner``): a ``__getattr__`` would
    # make every ``self.x`` load of this class take CPython's slow generic path.

    # ------------------------------------------------------------ clocks
    #
    # A stream's clock here leaves out what it knows through the host: every
    # enqueue would join the host's clock, which only grows, so a stream's
    # effective clock is max(its own, the host's now). That spares a join per
    # enqueue; ``record`` materializes the effective clock into the event.
    #
    # Kept items: a stream's operations with a tick the host's clock does not
    # cover, ticks ascending. Whenever the host's clock grows, what it covers
    # is dropped (it happens before everything enqueued from then on).

    def _actor(self, stream: Stream) -> int:
        a = self._actor_of.get(stream)
        if a is None:
            a = len(self._actors)
            self._actor_of[stream] = a
            self._actors.append(stream.name)
            for clock in self._clocks:
                clock.append(0)
            self._clocks.append([0] * (a + 1))
            self._waited.append(False)
            self._kept.append([])
            streams = range(1, a + 1)
            self._others = [tuple((b, self._kept[b]) for b in streams if b != me) for me in range(a + 1)]
        return a

    @staticmethod
    def _join(into: list[int], other: Sequence[int]) -> None:
        if len(into) == len(other):
            into[:] = map(max, into, other)
        else:  # an event snapshot taken before a stream was created
            for i, v in enumerate(other):
                if v > into[i]:
                    into[i] = v

    def _host_learns(self, clock: Sequence[int]) -> None:
        """Join ``clock`` into the host's, then drop the kept items it now covers."""
        host = self._host
        self._join(host, clock)
        for a, items in enumerate(self._kept):
            if items and items[0][0] <= host[a]:
                if items[-1][0] <= host[a]:
                    items.clear()
                else:
                    del items[: bisect.bisect_right(items, host[a], key=_TICK)]

    # ---------------------------------------------------------- accesses
    #
    # An operation by ``actor`` is compared with the kept items of every other
    # stream that its clock does not cover (ticks above what it knows of that
    # stream: its own clock entry or the host's, whichever is later). The hot
    # methods test for any such item inline and call ``_check`` only then; it
    # skips a kept copy whose two buffers cannot conflict before building any
    # range, and builds an item's ranges once, per buffer with their bounds.

    def _check(
        self, actor: int, tick: int, clock: list[int], me: tuple[str, str, str], src: Buffer | None, dst: Buffer | None, what: Sequence[Any]
    ) -> None:
        """Report each access of the operation at ``tick`` on ``actor`` that conflicts with an unordered kept item.

        The operation is a copy (``src``, ``dst``, its CopyRanges in ``what``) or, with ``src`` None,
        a kernel, CPU split or free (its ``Access``es in ``what``); ``me`` is its (kind, name,
        context). In the order of its accesses; per access, the other streams in order, their
        items newest first.
        """
        host = self._host
        unordered: list[Found] = []
        for b, items in self._others[actor]:
            if items:
                c, h = clock[b], host[b]
                seen = c if c > h else h
                for item in reversed(items):
                    if item[0] <= seen:
                        break
                    y_src = item[2]
                    if src is not None and y_src is not None:  # two copies: this one reads src and writes dst, the kept one
                        y_dst = item[3]  # reads y_src and writes y_dst; skip it unless they can conflict
                        if src is not y_dst and dst is not y_dst and dst is not y_src:
                            continue
                    unordered.append(item[5] or ranges_of(item))
        if not unordered:
            return
        mine = work_ranges(what) if src is None else copy_ranges(src, dst, what)  # type: ignore[arg-type]
        for buf, lo, hi, write in mine:
            for first, writes, reads in unordered:
                entry = writes.get(buf)  # their writes conflict with any access
                if entry is not None and entry[0] < hi and lo < entry[1]:
                    for o_lo, o_hi in entry[2]:
                        if o_lo < hi and lo < o_hi:
                            self._report(buf, o_lo if o_lo > lo else lo, o_hi if o_hi < hi else hi, first, True, actor, tick, me, write)
                entry = reads.get(buf) if write else None  # their reads only with a write
                if entry is not None and entry[0] < hi and lo < entry[1]:
                    for o_lo, o_hi in entry[2]:
                        if o_lo < hi and lo < o_hi:
                            self._report(buf, o_lo if o_lo > lo else lo, o_hi if o_hi < hi else hi, first, False, actor, tick, me, write)

    def _report(
        self, buf: Buffer, lo: int, hi: int, first: Item, first_write: bool, actor: int, tick: int, me: tuple[str, str, str], write: bool
    ) -> None:
        """Count the pair (``first``'s operation, this one) once; keep the first ``max_examples`` as examples.

        An operation is named by its actor and its tick on that actor's clock: every operation ticks it.
        """
        pair = (first[1], first[0], actor, tick)
        if pair in self._pairs:
            return
        self._pairs.add(pair)
        self.hazard_count += 1
        if len(self.examples) < self.max_examples:
            second = Op(me[0], me[1], self._actors[actor], me[2])
            self.examples.append(Hazard(buf.name, lo, hi, self._op_of(first), first_write, second, write))

    def _op_of(self, item: Item) -> Op:
        """The kept item's operation, for a report."""
        _, actor, src, dst, _, _, name, context = item
        if src is None:
            return Op("kernel", name, self._actors[actor], context)
        return Op("copy", name or f"{src.name}->{dst.name}", self._actors[actor], context)

    # ------------------------------------------------------------ hooks

    def _create_stream(self, device: int, name: str) -> Stream:
        stream = self.inner._create_stream(device, name)
        self._actor(stream)
        return stream

    def _create_event(self, device: int, name: str) -> Event:
        return self.inner._create_event(device, name)

    # Host operations do their bookkeeping when called and hand back the inner
    # machine's generator (the caller runs it with ``yield from`` at once), so
    # the checker adds no generator layer.

    def _record(self, event: Event, stream: Stream) -> HostOp:
        a = self._actor_of.get(stream)
        if a is None:
            a = self._actor(stream)
        clock = self._clocks[a]
        clock[a] += 1
        self._events[event] = list(map(max, clock, self._host))  # the stream's effective clock
        return self.inner._record(event, stream)

    def _wait_event(self, stream: Stream, event: Event) -> HostOp:
        a = self._actor_of.get(stream)
        if a is None:
            a = self._actor(stream)
        clock = self._clocks[a]
        clock[a] += 1
        snap = self._events.get(event)
        if snap is not None:
            if len(clock) == len(snap):
                clock[:] = map(max, clock, snap)
            else:
                self._join(clock, snap)
            self._waited[a] = True
        return self.inner._wait_event(stream, event)

    def _enqueue(self, stream: Stream) -> tuple[int, list[int], int, bool]:
        """Tick ``stream`` for an operation on it: (actor, its clock, the tick, whether another stream has unordered work in flight)."""
        a = self._actor_of.get(stream)
        if a is None:
            a = self._actor(stream)
        clock = self._clocks[a]
        tick = clock[a] + 1
        clock[a] = tick
        host = self._host
        for b, items in self._others[a]:
            if items:
                t = items[-1][0]
                if t > clock[b] and t > host[b]:
                    return a, clock, tick, True
        return a, clock, tick, False

    def _copy(self, stream: Stream, dst: Buffer, src: Buffer, ranges: Sequence[CopyRange], plan: CopyPlan, tag: str) -> HostOp:
        if not isinstance(ranges, tuple):  # kept: the caller's sequence is not ours (a tuple, KeptRanges too, is)
            ranges = tuple(ranges)
        inner = self.inner._copy(stream, dst, src, ranges, plan, tag)
        a, clock, tick, in_flight = self._enqueue(stream)
        if in_flight:
            self._check(a, tick, clock, ("copy", tag or f"{src.name}->{dst.name}", self._context), src, dst, ranges)
        self._kept[a].append([tick, a, src, dst, ranges, None, tag, self._context])
        if self.record_copies:
            self.copies.append(CopySeen(stream.name, dst, src, ranges, tag))
        return inner if (src if src.device < 0 else dst).pinned else self._then_host_learns(inner, a)

    def _then_host_learns(self, op: HostOp, actor: int) -> HostOp:
        """Run ``op`` (a copy from pageable memory, which blocks the host), then join its stream into the host."""
        result = yield from op
        self._host_learns(self._clocks[actor])
        return result

    def launch(self, stream: Stream, work: Work) -> HostOp:
        """See ``Backend.launch``: checked, then the inner machine's."""
        a, clock, tick, in_flight = self._enqueue(stream)
        name = self._context = work.name
        if in_flight:
            self._check(a, tick, clock, ("kernel", name, name), None, None, work.accesses)
        self._kept[a].append([tick, a, None, None, work.accesses, None, name, name])
        return self.inner.launch(stream, work)

    def run_host(self, work: Work) -> HostOp:
        """See ``Backend.run_host``: checked, then the inner machine's."""
        host = self._host
        tick = host[HOST] = host[HOST] + 1
        name = self._context = work.name
        if any(self._kept):  # every kept item is one the host does not know of
            self._check(HOST, tick, host, ("cpu", name, name), None, None, work.accesses)
        return self.inner.run_host(work)

    def _synchronize(self, stream: Stream) -> HostOp:
        a = self._actor_of.get(stream)
        if a is None:
            a = self._actor(stream)
        if self._waited[a]:  # the stream joined an event since the host last joined it: join it all
            self._waited[a] = False
            self._host_learns(self._clocks[a])
        else:  # only its own tick moved since: the host knew the rest at its last join, and the host's clock only grows
            host = self._host
            tick = self._clocks[a][a]
            if tick > host[a]:  # (else it has nothing kept: the host knew all of it)
                host[a] = tick
                self._kept[a].clear()  # every operation of the stream is now known to the host
        return self.inner._synchronize(stream)

    def _wait_host(self, event: Event) -> HostOp:
        snap = self._events.get(event)
        if snap is not None:
            self._host_learns(snap)
        return self.inner._wait_host(event)

    def _alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        return self.inner._alloc(device, nbytes, name)

    def _free(self, buffer: Buffer) -> None:
        host = self._host
        tick = host[HOST] = host[HOST] + 1
        if buffer.nbytes > 0 and any(self._kept):
            self._check(HOST, tick, host, ("free", buffer.name, self._context), None, None, (Access(buffer, 0, buffer.nbytes, True),))
        self.inner._free(buffer)

    # ----------------------------------------------------------- report

    def report(self, n: int | None = None) -> list[str]:
        """One line per hazard example (at most ``n``). Does not block."""
        return [h.describe() for h in self.examples[: self.max_examples if n is None else n]]
