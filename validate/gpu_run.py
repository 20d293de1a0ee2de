"""Running the decode workload through the scheduler on a backend, and measuring it.

One *group* is (model, cache type, context): one host KV cache, filled once,
and one program whose weights are made once per model. Its *arms* are the
(depth, budget) pairs of the grid; each repetition runs every arm once in the
same order (A/B/A/B...), so a drift of the machine spreads over all arms
instead of biasing one. Each run is ``sim.run.decode.run_decode`` -- the very
host loop the simulation runs -- driven on the backend; its first
``warmup`` graphs (ring allocation, first-use kernel compilation) are left out
of the timing but not out of the exactness hashes.

The program is ``sim.program.gpu_program``: ``sim.program.DecodeProgram`` at
the model's full hidden / FFN / vocabulary sizes (or ``scale`` of them), its
q8_0 weights drawn on the device and its host cache filled there, once per
group; every run after the first only resets the program's state. On CuPy it
runs the CUDA executor (one graph launch per split); with NumPy (the tests, on
the SimPy machine) the reference executor.

Units: seconds and bytes.
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from backends.base import Backend, Buffer, Span
from backends.profile import HardwareProfile
from sim.program import DecodeProgram
from sim.run.decode import run_decode
from sim.run.point import Point, RunResult
from sim.transport.scheduler import GraphStats, TransportConfig
from sim.workload import Workload
from validate.micro import host_costs, run_on

# ---------------------------------------------------------------- runs


def arm_label(t: TransportConfig) -> str:
    """``depth=1 budget=0``, ``resident`` or ``copy-only depth=4``: an arm as the progress line and traces name it."""
    if t.arm == "resident":
        return "resident"
    head = "copy-only " if t.arm == "copy-only" else ""
    return (f"{head}depth={t.depth} budget={t.budget_mib:g}" + (f" mutate={','.join(sorted(t.mutations))}" if t.mutations else "")
            + (f" schedule={t.schedule.name}" if t.schedule.active else ""))


def trim_pool(xp: Any) -> None:
    """Hand the array module's cached pool blocks back to the device (CuPy; NumPy has none). Does not block.

    The ring's headroom check reads the device's free memory, which does not
    count blocks CuPy's pool keeps cached: on the H200, after the 65,536
    groups those left 447 MiB free and a 54 MiB ring was declined.
    """
    get = getattr(xp, "get_default_memory_pool", None)
    if get is not None:
        get().free_all_blocks()



@dataclass
class Run:
    """One run of one arm (its whole TransportConfig): per-graph stats (warm-up dropped), output hashes, timeline."""

    transport: TransportConfig
    rep: int
    stats: list[GraphStats]
    step_hashes: list[str]
    tokens: list[int]
    spans: list[Span] = field(default_factory=list)
    sequences: int = 1
    host_probe_launch_s: float = 0.0  # the host's launch cost measured right before this repetition (0: not probed)

    @property
    def depth(self) -> int:
        return self.transport.depth

    @property
    def budget_mib(self) -> float:
        return self.transport.budget_mib

    @property
    def arm(self) -> str:
        return self.transport.arm

    @property
    def token_s(self) -> float:
        """Mean seconds per graph."""
        return statistics.fmean(s.total_s for s in self.stats)

    @property
    def tokens_per_s(self) -> float:
        """Tokens of all sequences per second (every graph decodes one token of each), as the simulation's rows count them."""
        s_per_graph = statistics.fmean(s.total_s for s in self.stats)
        return self.sequences / s_per_graph if s_per_graph > 0 else 0.0


@dataclass
class GroupResult:
    """Every run of one (model, cache type, context) group."""

    workload: Workload
    runs: list[Run]
    warmup: int

    def arm(self, transport: TransportConfig) -> list[Run]:
        """Every repetition of one arm."""
        return [r for r in self.runs if r.transport == transport]

    def arms(self) -> list[TransportConfig]:
        """The arms, in the order they ran."""
        return list(dict.fromkeys(r.transport for r in self.runs))

    def reference(self, arm: str) -> list[Run]:
        """The repetitions of the reference arm ``resident`` or ``copy-only`` (empty if it did not run)."""
        return [r for r in self.runs if r.arm == arm]


