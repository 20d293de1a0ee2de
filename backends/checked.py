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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.base import Backend, Buffer, CopyRange, Event, HostOp, Span, Stream, Work

HOST = 0
PRUNE_AT = 48


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


@dataclass
class _Access:
    lo: int
    hi: int
    write: bool
    actor: int
    tick: int
    op: int


@dataclass
class _History:
    buffer: Buffer
    accesses: list[_Access] = field(default_factory=list)
    limit: int = PRUNE_AT


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
        self._actor_of: dict[Stream, int] = {}
        self._events: dict[Event, list[int]] = {}
        self._hist: dict[Buffer, _History] = {}
        self._ops: list[Op] = []
        self._pairs: set[tuple[int, int]] = set()
        self._context = ""

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    # ------------------------------------------------------------ clocks

    def _actor(self, stream: Stream) -> int:
        a = self._actor_of.get(stream)
        if a is None:
            a = len(self._actors)
            self._actor_of[stream] = a
            self._actors.append(stream.name)
            self._clocks.append([0] * a + [0])
        return a

    @staticmethod
    def _join(into: list[int], other: Sequence[int]) -> None:
        if len(into) < len(other):
            into.extend([0] * (len(other) - len(into)))
        for i, v in enumerate(other):
            if v > into[i]:
                into[i] = v

    def _tick(self, actor: int) -> int:
        clock = self._clocks[actor]
        if len(clock) <= actor:
            clock.extend([0] * (actor + 1 - len(clock)))
        clock[actor] += 1
        return clock[actor]

    def _enqueue(self, stream: Stream) -> int:
        a = self._actor(stream)
        self._join(self._clocks[a], self._clocks[HOST])
        self._tick(a)
        return a

    # ---------------------------------------------------------- accesses

    def _op(self, kind: str, name: str, actor: int) -> int:
        self._ops.append(Op(kind, name, self._actors[actor], self._context))
        return len(self._ops) - 1

    def _access(self, buf: Buffer, lo: int, hi: int, write: bool, actor: int, op: int) -> None:
        if hi <= lo:
            return
        hist = self._hist.get(buf)
        if hist is None:
            hist = self._hist[buf] = _History(buf)
        clock = self._clocks[actor]
        tick = clock[actor]
        for acc in hist.accesses:
            if acc.hi <= lo or hi <= acc.lo or not (write or acc.write) or acc.op == op:
                continue
            if acc.actor == actor or (len(clock) > acc.actor and clock[acc.actor] >= acc.tick):
                continue
            self._report(buf, max(lo, acc.lo), min(hi, acc.hi), acc, write, op)
        if actor != HOST:  # a host access happens before everything enqueued after it
            hist.accesses.append(_Access(lo, hi, write, actor, tick, op))
            if len(hist.accesses) > hist.limit:
                self._prune(hist)

    def _report(self, buf: Buffer, lo: int, hi: int, first: _Access, write: bool, op: int) -> None:
        pair = (first.op, op)
        if pair in self._pairs:
            return
        self._pairs.add(pair)
        self.hazard_count += 1
        if len(self.examples) < self.max_examples:
            self.examples.append(Hazard(buf.name, lo, hi, self._ops[first.op], first.write, self._ops[op], write))

    def _prune(self, hist: _History) -> None:
        """Drop accesses the host already knows about.

        A later access is either the host's own or enqueued later, and every
        enqueue joins the host's clock: once the host's clock covers an access,
        it happens before everything still to come.
        """
        host = self._clocks[HOST]
        hist.accesses = [a for a in hist.accesses if a.actor >= len(host) or host[a.actor] < a.tick]
        hist.limit = max(PRUNE_AT, 2 * len(hist.accesses))

    def _work_accesses(self, work: Work, actor: int, kind: str) -> None:
        op = self._op(kind, work.name, actor)
        for acc in work.accesses:
            self._access(acc.buffer, acc.offset, acc.offset + acc.nbytes, acc.write, actor, op)

    # --------------------------------------------------------- Protocol

    def now_s(self) -> float:
        return self.inner.now_s()

    def device_count(self) -> int:
        return self.inner.device_count()

    def create_stream(self, device: int, name: str) -> Stream:
        stream = self.inner.create_stream(device, name)
        self._actor(stream)
        return stream

    def create_event(self, device: int, name: str) -> Event:
        return self.inner.create_event(device, name)

    def record(self, event: Event, stream: Stream) -> HostOp:
        a = self._enqueue(stream)
        self._events[event] = list(self._clocks[a])
        return (yield from self.inner.record(event, stream))

    def wait_event(self, stream: Stream, event: Event) -> HostOp:
        a = self._enqueue(stream)
        snap = self._events.get(event)
        if snap is not None:
            self._join(self._clocks[a], snap)
        return (yield from self.inner.wait_event(stream, event))

    def copy(self, stream: Stream, dst: Buffer, src: Buffer, ranges: Sequence[CopyRange], tag: str = "") -> HostOp:
        a = self._enqueue(stream)
        op = self._op("copy", tag or f"{src.name}->{dst.name}", a)
        for r in ranges:
            for o, n in r.src_rows():
                self._access(src, o, o + n, False, a, op)
            self._access(dst, r.dst_offset, r.dst_offset + r.nbytes, True, a, op)
        if self.record_copies:
            self.copies.append(CopySeen(stream.name, dst, src, tuple(ranges), tag))
        result = yield from self.inner.copy(stream, dst, src, ranges, tag)
        host_side = src if src.on_host else dst
        if not host_side.pinned:
            self._join(self._clocks[HOST], self._clocks[a])
        return result

    def launch(self, stream: Stream, work: Work) -> HostOp:
        a = self._enqueue(stream)
        self._context = work.name
        self._work_accesses(work, a, "kernel")
        return (yield from self.inner.launch(stream, work))

    def run_host(self, work: Work) -> HostOp:
        self._tick(HOST)
        self._context = work.name
        self._work_accesses(work, HOST, "cpu")
        return (yield from self.inner.run_host(work))

    def synchronize(self, stream: Stream) -> HostOp:
        self._join(self._clocks[HOST], self._clocks[self._actor(stream)])
        return (yield from self.inner.synchronize(stream))

    def wait_host(self, event: Event) -> HostOp:
        snap = self._events.get(event)
        if snap is not None:
            self._join(self._clocks[HOST], snap)
        return (yield from self.inner.wait_host(event))

    def alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        return self.inner.alloc(device, nbytes, name)

    def alloc_host(self, nbytes: int, name: str, pinned: bool = True) -> Buffer:
        return self.inner.alloc_host(nbytes, name, pinned)

    def free(self, buffer: Buffer) -> None:
        self._tick(HOST)
        self._access(buffer, 0, buffer.nbytes, True, HOST, self._op("free", buffer.name, HOST))
        self._hist.pop(buffer, None)
        self.inner.free(buffer)

    def free_bytes(self, device: int) -> int:
        return self.inner.free_bytes(device)

    def timeline(self) -> list[Span]:
        return self.inner.timeline()

    # ----------------------------------------------------------- report

    def report(self, n: int | None = None) -> list[str]:
        """One line per hazard example (at most ``n``). Does not block."""
        return [h.describe() for h in self.examples[: self.max_examples if n is None else n]]
