"""The clocks of one token over lanes (``sim.evaluator.token``'s machine): the host thread, the consumer and transfer
streams, and one FIFO copy engine per direction, each lane's times kept in NumPy arrays, on the SimPy machine's
timing rules:

* the host thread pays each call's cost and blocks in ``synchronize`` until the stream's last item is done, then
  pays its wake-up; a blocking copy is a copy and a synchronize;
* a stream runs its items in order; the consumer stream is idle whenever the host issues a copy on it (every
  consumer copy is blocking or follows a CPU split that synchronized it), so a consumer copy asks for its engine
  when it is issued;
* the H2D engine serves copies in the order they ask, except that a transfer copy that ends while the next
  delivery's copy is already queued keeps the engine for it (``copy_engine_drains_stream``): the consumer's copy
  goes before transfer copy ``o`` only if it was issued before ``o`` and ``o`` does not follow on at once. That
  order is decided per lane (``np.where``), and re-decided whenever something the host does later could still
  change a copy that has not started (with a slowdown, a D2H copy it would start under);
* a copy that starts while the other direction's engine is busy takes ``duplex_slowdown`` times as long;
* a kernel is stretched by the bytes the transfer stream's copies move through device memory while it runs, over
  ``dram_bytes_per_s``, pro rata, in up to three rounds (``SimMachine._contended``).

Units: seconds and bytes.
"""

from __future__ import annotations

import numpy as np

from backends.profile import DeviceProfile, HostCosts

Arr = np.ndarray
INF = np.inf
_all, _any = np.logical_and.reduce, np.logical_or.reduce  # ``ndarray.all``/``any`` without their Python wrappers
_max, _min = np.maximum.reduce, np.minimum.reduce


def _marks(c: list) -> tuple[int, int]:
    """The lowest and highest of consumer copy ``c``'s placed-before markers (-1: not placed), kept with it."""
    if c[6] is None:
        c[6] = (int(_min(c[5])), int(_max(c[5])))
    return c[6]


