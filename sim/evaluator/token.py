"""One token of the transport scheduler as a program over lanes: the host, two streams, two FIFO copy engines.

Every lane is one (point, token) whose graph has the same shape and whose ring decision is the same (ordered, or
pipelined at depth N; the slots already used and the boundary wait the same, or given per lane); its numbers are a row of the
cost matrix (``sim.evaluator.costs``). The program is the scheduler's (``TransportScheduler.run_graph``); its clocks
run on the SimPy machine's timing rules (``sim.evaluator.token_machine``), each lane's times kept in NumPy arrays.

Every delivery's release wait is on a release already recorded (a ring has N + 2 slots, and each staged split
follows a CPU split that synchronized the consumer), so it never holds the transfer stream; ready waits do hold
the consumer stream. Units: seconds and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backends.profile import DeviceProfile, HostCosts
from sim.evaluator.costs import Layout, SplitCols
from sim.evaluator.token_machine import Arr, Machine


@dataclass(frozen=True)
class Setup:
    """What the ring decided for the lanes' token: depth (0: ordered), slots already used, the boundary wait."""

    depth: int = 0
    n_slots: int = 0
    slots_used: tuple[bool, ...] = ()
    boundary: bool = False


def run_token(layout: Layout, X: Arr, setup: Setup, host: HostCosts, dev: DeviceProfile, used: Arr | None = None,
              boundary: Arr | None = None) -> dict[str, Arr | float]:
    """Run one token of ``layout`` over the lanes of ``X`` (one row each). Returns each GraphStats time and byte
    field (arrays) and count (numbers; an array where the lanes' counts differ), as the scheduler would have counted
    them. ``used``/``boundary`` (a bool per lane), given, replace ``setup``'s: whether each lane's ring slots are
    already used (its first ``min(staged, n_slots)``), whether it waits at the boundary -- so the lanes of every token of
    a depth run as one matrix. Does not block."""
    return _Token(layout, X, setup, host, dev, used, boundary).run()


class _Token:
    """One token's host program over the lanes, as the scheduler runs it: the ordered inputs' blocking copies, the
    deliveries issued up to ``depth`` splits ahead, each staged split's late rows, wait and launch; ``st`` counts what
    the scheduler's GraphStats count."""

    def __init__(self, layout: Layout, X: Arr, setup: Setup, host: HostCosts, dev: DeviceProfile, used: Arr | None = None,
                 boundary: Arr | None = None) -> None:
        n_d2h = sum(len(c.ordered) for c in layout.splits if c.kind == "cpu")
        self.m = Machine(X.shape[0], layout.staged, n_d2h, host, dev, ordered=setup.depth == 0)
        z = np.zeros(X.shape[0])
        self.st: dict[str, Arr | float] = {"blocked_ordered_s": z, "consumer_wait_s": z, "issue_s": z, "boundary_wait_s": z,
                                           "early_bytes": z, "late_bytes": z, "ordered_bytes": z, "ordered_copies": 0,
                                           "depth_stops": 0, "recycle_waits": 0, "deliveries": 0}
        self.layout, self.X, self.setup, self.host = layout, X, setup, host
        self.used: list[bool | Arr] = list(setup.slots_used)
        if used is not None:  # per lane: the slots a lane's earlier deliveries used
            self.used = [used if o < min(layout.staged, setup.n_slots) else False for o in range(setup.n_slots)]
        self.boundary = boundary
        self.staged = [c for c in layout.splits if c.windows]
        self.issued = self.consumed = 0

    def wait_consumer(self) -> None:
        m = self.m
        t = m.h
        m.sync()
        self.st["consumer_wait_s"] = self.st["consumer_wait_s"] + (m.h - t)

    def blocking(self, seconds: Arr, nbytes: Arr, to_device: bool) -> None:
        """One blocking copy of an ordered input (host to device: on the consumer stream, then a sync)."""
        m, st = self.m, self.st
        t = m.h
        if to_device:
            m.h2d_consumer(seconds)
            m.sync()
        else:
            m.d2h(seconds)
            m.h = np.maximum(m.h, m.cons_done) + self.host.host_wait_s
        st["blocked_ordered_s"] = st["blocked_ordered_s"] + (m.h - t)
        st["ordered_bytes"] = st["ordered_bytes"] + nbytes
        st["ordered_copies"] += 1

    def prefetch(self) -> None:
        """Issue deliveries (early parts) up to ``depth`` staged splits past the one consumed last."""
        m, st, setup, X = self.m, self.st, self.setup, self.X
        t = m.h
        S = len(self.staged)
        while self.issued < S and self.issued <= self.consumed + setup.depth:
            o = self.issued
            slot = o % setup.n_slots
            was = self.used[slot]
            if isinstance(was, np.ndarray):
                if was.any():
                    m.event(was)
                    st["recycle_waits"] = st["recycle_waits"] + was.astype(np.int64)
            elif was:
                m.event()
                st["recycle_waits"] += 1
            es, eb = self.staged[o].early
            m.deliver(o, X[:, es], X[:, eb])
            st["early_bytes"] = st["early_bytes"] + X[:, eb]
            self.used[slot] = True
            st["deliveries"] += 1
            self.issued += 1
        if self.issued < S:
            st["depth_stops"] += 1
        st["issue_s"] = st["issue_s"] + (m.h - t)

    def gpu_split(self, c: SplitCols) -> None:
        """A GPU split: its ordered inputs; a staged one's late rows, the wait on its delivery, the launch, the
        release and the next deliveries (depth 0: its windows as blocking copies, then the launch)."""
        m, st, X = self.m, self.st, self.X
        if c.ordered:
            self.wait_consumer()
            for s_col, b_col in c.ordered:
                self.blocking(X[:, s_col], X[:, b_col], True)
        if c.windows and self.setup.depth:
            ls, lb = c.late
            m.h2d_consumer(X[:, ls])
            st["late_bytes"] = st["late_bytes"] + X[:, lb]
            m.event()
            m.pending.append(("wait", self.consumed, m.h))
            m.launch(X[:, c.compute], c.launches)
            m.event()
            m.pending.append(("record", m.h))
            self.consumed += 1
            self.prefetch()
            return
        if c.windows:
            self.wait_consumer()
            for s_col, b_col in c.windows:
                self.blocking(X[:, s_col], X[:, b_col], True)
        m.launch(X[:, c.compute], c.launches)

    def run(self) -> dict[str, Arr | float]:
        m, X = self.m, self.X
        if self.boundary is None and self.setup.boundary:
            m.h = m.h + self.host.host_wait_s  # the transfer stream: idle since the last token's last delivery was waited on
            m.h = m.h + self.host.host_wait_s  # the consumer stream: the last token ended by synchronizing it
            self.st["boundary_wait_s"] = m.h.copy()
        elif self.boundary is not None and self.boundary.any():  # the same two waits, in the lanes that wait
            m.h = np.where(self.boundary, m.h + self.host.host_wait_s + self.host.host_wait_s, m.h)
            self.st["boundary_wait_s"] = np.where(self.boundary, m.h, self.st["boundary_wait_s"])
        if self.setup.depth:
            self.prefetch()
        for c in self.layout.splits:
            if c.kind == "cpu":  # the new rows come down (blocking), then the host stores them
                self.wait_consumer()
                for s_col, b_col in c.ordered:
                    self.blocking(X[:, s_col], X[:, b_col], False)
                m.h = m.h + X[:, c.compute]
            else:
                self.gpu_split(c)
        self.wait_consumer()
        self.st["total_s"] = m.h
        return self.st
