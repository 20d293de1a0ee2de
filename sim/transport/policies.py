"""The delivery schedules' executor pieces (``sim.transport.config.Schedule``; docs/schedules.md).

``TransportScheduler`` inherits them. ``inputs_first`` moves the ring's
priming behind the first GPU split's small inputs and its launch
(:meth:`SchedulePolicies._prime_all`; on the H200, a first split launched behind
queued deliveries did not start before the engine had drained them, run 1 of
docs/schedules.md);
``late_first`` and ``piece_bytes`` are two lines of the scheduler's own
(when ``_prefetch`` runs, how a delivery's early ranges are cut).
``across_tokens`` issues the next graph's first delivery within this one
(:meth:`SchedulePolicies._deliver_ahead`), right behind this graph's last
delivery on the transfer stream: only where nothing about the ring changes
between the two graphs (same slots, big enough, not declined, the next graph
writes no host cell at its start), once the CPU split that writes that layer's
row this graph has run (the window's bytes are final: the rows the next graph
writes are late, or fresh holes, never early), into the slot after this
graph's last (the slots go on round), behind that slot's release. The rest of this module is the fresh
rows (``fresh_on_device``): no late copy, and the CPU split off the GPU's path.

In the reference mechanism a layer's new K/V rows make a round trip through the
host before the split that attends them can run: the producing split writes
them to the device io buffer, the host waits for it, copies them down,
writes them into the host cache (the CPU split), and the attention split
copies them up again as its delivery's *late* part -- on the one H2D engine,
behind whatever early delivery was queued before it. Both engines and the GPU
wait for that round trip once per attention layer.

Under this policy the producing split also writes the rows into the slot of the
delivery that will read them (the program stores each sequence's row at its
cell, as it does into a resident cache; ``fresh:<input>`` bindings name the
slot's windows), and that delivery is the window up to its top written row
less those rows, all early (``sim.transport.deliveries.plan_deliveries``,
``fresh``; the padding above the top row, which no sequence attends, stays
unsent). The rows still go
down to the host cache, for the next tokens: the CPU split's copy down is
enqueued on the consumer stream right behind the producing split (before the
next split can overwrite the io buffer) and an event recorded after it; the
host launches the attention split first, and only then waits for that event and
runs the CPU split, while the GPU computes. Nothing the GPU runs waits for the
host any more.

Why it is exact: every byte the kernels read in the slot is the ordered
window's (the early ranges are the host cache's bytes outside the rows; the
rows are the bytes the CPU split writes, encoded once on the device; the
kernels read only the cells the graph inputs name, none above the top row); the slot's previous reader ran
earlier on the same consumer stream, so the store cannot overtake it; the
early ranges and the rows are disjoint, so the transfer stream and the
consumer never write the same byte; the host reads the rows' host copy only
after the event that follows the copy down. The mutations ``no-fresh-store``
and ``no-rows-wait`` switch off the last two.

Eligible: a staged split whose inputs are one contiguous piece each (one
stream, not a tensor split), whose rows come from the GPU split two before it on
the same device through the CPU split between them. Others keep the late copy.
Units: bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from backends.base import Access, Backend, Buffer, CopyRange, Event, HostOp, Stream, Work
from sim.bindings import Binding, fresh
from sim.graph import DecodeGraph, Split
from sim.transport.config import GraphStats, Mutations, Schedule
from sim.transport.deliveries import Delivery, fresh_eligible


def fresh_rows(graph: DecodeGraph, order: list[Split]) -> dict[int, tuple[tuple[int, int], ...]]:
    """Staged split index -> the cache rows (offset, bytes) its CPU split writes, for the eligible splits. Pure."""
    out = {}
    splits = graph.splits
    for s in order:
        i = s.index
        if i < 2 or not fresh_eligible(s):
            continue
        cpu, producer = splits[i - 1], splits[i - 2]
        if cpu.kind != "cpu" or not cpu.stores_rows or producer.kind != "gpu" or producer.device != s.device:
            continue
        out[i] = tuple(row for inp in cpu.ordered for row in inp.rows)
    return out


class SchedulePolicies:
    """The schedules' executor pieces (a mixin: the state is ``TransportScheduler``'s)."""

    be: Backend
    policy: Mutations
    program: Any
    host_cache: Buffer
    io_host: Buffer
    io_dev: dict[int, Buffer]
    consumer: list[Stream]
    _rows_down: dict[int, Event]
    _deferred: list[tuple[Split, Event]]
    _cpu_work: Callable[[Split], Work]  # OrderedPath's
    _cpu_split: Callable[[Split, GraphStats], HostOp]  # OrderedPath's
    _prefetch: Callable[[Any, GraphStats, int], HostOp]  # TransportScheduler's
    _plans: dict[int, Any]
    schedule: Schedule

    _next_slot: dict[int, int]
    _ahead: dict[int, Any]
    _ahead_tried: bool
    _rows_done: set[int]
    upcoming: DecodeGraph | None
    rings: dict[int, Any]
    cfg: Any
    _slot_needs: Callable[[DecodeGraph], list[Any]]
    _plan_deliveries: Callable[[int, Any, DecodeGraph], None]

    def _deliver_ahead(self, stats: GraphStats, when: str) -> HostOp:
        """``across_tokens``: the next graph's first delivery, once per graph, its plan kept for it in ``self._ahead``.

        ``when`` is ``ready`` (after each GPU split: issued once every delivery of this graph is issued and the CPU
        split of the layer it delivers has run, so the engine goes on from this graph's last delivery to it) or
        ``end`` (the same, at the graph's end); ``start`` only under the ``ahead-before-rows`` mutation (at graph
        start, before this graph's CPU splits write rows the next window holds).
        """
        nxt = self.upcoming
        if self._ahead_tried or not self.schedule.across_tokens or (when == "start") == self.policy.ahead_after_rows:
            return
        if nxt is None or nxt.host_writes_at_start or nxt.device_kv_bytes:
            return
        if when != "start" and any(p.active and p.issued < len(p.deliveries) for p in self._plans.values()):
            return
        needs = self._slot_needs(nxt)
        if when != "start" and any(splits[0].attn_layer not in self._rows_done for _, splits, *_ in needs):
            return
        self._ahead_tried = True
        for dev, splits, need, entries, full in needs:
            plan, ring = self._plans.get(dev), self.rings.get(dev)
            if (plan is None or not plan.active or ring is None or ring.buffer is None or need > ring.slot_alloc_bytes
                    or ring.decline_reason(self.cfg, self.be, need, full)):
                continue
            ahead = type(plan)(True, need, entries, splits)
            self._plan_deliveries(dev, ahead, nxt)
            self._ahead[dev] = (nxt, ahead, ring.buffer)
            yield from self._prefetch(ahead, stats, -self.cfg.depth)  # o <= 0: the first delivery

    def _take_ahead(self, dev: int, plan: Any, graph: DecodeGraph) -> bool:
        """Whether ``plan`` (this graph's, device ``dev``) takes the deliveries planned and begun ahead for it."""
        got = self._ahead.get(dev)
        if got is None or got[0] is not graph or got[2] is not self.rings[dev].buffer:
            return False
        ahead = got[1]
        plan.target, plan.deliveries, plan.fresh_of, plan.issued = ahead.target, ahead.deliveries, ahead.fresh_of, ahead.issued
        return True

    def _prime_all(self, stats: GraphStats, at_inputs: bool) -> HostOp:
        """The graph's first deliveries on every active ring (once per graph; ``o <= N``, ``o <= N - 1`` when
        late-first): at graph start, or, with ``inputs_first``, behind the first GPU split's small inputs and launch."""
        if at_inputs != self.schedule.inputs_first:
            return
        for plan in self._plans.values():
            if plan.active and not plan.primed:
                plan.primed = True
                yield from self._prefetch(plan, stats, -1 if self.schedule.late_first else 0)

    def _cpu_split_or_defer(self, split: Split, graph: DecodeGraph, stats: GraphStats) -> HostOp:
        """A CPU split, or, when the next split's delivery takes its rows on the device, its copy down with the run
        deferred until that split is launched."""
        nxt = graph.splits[split.index + 1] if split.index + 1 < len(graph.splits) else split
        plan = self._plans.get(nxt.device)
        if plan is not None and plan.active and nxt.index - 2 in plan.fresh_of:
            yield from self._rows_down_async(split, nxt.device, stats)
        else:
            yield from self._cpu_split(split, stats)

    def _bind_fresh(self, plan: Any, d: Delivery, pieces: dict[str, Binding], accesses: list[Access]) -> None:
        """The producing split writes delivery ``d``'s fresh rows into its slot: ``fresh:<input>`` bindings (the
        windows, for the program) and one write access per row (for the checker)."""
        if not self.policy.fresh_store:
            return
        split, target = plan.order[d.o], plan.target
        for inp, (whole, _) in zip(split.staged, d.parts, strict=True):
            _, off, n = whole[0]  # the input's whole window in the slot
            pieces[fresh(inp.name)] = (target, off, n)
        accesses += [Access(target, off, n, True) for off, n in d.fresh]

    def _rows_down_async(self, split: Split, device: int, stats: GraphStats) -> HostOp:
        """The CPU split's copy down, enqueued behind the producing split (not waited on); its run deferred."""
        ev = self._rows_down.get(device)
        if ev is None:
            ev = self._rows_down[device] = self.be.create_event(device, f"rows_down{device}")
        n = sum(inp.nbytes for inp in split.ordered)  # the rows of every input, contiguous in io from 0
        yield from self.be.copy(self.consumer[device], self.io_host, self.io_dev[device], (CopyRange(0, 0, n),), tag=f"rows_{split.name}")
        stats.ordered_bytes += n
        stats.ordered_copies += 1
        yield from self.be.record(ev, self.consumer[device])
        self._deferred.append((split, ev))

    def _run_deferred(self, stats: GraphStats) -> HostOp:
        """Run the CPU splits whose rows' copy down was enqueued: wait for each copy (host blocks), then the split."""
        while self._deferred:
            split, ev = self._deferred.pop(0)
            if self.policy.rows_wait:
                t = self.be.now_s()
                yield from self.be.wait_host(ev)
                stats.consumer_wait_s += self.be.now_s() - t
            yield from self.be.run_host(self._cpu_work(split))
