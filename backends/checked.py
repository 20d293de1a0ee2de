"""A happens-before race checker that wraps any backend.

``CheckedBackend(inner)`` implements the backend Protocol by forwarding every
call to ``inner`` and, on the way, keeps *vector clocks* for the actors that
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

Every memory access is recorded with its actor and that actor's clock: a copy
reads its source ranges and writes its destination ranges (``CopyRange``,
2D pieces row by row), a kernel or CPU split accesses ``Work.accesses``, and
``free`` writes the whole buffer (memory returned while a copy is in flight is
a race too). A new access is compared with the earlier accesses of the same
buffer on overlapping bytes: a read/write or write/write pair whose earlier
access does not happen before the later one is a *hazard*, reported with both
operations (kind, name, actor, the split the host was at), the buffer and the
byte range. Accesses the host has synchronized past are pruned (everything
enqueued later is ordered after them), so the history stays short and the checker costs little in a plain simulation.

The checker only looks at what the host program enqueues; it does not need
real bytes, so it runs in timing-only simulations too.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from backends.base import Backend, Buffer, CopyRange, Event, HostOp, Span, Stream, Work

HOST = 0
PRUNE_AT = 64  # a history is pruned when a list outgrows this (pruning changes no report: it drops only ordered accesses)
_TICK = operator.itemgetter(2)  # the tick of a history entry (lo, hi, tick, op)

_Entries = list[tuple[int, int, int, int]]  # (lo, hi, tick, op), ticks ascending


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


class _History:
    """One buffer's unpruned accesses: per (actor, write), in order of first access, a list of (lo, hi, tick, op), ticks ascending."""

    __slots__ = ("lists", "limit")

    def __init__(self) -> None:
        self.lists: list[tuple[int, bool, _Entries]] = []
        self.limit = PRUNE_AT


# What an access of one kind (actor, write) to one buffer walks: the lists of the other actors it can
# conflict with (their writes; their reads too if it writes), in the history's order, the actor's own
# list of that kind (None until it has one) and the history. Cached per kind and buffer; a new list
# in the history drops every plan of that buffer.
_Plan = tuple[tuple[tuple[int, bool, _Entries], ...], "_Entries | None", _History]


