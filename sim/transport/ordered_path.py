"""The host's blocking side of the transport scheduler: ordered copies, CPU splits, inputs, resident cache.

Everything here either blocks the host (a blocking copy is a copy and a
synchronize; a CPU split waits for the split that produced its rows) or
writes host memory before a copy reads it. ``sim.transport.scheduler.TransportScheduler``
inherits it; the pipelined path, which never blocks the host, lives there.
Units: seconds and bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.base import Access, Backend, Buffer, CopyRange, HostOp, Stream, Work, WorkKind
from sim.bindings import RESIDENT_CACHE, Binding, cache_rows, host_input, window
from sim.bindings import small as small_key
from sim.graph import DecodeGraph, Split, StagedInput
from sim.transport.config import GraphStats
from sim.transport.deliveries import SpanFn, WindowEntry, ordered_copy, window_parts
from sim.transport.ring import Ring


class OrderedPath:
    """The scheduler's blocking operations (a mixin: the state is ``TransportScheduler``'s)."""

    be: Backend
    program: Any
    host_cache: Buffer
    io_host: Buffer
    io_dev: dict[int, Buffer]
    graph_mem: dict[int, Buffer]
    resident: dict[int, Buffer]
    rings: dict[int, Ring]
    consumer: list[Stream]
    span: list[SpanFn]
    kernel_io_bytes: int
    _inputs: dict[str, Any]
    _producers: set[int]
    _last_gpu_device: int
    _ahead: dict[int, Any]
    _rows_done: set[int]

    def _boundary_wait(self, stats: GraphStats) -> HostOp:
        """After a graph that delivered, wait for its rings' streams (its last deliveries may still be in flight)."""
        for ring in self.rings.values():
            if ring.delivered_last_graph:
                t = self.be.now_s()
                if ring.device not in self._ahead:  # a delivery issued ahead for this graph stays in flight
                    yield from self.be.synchronize(ring.transfer)
                yield from self.be.synchronize(self.consumer[ring.device])
                stats.boundary_wait_s += self.be.now_s() - t

    def _host_writes(self, graph: DecodeGraph, stats: GraphStats) -> HostOp:
        """The graph-start host writes (reused cells); a resident cache takes the same rows, as llama.cpp rewrites its cells."""
        run = self.program.host_update_run(graph) if self.program else None
        accesses = tuple(Access(self.host_cache, o, n, True) for o, n in graph.host_writes_at_start)
        yield from self.be.run_host(Work("host_cache_update", 0.0, 0, run, accesses))
        for dev, cache in self.resident.items():  # a device keeping a prefix (--kv-gpu-layers) takes the rows inside it
            ranges = [CopyRange(o, o, min(n, cache.nbytes - o)) for o, n in graph.host_writes_at_start if o < cache.nbytes]
            if ranges:
                yield from self._blocking_copy(self.consumer[dev], cache, self.host_cache, ranges, stats, "resident_update")

    def _set_input(self, name: str, offset: int, nbytes: int) -> None:
        """Write the program's bytes of input ``name`` (if any) into the host io buffer, before its copy. Host memory only."""
        data = self._inputs.get(name)
        if data is None or self.io_host.array is None:
            return
        if len(data) > nbytes:
            raise ValueError(f"graph input {name}: the program wrote {len(data)} B into a {nbytes} B input")
        self.io_host.array[offset : offset + len(data)] = data

    # ordered pieces --------------------------------------------------

    def _wait_consumer(self, device: int, stats: GraphStats) -> HostOp:
        t = self.be.now_s()
        yield from self.be.synchronize(self.consumer[device])
        stats.consumer_wait_s += self.be.now_s() - t

    def _blocking_copy(self, stream: Stream, dst: Buffer, src: Buffer, ranges: Sequence[CopyRange], stats: GraphStats,
                       tag: str) -> HostOp:
        t = self.be.now_s()
        yield from self.be.copy(stream, dst, src, ranges, tag=tag)
        yield from self.be.synchronize(stream)
        self._count_blocking(stats, t, ranges[0].nbytes if len(ranges) == 1 else sum(r.nbytes for r in ranges))

    def _count_blocking(self, stats: GraphStats, since_s: float, nbytes: int) -> None:
        """One blocking copy of ``nbytes`` that began at ``since_s``, in the graph's stats."""
        stats.blocked_ordered_s += self.be.now_s() - since_s
        stats.ordered_bytes += nbytes
        stats.ordered_copies += 1

    def _cpu_split(self, split: Split, stats: GraphStats) -> HostOp:
        producers = sorted(self._producers) or [self._last_gpu_device]
        for dev in producers:
            yield from self._wait_consumer(dev, stats)
        self._producers.clear()
        io, stream = self.io_dev[producers[0]], self.consumer[producers[0]]
        io_host = self.io_host
        off = 0
        be = self.be
        for inp in split.ordered:
            n = inp.nbytes
            t = be.now_s()  # a blocking copy (``_blocking_copy``, inline: the CPU split makes two a layer)
            yield from be.copy(stream, io_host, io, (CopyRange(off, off, n),), tag=inp.name)
            yield from be.synchronize(stream)
            self._count_blocking(stats, t, n)
            off += n
        yield from self.be.run_host(self._cpu_work(split))

    def _cpu_work(self, split: Split) -> Work:
        """The CPU split's work: each input read from the host io buffer (inputs back to back from 0), its rows
        written into the host cache. Does not block."""
        io_host, cache = self.io_host, self.host_cache
        bindings: dict[str, Binding] = {}
        accesses: list[Access] = []
        off = 0
        bind_rows = self.program is not None  # the rows' own names are for the program; the checker reads accesses
        for inp in split.ordered:
            n = inp.nbytes
            bindings[host_input(inp.name)] = (io_host, off, n)
            accesses.append(Access(io_host, off, n, False))
            for row_off, row_bytes, count, pitch in inp.row_pattern:
                accesses.append(Access(cache, row_off, row_bytes, True, count, pitch))
            if bind_rows:
                rows = inp.rows
                for t, (row_off, row_bytes) in enumerate(rows):
                    bindings[cache_rows(inp.name, None if len(rows) == 1 else t)] = (cache, row_off, row_bytes)
            off += n
        run = self.program.cpu_run(split, bindings) if self.program else None
        self._rows_done.update(split.layers)  # the host runs it next: these layers' rows are final after it
        return Work(split.name, split.compute_s, 0, run, tuple(accesses), WorkKind.CPU_SPLIT)

    def _small_inputs(self, split: Split, stats: GraphStats, bindings: dict[str, Binding]) -> HostOp:
        """The split's small ordered inputs (an activation from another device first, through the host)."""
        dev, io = split.device, self.io_dev[split.device]
        off = self.kernel_io_bytes  # small inputs live above the region a split's kernels write
        for small in split.ordered:
            if small.src_device >= 0:
                src_dev = small.src_device
                yield from self._wait_consumer(src_dev, stats)
                yield from self._blocking_copy(self.consumer[src_dev], self.io_host, self.io_dev[src_dev],
                                               [CopyRange(0, off, small.nbytes)], stats, small.name)
        yield from self._wait_consumer(dev, stats)
        for small in split.ordered:
            self._set_input(small.name, off, small.nbytes)
            yield from self._blocking_copy(self.consumer[dev], io, self.io_host, [CopyRange(off, off, small.nbytes)], stats, small.name)
            bindings[small_key(small.name)] = (io, off, small.nbytes)
            off += small.nbytes

    def _ordered_windows(self, split: Split, stats: GraphStats, bindings: dict[str, Binding], pieces: dict[str, Binding]) -> HostOp:
        """The ordered path: each staged input copied into the graph's memory with a blocking copy."""
        dev = split.device
        yield from self._wait_consumer(dev, stats)
        gm, span, off = self.graph_mem[dev], self.span[dev], 0
        for inp in split.staged:
            self._bind_parts(bindings, pieces, gm, window_parts(inp, off, span))
            ranges, spanned = ordered_copy(inp, off, span)
            off += spanned
            yield from self._blocking_copy(self.consumer[dev], gm, self.host_cache, ranges, stats, inp.name)

    def _make_resident(self, devices: list[int], stats: GraphStats, nbytes: int = 0, start: int = 0) -> HostOp:
        """The cache's bytes ``start`` .. ``start + nbytes`` (0: to its end; the resident arm past the -ngl CPU layers'
        blocks, or the --kv-gpu-layers prefix) on each device, allocated and copied once (the first graph's ordered
        bytes); ``self.resident_base`` remembers ``start``. Blocks for the copy."""
        nbytes = nbytes or self.host_cache.nbytes - start
        self.resident_base = start
        for dev in devices:
            if dev not in self.resident:
                self.resident[dev] = self.be.alloc(dev, nbytes, f"resident{dev}")
                whole = [CopyRange(start, 0, nbytes)]
                yield from self._blocking_copy(self.consumer[dev], self.resident[dev], self.host_cache, whole, stats, "resident")

    @classmethod
    def _bind_device_kv(cls, bindings: dict[str, Binding], pieces: dict[str, Binding], inputs: Sequence[StagedInput],
                        cache: Buffer, base: int = 0) -> None:
        """Bind ``inputs`` where the device's copy of the cache (the resident arm's, or the --kv-gpu-layers prefix)
        holds them (host-cache offsets less ``base``, where the copy starts), and the copy itself as
        ``resident:cache``: the split's kernels write their new rows there."""
        for inp in inputs:
            cls._bind_resident(bindings, pieces, inp, cache, base)
        bindings[RESIDENT_CACHE] = (cache, 0, cache.nbytes)

    @staticmethod
    def _bind_resident(bindings: dict[str, Binding], pieces: dict[str, Binding], inp: StagedInput, cache: Buffer,
                       base: int = 0) -> None:
        """Bind ``inp`` where the resident cache holds it: at its host-cache offsets less ``base`` (one range per stream)."""
        first = inp.pieces[0]
        if len(inp.pieces) == 1:
            bindings[window(inp.name)] = (cache, first.src_offset - base, first.nbytes)
            return
        for i, p in enumerate(inp.pieces):
            pieces[window(inp.name, i)] = (cache, p.src_offset - base, p.nbytes)
        last = inp.pieces[-1]
        bindings[window(inp.name)] = (cache, first.src_offset - base, last.src_offset + last.nbytes - first.src_offset)

    # pipelined pieces ------------------------------------------------

    def _bind_parts(self, bindings: dict[str, Binding], pieces: dict[str, Binding], buf: Buffer,
                    parts: tuple[tuple[WindowEntry, ...], tuple[WindowEntry, ...]]) -> None:
        """A window's bindings from ``sim.transport.deliveries.window_parts``: the whole window (the split's accesses) and, for the
        program only, its per-stream parts."""
        for name, off, n in parts[0]:
            bindings[name] = (buf, off, n)
        if self.program is not None:
            for name, off, n in parts[1]:
                pieces[name] = (buf, off, n)