class GroupRunner:
    """The runs of one group, a repetition at a time, so that several groups can take turns.

    ``open`` allocates and fills the host cache and runs the first arm
    ``warm_runs`` times unrecorded (the first run after the host cache was
    allocated and filled ran at up to half speed on the H200 machine: 10.8
    against 19.3 t/s). Each ``rep`` then runs every arm once, in A/B/A/B
    order, after a host probe (``probe``: the micro-measurement of
    ``validate.micro.host_costs``, the same one ``kvpipe calibrate`` takes,
    so the report can tell a slower host from a transport the model misses).
    ``close`` frees the host cache. Every method blocks for its runs.
    """

    def __init__(self, backend: Backend, workload: Workload, hardware: HardwareProfile, arms: Sequence[TransportConfig],
                 program: DecodeProgram, warmup: int = 1, keep_spans: bool = True,
                 progress: Callable[[str], None] | None = None, warm_runs: int = 1, probe: bool = False) -> None:
        self.backend, self.workload, self.hardware = backend, workload, hardware
        self.arms, self.program, self.warmup = list(arms), program, warmup
        self.keep_spans, self.progress, self.warm_runs, self.probe = keep_spans, progress, warm_runs, probe
        self.wl = replace(workload, tokens=workload.tokens + warmup)  # ``workload.tokens`` are the measured ones
        self.runs: list[Run] = []
        self.host_cache: Buffer | None = None

    def _point(self, transport: TransportConfig) -> Point:
        return Point(self.wl, self.hardware, transport)

    def open(self) -> None:
        from sim.run.point import graphs_for

        nbytes = next(iter(graphs_for(self._point(TransportConfig(depth=0))))).host_cache_bytes
        self.host_cache = self.backend.alloc_host(nbytes, "host_kv_cache", pinned=self.wl.pinned)
        for _ in range(self.warm_runs if self.arms else 0):
            run_on(self.backend, run_decode(self.backend, self._point(self.arms[0]), self.program, host_cache=self.host_cache))

    def rep(self, rep: int, last: bool = True) -> None:
        """Every arm once; ``last`` keeps the timelines (the report's trace holds the last repetition's)."""
        be, wl, program = self.backend, self.wl, self.program
        assert self.host_cache is not None, "GroupRunner.rep before open"
        probe_s = run_on(be, host_costs(be, reps=100))["launch_s"] if self.probe else 0.0
        for transport in self.arms:
            trim_pool(program.xp)  # blocks cached for another arm's or group's temporaries read as used memory to the headroom check
            be.clear_timeline()
            gc.collect()
            gc.disable()  # a collector pause inside a timed token is noise, not transport
            try:
                sched, stats = run_on(be, run_decode(be, self._point(transport), program, host_cache=self.host_cache))
            finally:
                gc.enable()
            spans = be.timeline() if self.keep_spans and last else []
            self.runs.append(Run(transport, rep, stats[self.warmup :], program.step_hashes(), program.tokens(), spans,
                                 wl.n_parallel, probe_s))
            del sched
            if self.progress:
                self.progress(f"{wl.model.name} ctx={max(wl.context)} {arm_label(transport)} rep={rep}")

    def result(self) -> GroupResult:
        """The runs so far (the group stays open)."""
        return GroupResult(self.workload, list(self.runs), self.warmup)

    def close(self) -> GroupResult:
        if self.host_cache is not None:
            self.backend.free(self.host_cache)
            self.host_cache = None
        return GroupResult(self.workload, self.runs, self.warmup)


def run_group(
    backend: Backend,
    workload: Workload,
    hardware: HardwareProfile,
    arms: Sequence[TransportConfig],
    program: DecodeProgram,
    reps: int = 3,
    warmup: int = 1,
    keep_spans: bool = True,
    progress: Callable[[str], None] | None = None,
    warm_runs: int = 1,
    probe: bool = False,
) -> GroupResult:
    """Run every arm ``reps`` times in A/B/A/B order through ``run_decode`` (:class:`GroupRunner`). Blocks for all the runs."""
    g = GroupRunner(backend, workload, hardware, arms, program, warmup, keep_spans, progress, warm_runs, probe)
    try:
        g.open()
        for rep in range(reps):
            g.rep(rep, last=rep == reps - 1)
    finally:
        result = g.close()
    return result


def result_of(group: GroupResult, run: Run, hardware: HardwareProfile) -> RunResult:
    """A RunResult (for ``sim.rows.row``) of one run: its measured graphs and timeline."""
    point = Point(group.workload, hardware, run.transport)
    rows = group.workload.window_rows(max(group.workload.context) + group.warmup)
    return RunResult(point, run.stats, run.spans, rows)