class CheckedBackend:
    """The backend Protocol over ``inner``, with a happens-before check of every buffer access. Never blocks on its own."""

    def __init__(self, inner: Backend, max_examples: int = 5, record_copies: bool = False) -> None:
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
        self._hist: dict[Buffer, _History] = {}
        self._plans: list[dict[Buffer, _Plan]] = [{}, {}]  # per kind, actor * 2 + write: buffer -> its plan
        self._ops: list[tuple[str, str, int, str]] = []
        self._pairs: set[tuple[int, int]] = set()
        self._context = [""]  # the name of the split the host is at (a cell, so the hot methods reach it through _hot)
        self._waited: list[bool] = [False]  # per stream: joined an event snapshot since the host last joined its clock
        # The containers the hot methods use, fetched with one attribute load: ``__getattr__`` makes
        # every ``self.x`` of this class take the slow generic path. They are only ever changed in place.
        self._hot = (self._actor_of, self._clocks, self._host, self._plans, self._ops, self._waited, self._context)
        self.now_s = inner.now_s  # type: ignore[method-assign]

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    # ------------------------------------------------------------ clocks
    #
    # A stream's clock here leaves out what it knows through the host: every
    # enqueue would join the host's clock, which only grows, so a stream's
    # effective clock is max(its own, the host's now). That spares a join per
    # enqueue; ``record`` materializes the effective clock into the event.

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
            self._plans += ({}, {})
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
        self._join(self._clocks[HOST], clock)

    # ---------------------------------------------------------- accesses
    #
    # An access by ``actor`` at ``tick`` (its own clock entry) is checked against
    # each list of its plan: the list's last tick is its latest, so when that is
    # within what the actor knows of the list's actor (its own clock or the
    # host's, whichever is later), the whole list happens before the access.
    # Otherwise ``_scan`` compares the entries the actor does not know of,
    # newest first. Then the access is added to the actor's own list (a host
    # access is not kept: it happens before everything enqueued after it).

    def _plan(self, buf: Buffer, actor: int, write: bool) -> _Plan:
        hist = self._hist.get(buf)
        if hist is None:
            hist = self._hist[buf] = _History()
        lists = hist.lists
        checks = tuple(e for e in lists if e[0] != actor and (write or e[1]))
        own = next((entries for other, w, entries in lists if other == actor and w == write), None)
        plan = self._plans[2 * actor + write][buf] = (checks, own, hist)
        return plan

    def _own(self, buf: Buffer, hist: _History, actor: int, write: bool) -> _Entries:
        """A new list for (actor, write) on ``buf``, last in walk order; the buffer's plans are dropped."""
        entries: _Entries = []
        hist.lists.append((actor, write, entries))
        for plans in self._plans:
            plans.pop(buf, None)
        return entries

    def _scan(self, buf: Buffer, lo: int, hi: int, write: bool, op: int, other_write: bool, entries: _Entries, seen: int) -> None:
        """Report every entry after ``seen`` that overlaps [lo, hi), newest first."""
        for e_lo, e_hi, e_tick, e_op in reversed(entries):
            if e_tick <= seen:
                break
            if e_lo < hi and lo < e_hi and e_op != op:
                self._report(buf, max(lo, e_lo), min(hi, e_hi), e_op, other_write, write, op)

    def _accesses(self, accesses: Iterable[tuple[Buffer, int, int, bool]], actor: int, op: int) -> None:
        """Check, then record, each (buffer, offset, nbytes, write) access of one operation on ``actor``, in order."""
        clock = self._clocks[actor]
        host = self._host
        tick = clock[actor]
        reads, writes = self._plans[2 * actor], self._plans[2 * actor + 1]
        for buf, lo, n, write in accesses:
            if n <= 0:
                continue
            hi = lo + n
            plan = (writes if write else reads).get(buf)
            if plan is None:
                plan = self._plan(buf, actor, write)
            checks, own, hist = plan
            for other, other_write, entries in checks:
                if entries:
                    c, h = clock[other], host[other]
                    seen = c if c > h else h
                    if entries[-1][2] > seen:
                        self._scan(buf, lo, hi, write, op, other_write, entries, seen)
            if actor:
                if own is None:
                    own = self._own(buf, hist, actor, write)
                own.append((lo, hi, tick, op))
                if len(own) > hist.limit:
                    self._prune(hist)

    def _work_accesses(self, work: Work, actor: int, op: int, clock: list[int], host: list[int], plans: list[dict[Buffer, _Plan]]) -> None:
        """``_accesses`` over a kernel's or CPU split's declared accesses (``clock`` is the actor's).

        The check loop is written out here and in ``copy`` on purpose: routing both through
        ``_accesses`` (attrgetter tuples, one list per copy) measured +0.02 s on the checker
        benchmark, about 15% of the checker's cost (+27% -> +31% over a plain simulation).
        """
        tick = clock[actor]
        reads, writes = plans[2 * actor], plans[2 * actor + 1]
        for access in work.accesses:
            n = access.nbytes
            if n <= 0:
                continue
            buf = access.buffer
            write = access.write
            lo = access.offset
            hi = lo + n
            plan = (writes if write else reads).get(buf)
            if plan is None:
                plan = self._plan(buf, actor, write)
            checks, own, hist = plan
            for other, other_write, entries in checks:
                if entries:
                    c, h = clock[other], host[other]
                    seen = c if c > h else h
                    if entries[-1][2] > seen:
                        self._scan(buf, lo, hi, write, op, other_write, entries, seen)
            if actor:
                if own is None:
                    own = self._own(buf, hist, actor, write)
                own.append((lo, hi, tick, op))
                if len(own) > hist.limit:
                    self._prune(hist)

    def _report(self, buf: Buffer, lo: int, hi: int, first_op: int, first_write: bool, write: bool, op: int) -> None:
        pair = (first_op, op)
        if pair in self._pairs:
            return
        self._pairs.add(pair)
        self.hazard_count += 1
        if len(self.examples) < self.max_examples:
            self.examples.append(Hazard(buf.name, lo, hi, self._op_of(first_op), first_write, self._op_of(op), write))

    def _op_of(self, op: int) -> Op:
        kind, name, actor, context = self._ops[op]
        return Op(kind, name, self._actors[actor], context)

    def _prune(self, hist: _History) -> None:
        """Drop accesses the host already knows about.

        A later access is either the host's own or enqueued later, and every
        enqueue joins the host's clock: once the host's clock covers an access,
        it happens before everything still to come.
        """
        host = self._host
        longest = 0
        for actor, _, entries in hist.lists:
            seen = host[actor]
            if entries and entries[0][2] <= seen:
                del entries[: bisect.bisect_right(entries, seen, key=_TICK)]
            if len(entries) > longest:
                longest = len(entries)
        hist.limit = max(PRUNE_AT, 2 * longest)

    # --------------------------------------------------------- Protocol

    def now_s(self) -> float:
        return self.inner.now_s()  # replaced by the inner bound method in __init__ (no layer on a hot path)

    def device_count(self) -> int:
        return self.inner.device_count()

    def create_stream(self, device: int, name: str) -> Stream:
        stream = self.inner.create_stream(device, name)
        self._actor(stream)
        return stream

    def create_event(self, device: int, name: str) -> Event:
        return self.inner.create_event(device, name)

    # Host operations do their bookkeeping when called and hand back the inner
    # backend's generator (the caller runs it with ``yield from`` at once), so
    # the checker adds no generator layer.

    def record(self, event: Event, stream: Stream) -> HostOp:
        actor_of, clocks, host, _, _, _, _ = self._hot
        a = actor_of.get(stream)
        if a is None:
            a = self._actor(stream)
        clock = clocks[a]
        clock[a] += 1
        self._events[event] = list(map(max, clock, host))  # the stream's effective clock
        return self.inner.record(event, stream)

    def wait_event(self, stream: Stream, event: Event) -> HostOp:
        actor_of, clocks, _, _, _, waited, _ = self._hot
        a = actor_of.get(stream)
        if a is None:
            a = self._actor(stream)
        clock = clocks[a]
        clock[a] += 1
        snap = self._events.get(event)
        if snap is not None:
            if len(clock) == len(snap):
                clock[:] = map(max, clock, snap)
            else:
                self._join(clock, snap)
            waited[a] = True
        return self.inner.wait_event(stream, event)

    def copy(self, stream: Stream, dst: Buffer, src: Buffer, ranges: Sequence[CopyRange], tag: str = "") -> HostOp:
        # the enqueue, the op record and the common one-range check, inline on the busiest operation
        actor_of, clocks, host, plans, ops, _, context = self._hot
        a = actor_of.get(stream)
        if a is None:
            a = self._actor(stream)
        clock = clocks[a]
        tick = clock[a] + 1
        clock[a] = tick
        op = len(ops)
        ops.append(("copy", tag or f"{src.name}->{dst.name}", a, context[0]))
        if len(ranges) == 1 and ranges[0].rows == 1:
            r = ranges[0]
            n = r.nbytes
            if n > 0:
                lo = r.src_offset
                hi = lo + n
                plan = plans[2 * a].get(src)
                if plan is None:
                    plan = self._plan(src, a, False)
                checks, own, hist = plan
                for other, other_write, entries in checks:  # the writes of other actors
                    if entries:
                        c, h = clock[other], host[other]
                        seen = c if c > h else h
                        if entries[-1][2] > seen:
                            self._scan(src, lo, hi, False, op, other_write, entries, seen)
                if own is None:
                    own = self._own(src, hist, a, False)
                own.append((lo, hi, tick, op))
                if len(own) > hist.limit:
                    self._prune(hist)
                lo = r.dst_offset
                hi = lo + n
                plan = plans[2 * a + 1].get(dst)
                if plan is None:
                    plan = self._plan(dst, a, True)
                checks, own, hist = plan
                for other, other_write, entries in checks:
                    if entries:
                        c, h = clock[other], host[other]
                        seen = c if c > h else h
                        if entries[-1][2] > seen:
                            self._scan(dst, lo, hi, True, op, other_write, entries, seen)
                if own is None:
                    own = self._own(dst, hist, a, True)
                own.append((lo, hi, tick, op))
                if len(own) > hist.limit:
                    self._prune(hist)
        else:
            accesses: list[tuple[Buffer, int, int, bool]] = []
            for r in ranges:
                if r.rows == 1:
                    accesses.append((src, r.src_offset, r.nbytes, False))
                else:
                    accesses += [(src, o, n, False) for o, n in r.src_rows()]
                accesses.append((dst, r.dst_offset, r.nbytes, True))
            self._accesses(accesses, a, op)
        if self.record_copies:
            self.copies.append(CopySeen(stream.name, dst, src, tuple(ranges), tag))
        inner = self.inner.copy(stream, dst, src, ranges, tag)
        return inner if (src if src.device < 0 else dst).pinned else self._then_host_learns(inner, a)

    def _then_host_learns(self, op: HostOp, actor: int) -> HostOp:
        """Run ``op`` (a copy from pageable memory, which blocks the host), then join its stream into the host."""
        result = yield from op
        self._host_learns(self._clocks[actor])
        return result

    def launch(self, stream: Stream, work: Work) -> HostOp:
        actor_of, clocks, host, plans, ops, _, context = self._hot
        a = actor_of.get(stream)
        if a is None:
            a = self._actor(stream)
        clock = clocks[a]
        clock[a] += 1
        name = context[0] = work.name
        ops.append(("kernel", name, a, name))  # an Op is built only when reported
        self._work_accesses(work, a, len(ops) - 1, clock, host, plans)
        return self.inner.launch(stream, work)

    def run_host(self, work: Work) -> HostOp:
        _, _, host, plans, ops, _, context = self._hot
        host[HOST] += 1
        name = context[0] = work.name
        ops.append(("cpu", name, HOST, name))
        self._work_accesses(work, HOST, len(ops) - 1, host, host, plans)
        return self.inner.run_host(work)

    def synchronize(self, stream: Stream) -> HostOp:
        actor_of, clocks, host, _, _, waited, _ = self._hot
        a = actor_of.get(stream)
        if a is None:
            a = self._actor(stream)
        if waited[a]:  # the stream joined an event since the host last joined it: join it all
            waited[a] = False
            self._join(host, clocks[a])
        else:  # only its own tick moved since: the host knew the rest at its last join, and the host's clock only grows
            tick = clocks[a][a]
            if tick > host[a]:
                host[a] = tick
        return self.inner.synchronize(stream)

    def wait_host(self, event: Event) -> HostOp:
        snap = self._events.get(event)
        if snap is not None:
            self._host_learns(snap)
        return self.inner.wait_host(event)

    def alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        return self.inner.alloc(device, nbytes, name)

    def alloc_host(self, nbytes: int, name: str, pinned: bool = True) -> Buffer:
        return self.inner.alloc_host(nbytes, name, pinned)

    def free(self, buffer: Buffer) -> None:
        self._host[HOST] += 1
        ops = self._ops
        ops.append(("free", buffer.name, HOST, self._context[0]))
        self._accesses(((buffer, 0, buffer.nbytes, True),), HOST, len(ops) - 1)
        self._hist.pop(buffer, None)
        for plans in self._plans:
            plans.pop(buffer, None)
        self.inner.free(buffer)

    def free_bytes(self, device: int) -> int:
        return self.inner.free_bytes(device)

    def timeline(self) -> list[Span]:
        return self.inner.timeline()

    # ----------------------------------------------------------- report

    def report(self, n: int | None = None) -> list[str]:
        """One line per hazard example (at most ``n``). Does not block."""
        return [h.describe() for h in self.examples[: self.max_examples if n is None else n]]