class Machine:
    """One token's clocks over ``L`` lanes (the host program calls it as the scheduler calls the backend)."""

    def __init__(self, lanes: int, n_deliveries: int, n_d2h: int, host: HostCosts, dev: DeviceProfile, ordered: bool) -> None:
        self.L, self.ordered = lanes, ordered
        self.host, self.dev = host, dev
        self.slowdown, self.dram = dev.duplex_slowdown, dev.dram_bytes_per_s
        z = np.zeros
        self.h, self.cons_done = z(lanes), z(lanes)
        # transfer copies, one column per delivery: enqueue, ready-record enqueue, base seconds, bytes, grant, end
        self.t_enq, self.t_rec = z((lanes, n_deliveries)), z((lanes, n_deliveries))
        self.t_dur, self.t_bytes = z((lanes, n_deliveries)), z((lanes, n_deliveries))
        self.t_grant, self.t_end = np.full((lanes, n_deliveries), INF), np.full((lanes, n_deliveries), INF)
        self.T = 0  # transfer copies issued
        self.first_open = 0  # the first transfer copy that may still change
        self.o_final = 0  # transfer copies before it ended before the host's clock in every lane
        # consumer H2D copies: (issued, seconds, transfer copies issued before it, grant, end, placed before which, the
        # lowest and highest of those markers or None)
        self.c: list[list] = []
        self.c_open: list[int] = []
        # D2H copies (on the consumer stream, blocking)
        self.d_start, self.d_end = np.full((lanes, n_d2h), INF), np.full((lanes, n_d2h), INF)
        self.D = 0
        self.pending: list[tuple] = []  # consumer items since the last time its clock was brought up to date
        # after a resolve: (transfer copies then, consumer copies issued then, the engine's clock after the last of them)
        self._tail: tuple[int, int, Arr] | None = None
        # Arrays are never written in place once made (every step makes new ones; ``h`` too), so a copy's clocks and
        # placeholders may be shared: ``_never`` (not placed: INF), ``_at(o)`` (placed before transfer copy o).
        self._never = np.full(lanes, INF)
        self._placed: dict[int, Arr] = {}

    # ------------------------------------------------------------ engines

    def _at(self, o: int) -> Arr:
        a = self._placed.get(o)
        if a is None:
            a = self._placed[o] = np.full(self.L, o)
        return a

    def _d2h_busy(self, g: Arr) -> Arr:
        if self.D == 0:
            return np.zeros(self.L, dtype=bool)
        s, e = self.d_start[:, : self.D], self.d_end[:, : self.D]
        return np.asarray(((s <= g[:, None]) & (g[:, None] < e)).any(axis=1))

    def _place_consumer(self, o: int, free: Arr, chained: Arr | None, first: int = 0) -> Arr:
        """Place the open consumer copies issued before transfer copy ``o`` (all of them when ``chained`` is None;
        ``first``: only the copies issued from this one on)."""
        free_lanes = None if chained is None else ~chained
        free_all, free_any = (True, True) if free_lanes is None else (bool(_all(free_lanes)), bool(_any(free_lanes)))
        for ci in self.c_open:
            c = self.c[ci]
            if c[2] > o or ci < first:
                continue
            lo, hi = _marks(c)
            if lo >= 0:  # placed in every lane: nothing to place
                continue
            if hi < 0:  # placed in no lane: the lanes to place are the free ones
                place, every, some = free_lanes, free_all, free_any
            else:
                place = c[5] < 0
                if free_lanes is not None:
                    place &= free_lanes
                every, some = bool(_all(place)), bool(_any(place))
            if every:  # every lane: the same values ``np.where`` would give, without it
                g = np.maximum(c[0], free)
                c[3], c[4], c[5], c[6] = g, g + c[1], self._at(o), (o, o)
                free = c[4]
                continue
            if not some:
                continue
            assert place is not None  # (without a mask, ``every`` held)
            g = np.maximum(c[0], free)
            end = g + c[1]
            c[3] = np.where(place, g, c[3])
            c[4] = np.where(place, end, c[4])
            c[5], c[6] = np.where(place, o, c[5]), None
            free = np.where(place, end, free)
        return free

    def resolve(self) -> None:
        """Bring the H2D engine's schedule up to date with everything issued so far."""
        o0 = self.first_open
        if o0 == self.T and self._tail is not None and self._tail[0] == o0:
            # Nothing re-decided since the last time: its copies placed after every transfer copy would be placed
            # again from the same clock to the same values; only the consumer copies issued since are placed.
            _, issued, free = self._tail
            self._tail = (o0, len(self.c), self._place_consumer(o0, free, None, issued))
            return
        for ci in self.c_open:
            c = self.c[ci]
            lo, hi = _marks(c)
            if lo >= o0:  # every lane's marker is reset
                c[5], c[6] = self._at(-1), (-1, -1)
            elif hi >= o0:
                c[5], c[6] = np.where(c[5] >= o0, -1, c[5]), None
        free = self.t_end[:, o0 - 1].copy() if o0 > 0 else np.full(self.L, -INF)
        prev = free
        for o in range(o0, self.T):
            chained = self.t_enq[:, o] <= prev if o > 0 else np.zeros(self.L, dtype=bool)
            free = self._place_consumer(o, free, chained)
            g = np.maximum(np.maximum(self.t_enq[:, o], prev), free)
            dur = self.t_dur[:, o]
            if self.slowdown != 1.0:
                dur = np.where(self._d2h_busy(g), dur * self.slowdown, dur)
            end = g + dur
            self.t_grant[:, o], self.t_end[:, o] = g, end
            free = prev = end
        self._tail = (self.T, len(self.c), self._place_consumer(self.T, free, None))
        self.first_open = self.T

    def _invalidate(self, since: Arr) -> None:
        """Transfer copies that start at or after ``since`` (in any lane) may change: re-decide them."""
        o = self.T
        while o > 0 and (self.t_grant[:, o - 1] >= since).any():
            o -= 1
        self.first_open = min(self.first_open, o)

    # ------------------------------------------------------------ consumer stream

    def _stretch(self, start: Arr, seconds: Arr) -> Arr:
        """A kernel's end: ``seconds`` from ``start``, stretched by the transfer copies it overlaps."""
        now = start + seconds
        if not self.dram or self.T == 0:
            return now
        s, e, n = self.t_grant[:, : self.T], self.t_end[:, : self.T], self.t_bytes[:, : self.T]
        t0 = start
        live = np.ones(self.L, dtype=bool)
        moved = e > s
        span = np.where(moved, e - s, 1.0)  # (only a hit's span is read: it moved, e > s)
        for _ in range(3):
            t1 = now
            hit = (s < t1[:, None]) & (e > t0[:, None]) & moved
            if not _any(hit, axis=None):  # every part 0: the kernel is not stretched (again)
                break
            part = np.where(hit, n * (np.minimum(e, t1[:, None]) - np.maximum(s, t0[:, None])) / span, 0.0)
            extra = np.add.reduce(part, axis=1) / self.dram
            live &= extra > 1e-12
            if not _any(live):
                break
            now = np.where(live, now + extra, now)
            t0 = np.where(live, t1, t0)
        return now

    def catch_up(self) -> None:
        """Bring the consumer stream's clock up to date (its pending items, in order)."""
        if not self.pending:
            return
        self.resolve()
        done = self.cons_done
        for item in self.pending:
            kind = item[0]
            if kind == "copy":  # a consumer H2D copy: its engine slot
                done = np.maximum(done, self.c[item[1]][4])
            elif kind == "wait":  # wait on delivery o's ready record
                _, o, enq = item
                ready = np.maximum(self.t_end[:, o], self.t_rec[:, o])
                done = np.maximum(np.maximum(done, enq), ready)
            elif kind == "kernel":
                _, seconds, enq = item
                done = self._stretch(np.maximum(done, enq), seconds)
            else:  # a record
                done = np.maximum(done, item[1])
        self.cons_done = done
        self.pending.clear()
        # A consumer copy can be re-placed only after a transfer copy that may still change; those that ended before
        # the host's clock in every lane never change (nothing the host does later starts before it).
        while self.o_final < self.T and (self.t_end[:, self.o_final] <= self.h).all():
            self.o_final += 1
        if self.ordered:  # no transfer copy ever: a copy that ended is behind every later one
            kept = [ci for ci in self.c_open if not _all(self.c[ci][4] <= self.h)]
            if len(kept) < len(self.c_open):  # the copies dropped were the tail's first: place it anew next time
                self._tail = None
            self.c_open = kept
        else:  # (a copy dropped was placed before a transfer copy in every lane: never in the tail)
            self.c_open = [ci for ci in self.c_open if _marks(self.c[ci])[1] >= self.o_final or _marks(self.c[ci])[0] < 0]

    # ------------------------------------------------------------ host calls

    def sync(self) -> None:
        """``synchronize(consumer)``: block until its last item is done, then wake."""
        self.catch_up()
        self.h = np.maximum(self.h, self.cons_done) + self.host.host_wait_s

    def h2d_consumer(self, seconds: Arr) -> None:
        """Issue an H2D copy on the consumer stream."""
        self.h = self.h + self.host.copy_issue_s
        self.c.append([self.h, seconds, self.T, self._never, self._never, self._at(-1), (-1, -1)])
        self.c_open.append(len(self.c) - 1)
        self.pending.append(("copy", len(self.c) - 1))

    def d2h(self, seconds: Arr) -> None:
        """Issue a D2H copy on the consumer stream (idle: the host synchronized it) and let it run."""
        self.catch_up()
        self.h = self.h + self.host.copy_issue_s
        start = np.maximum(self.h, self.cons_done)
        if self.slowdown != 1.0 and self.T:
            self.resolve()
            busy = ((self.t_grant[:, : self.T] <= start[:, None]) & (start[:, None] < self.t_end[:, : self.T])).any(axis=1)
            seconds = np.where(busy, seconds * self.slowdown, seconds)
        end = start + seconds
        if self.slowdown != 1.0:  # (without a slowdown no H2D copy reads a D2H copy: nothing to re-decide)
            self.d_start[:, self.D], self.d_end[:, self.D] = start, end
            self.D += 1
            self._invalidate(start)
        self.cons_done = end

    def launch(self, seconds: Arr, launches: int) -> None:
        cost = self.host.launch_s * launches
        if cost > 0:
            self.h = self.h + cost
        self.pending.append(("kernel", seconds, self.h))
        if self.host.split_launch_s > 0:
            self.h = self.h + self.host.split_launch_s

    def event(self, where: Arr | None = None) -> None:
        """A record or an event wait: the host's cost of the call (``where``: only in these lanes)."""
        if self.host.event_s > 0:
            self.h = self.h + self.host.event_s if where is None else np.where(where, self.h + self.host.event_s, self.h)

    def deliver(self, o: int, seconds: Arr, nbytes: Arr) -> None:
        """Issue delivery ``o``'s early copy on the transfer stream, then record its ``ready``."""
        self.h = self.h + self.host.copy_issue_s
        self.t_enq[:, o], self.t_dur[:, o], self.t_bytes[:, o] = self.h, seconds, nbytes
        self.event()
        self.t_rec[:, o] = self.h
        self.T = o + 1
