"""What a plan asks and how its points are answered: the evaluator's figures as arrays where it can, the simulator's
rows elsewhere, and one sample check at the plan's end.

A :class:`PlanRequest` names one model on one machine over contexts; a plan of it asks for up to millions of points
(contexts x depths x budgets, then each context's candidates under the memory cap). A :class:`Runner` answers them:
the points inside the compiled evaluator's envelope (``sim.evaluator.in_envelope``) as arrays of the figures the
plan reads (:class:`Figures`, from ``sim.evaluator.summarize``: no row is made for them), the others -- and every
point under ``--exact`` -- by the simulator, in a sweep's chunks (``kvpipe.sweep_work``). The evaluated points are held to the
simulator once, at the plan's end (:meth:`Runner.check`): at least ``check_n`` of them drawn with a fixed seed, plus
every point where, along the contexts asked, the best depth at a budget or a point's decline changes; only those
points get rows, which are compared with the simulator's (its default path, ``kvpipe simulate``'s; exact where the two
differ: ``sim.evaluator.check_sample``).

Units: the figures' own (t/s, MiB, ms, rows).
"""

from __future__ import annotations

import bisect
import contextlib
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvpipe.plan_figures import Figures, boundaries, same_as_rows
from sim.errors import InputError
from sim.model_files import with_weights_type
from sim.points import MAX_POINTS, GridSpec, PointGrid, point_grid
from sim.run.point import Point
from sim.transport.config import MAX_BUDGET_MIB, MAX_DEPTH, TransportConfig
from sim.workload import ALL_LAYERS, layers_of_ngl

DEFAULT_BUDGET_MIB = TransportConfig().budget_mib
CHECK_N = 32  # the evaluator's points the plan re-simulates at its end, at least
PARALLEL_POINTS = 20_000  # the fewest points per worker worth evaluating in a process of its own (pickling them: ~6 us each)
PARALLEL_LINES = 1_000  # or the fewest lines (each builds its own graphs and numbers: ~1-3 ms a line)
PIECES_PER_WORKER = 4  # contiguous pieces per worker, taken in turn (the dear lines -- small contexts -- bunch together)
AHEAD_PIECES = 3  # the check's boundary simulations: about 2 x this many pieces per worker (a pool holds 3 started)


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: one model/hardware/cache type over contexts (grid-flag syntax for the specs)."""

    model: str = "qwen3.8-27b"
    hardware: str = "rtx4070-gen4x16"
    cache_type: str = "q8_0"
    contexts: tuple[int, ...] = (4096, 16384, 32768)
    max_depth: int = 4
    tokens: int = 4
    default_budget_mib: float = DEFAULT_BUDGET_MIB
    budget_for_gain: float | None = None
    budgets_mib: tuple[float, ...] = ()  # also: per context, the best depth and its gain at each of these budgets
    pinned: bool = True
    jobs: int | None = None
    llama_cpp: bool = False  # kept for old command lines: the flags are always part of the memory plan now
    exact: bool = False  # simulate every point and every token (default: the evaluator, else distinct simulations)
    vram_gib: float | None = None  # the device memory to fit (default: the card's)
    host_mem_gib: float | None = None  # the host memory to fit (default: this machine's)
    build: str = "fork"  # the llama.cpp build to plan for: "fork" (the pipelining pull requests) or "upstream"
    min_tps: float | None = None  # also: the largest context at or above this t/s
    n_gpu_layers: int = ALL_LAYERS  # llama.cpp's -ngl (default: every layer; lowered by the plan if the weights do not fit)
    weights_type: str = ""  # the weights' type or bits per weight, for a model file that does not say (a config.json)
    check_n: int = CHECK_N  # the evaluator's points re-simulated at the plan's end, at least (0: none)

    def __post_init__(self) -> None:
        if not self.contexts:
            raise InputError("--context: need at least one value")
        if not 1 <= self.max_depth <= MAX_DEPTH:
            raise InputError(f"--max-depth {self.max_depth} out of range; allowed: 1..{MAX_DEPTH}")
        if self.budget_for_gain is not None and not 0 < self.budget_for_gain <= 1:
            raise InputError(f"--budget-for-gain {self.budget_for_gain:g} out of range; allowed: a fraction in (0, 1]")
        for b in self.budgets_mib:
            if not 0 <= b <= MAX_BUDGET_MIB:
                raise InputError(f"--budget {b:g} out of range; allowed: 0 (no cap) .. {MAX_BUDGET_MIB}")
        n = len(self.contexts) * (self.max_depth + 1) * (1 + len(self.budgets_mib))
        if n > MAX_POINTS:
            raise InputError(f"the plan has {n:,} points (contexts x depths x budgets); allowed: at most {MAX_POINTS:,}")
        if self.check_n < 0:
            raise InputError(f"--check {self.check_n} out of range; allowed: >= 0 (0 = no check)")
        if self.build not in ("fork", "upstream"):
            raise InputError(f"--build {self.build!r} unknown; allowed: fork (GenerelSchwerz/llama.cpp), upstream")
        if self.min_tps is not None and not (math.isfinite(self.min_tps) and self.min_tps > 0):
            raise InputError(f"--min-tps {self.min_tps:g} out of range; allowed: a number of tokens/s > 0")
        if self.n_gpu_layers < 1:
            raise InputError(f"-ngl {self.n_gpu_layers} out of range; allowed: a whole number >= 1 (llama.cpp's -ngl; 99: "
                             "every layer)")


def points(req: PlanRequest, contexts: Sequence[int], depths: Sequence[int], budgets_mib: float | Sequence[float],
           tokens: int | None = None) -> list[Point]:
    """The plan's points, through the library's grid (same validation, same messages), in the grid's order: contexts x
    depths x budgets (the points of a context share their workload object). Raises InputError."""
    return grid(req, contexts, depths, budgets_mib, tokens).points()


def grid(req: PlanRequest, contexts: Sequence[int], depths: Sequence[int], budgets_mib: float | Sequence[float],
         tokens: int | None = None) -> PointGrid:
    """:func:`points` as a ``sim.points.PointGrid`` (their objects and indices as arrays: no ``Point`` made until one
    is asked for). Raises InputError."""
    budgets = tuple(budgets_mib) if isinstance(budgets_mib, Sequence) else (budgets_mib,)
    spec = GridSpec(models=(req.model,), hardware=(req.hardware,), cache_types=(req.cache_type,),
                    contexts=tuple((c,) for c in contexts), depths=tuple(depths), budgets_mib=budgets,
                    tokens=tokens or req.tokens, pinned=req.pinned)
    pts = point_grid(spec)
    if req.weights_type or req.n_gpu_layers != ALL_LAYERS:
        try:
            model = with_weights_type(pts[0].workload.model, req.weights_type) if req.weights_type else pts[0].workload.model
        except ValueError as exc:
            raise InputError(str(exc)) from None
        try:  # the flag is llama.cpp's -ngl, which counts the output layer
            gpu_layers = layers_of_ngl(req.n_gpu_layers, model.n_layers) if req.n_gpu_layers != ALL_LAYERS else ALL_LAYERS
        except ValueError as exc:
            raise InputError(str(exc)) from None
        pts = pts.with_workloads(lambda wl: replace(wl, model=model, n_gpu_layers=gpu_layers))
    return pts


class Runner:
    """Answers a plan's points (:meth:`run`, :meth:`rows`) and keeps what the evaluator answered for the one sample
    check at the end (:meth:`check`)."""

    def __init__(self, req: PlanRequest) -> None:
        self.req = req
        self.evaluated: list[tuple[Sequence[Point], Figures]] = []  # each run's points and figures
        self.grids: list[int] = []  # the runs that are grids along contexts (their boundaries are checked)
        self.marked: set[int] = set()  # ids of points the check re-simulates whatever the draw (see ``mark``)
        self.checked = 0  # the points the sample check re-simulated (the simulator's default path)
        self.checked_exact = 0  # of those, the points simulated again exact (the default path's row differed by > 1e-9)
        self._inside: dict[Any, bool] = {}
        self._stack: contextlib.ExitStack | None = None  # entered (``with``): one pool of workers for the whole plan
        self._pool: Any = None
        self._bounds: dict[int, set[int]] = {}  # each grid run's boundaries, found once it was answered
        self._ahead: Any = None  # their simulations, submitted then (``kvpipe.sweep_work.Ahead``)
        self._rows_ahead: list[tuple[list[Point], Any]] = []  # and their evaluated rows (futures)

    def __enter__(self) -> Runner:
        self._stack = contextlib.ExitStack()
        return self

    def __exit__(self, *exc: Any) -> None:  # an error or Ctrl-C ends the workers at once (``executor_for``)
        stack, self._stack, self._pool = self._stack, None, None
        if stack is not None:
            stack.__exit__(*exc)

    def _workers(self) -> Any:
        """A context giving the ``--jobs`` executor: the runner's one pool while it is entered, else a pool of its own."""
        from kvpipe.executors import executor_for

        if self._stack is None:
            return executor_for(self.req.jobs)
        if self._pool is None:
            self._pool = self._stack.enter_context(executor_for(self.req.jobs))
        return contextlib.nullcontext(self._pool)

    def _in_envelope(self, p: Point) -> bool:  # not by depth and budget; ids of objects the runner's points keep alive
        from sim.evaluator import in_envelope
        from sim.replay import config_but_depth_budget

        key = (id(p.workload), id(p.hardware), config_but_depth_budget(p.transport))
        if key not in self._inside:
            self._inside[key] = in_envelope(p) is None
        return self._inside[key]

    def run(self, pts: Sequence[Point], grid: bool = False) -> Figures:
        """Every point's figures: evaluated where the envelope allows (unless ``--exact``), else simulated; the
        simulations and, when worth it (``_pieces``), the evaluation's pieces share the ``--jobs`` workers. ``grid``: the
        points are a grid along contexts, whose boundaries (where the best depth or a decline changes) the check
        re-simulates. Blocks for the evaluation and the simulations."""
        return self.start(pts, grid)()

    def start(self, pts: Sequence[Point], grid: bool = False) -> Callable[[], Figures]:
        """:meth:`run` begun: on the runner's pool (entered, the work worth it) the work is submitted now and the
        function returned collects it (blocking); else it is done now. Either way the run joins the check's record
        (in the order the functions are called: the sample drawn is the same whatever ``--jobs``) when it is called."""
        from kvpipe.executors import PackedPoints, _Serial, summarize_packed
        from kvpipe.sweep_work import chunk_rows
        from sim.evaluator import Summary, summarize

        packed = PackedPoints(pts)  # each distinct object's index: the envelope's groups, the workers' pieces
        inside = np.zeros(len(pts), dtype=bool) if self.req.exact else self._inside_of(pts, packed)
        idx, rest = np.flatnonzero(inside), np.flatnonzero(~inside)
        others = [pts[i] for i in rest.tolist()]
        mine: Sequence[Point] = [pts[i] for i in idx.tolist()] if not isinstance(pts, PointGrid) else pts if not others \
            else pts.take(idx)  # a grid's points stay arrays: made only where asked for (the check's, a plan's reads)
        cuts = self._pieces(mine)
        parallel = (self.req.jobs or os.cpu_count() or 1) > 1 and (len(cuts) > 1 or bool(others))
        source = packed if not others else PackedPoints(mine) if isinstance(mine, PointGrid) else None
        with self._workers() if parallel else contextlib.nullcontext(_Serial()) as ex:
            held = self._hold() if parallel and mine else []  # this run before the check's work not started
            sims = self._submit(ex, others)
            futures = [ex.submit(summarize_packed, source.take(a, b)) if isinstance(mine, PointGrid) and source is not None
                       else ex.submit(summarize, mine[a:b]) if isinstance(ex, _Serial)
                       else ex.submit(summarize_packed, packed.take(a, b) if not others else PackedPoints(mine[a:b])) for a, b in cuts]
            if held:
                self._resume(ex, held)

            def collect() -> list[tuple[np.ndarray, Figures]]:
                parts = []
                if mine:
                    s = Summary.concat([f.result() for f in futures])
                    parts.append((idx, Figures(s.tokens_per_s, s.declined, s.ring_mib, s.ring_alloc_mib, s.window_rows,
                                               s.late_mib, s.blocked_ms, s.fits & (s.tokens_per_s > 0), np.ones(len(mine), dtype=bool))))
                if others:
                    parts.append((rest, Figures.of_rows(chunk_rows(others, sims))))
                return parts

            def record(parts: list[tuple[np.ndarray, Figures]]) -> Figures:
                if mine:
                    if grid:
                        self.grids.append(len(self.evaluated))
                        known = packed.parts if not others else getattr(mine, "parts", None)  # the points' objects numbered
                        self._check_ahead(len(self.evaluated), mine, parts[0][1], known)
                    self.evaluated.append((mine, parts[0][1]))
                return Figures.merge(len(pts), parts)

            done = collect() if not parallel or self._stack is None else None  # else collected when asked
        return lambda: record(done if done is not None else collect())

    def known(self, pts: Sequence[Point], figs: Figures) -> Figures:
        """A run whose figures are known already (``figs``: the same points as an earlier run of this runner answered
        them, the evaluator's wherever ``figs.evaluated``): joins the check's record as :meth:`run` would have, and gives
        ``figs`` back. Does not block."""
        idx = np.flatnonzero(figs.evaluated)
        if idx.size:
            self.evaluated.append(([pts[i] for i in idx.tolist()], figs.take(idx)))
        return figs

    def _inside_of(self, pts: Sequence[Point], packed: Any) -> np.ndarray:
        """Whether the evaluator answers each point (``_in_envelope``, asked once per workload at any context, machine
        and config but depth and budget -- all ``sim.evaluator.in_envelope`` reads: ``packed``, the
        ``kvpipe.executors.PackedPoints`` of ``pts``, numbers their objects)."""
        from sim.replay import config_class
        from sim.replay_keys import free_number

        (ws, w), (hs, h), (cs, c) = packed.parts
        cls = np.array([config_class(x) for x in cs], dtype=np.int64)[c]
        free = np.array([free_number(x, False) for x in ws], dtype=np.int64)[w]  # (several sequences: the workload's own)
        _, first, group = np.unique((free * len(hs) + h) * (int(cls.max(initial=0)) + 1) + cls,
                                    return_index=True, return_inverse=True)
        return np.array([self._in_envelope(pts[i]) for i in first.tolist()], dtype=bool)[group.reshape(-1)]

    def _pieces(self, pts: Sequence[Point]) -> list[tuple[int, int]]:
        """``pts`` in contiguous pieces (first and past-last index) when worth more than one ``--jobs`` worker (at least
        ``PARALLEL_POINTS`` points or ``PARALLEL_LINES`` lines a piece): ``PIECES_PER_WORKER`` per worker, taken in turn."""
        if not pts:
            return []
        lines = len(np.unique(pts.parts[0][1])) if isinstance(pts, PointGrid) else len({id(p.workload) for p in pts})
        worth = max(len(pts) // PARALLEL_POINTS, lines // PARALLEL_LINES)
        n = min(self.req.jobs or os.cpu_count() or 1, max(1, worth)) * PIECES_PER_WORKER  # the workers', each's pieces
        n = min(n, worth) if n > PIECES_PER_WORKER else 1
        cuts = [len(pts) * k // n for k in range(n + 1)]
        return list(zip(cuts, cuts[1:], strict=False))

    def _submit(self, ex: Any, pts: list[Point]) -> list[tuple[Any, Any]]:
        """The simulations of ``pts`` submitted to ``ex`` in chunks of whole partitions (``kvpipe.sweep_work.chunks``, the
        fast path unless ``--exact``): (chunk, future) each. Does not block (but for this process's executor)."""
        from kvpipe.sweep_work import chunks, run_chunk

        if not pts:
            return []
        work = chunks(pts, self.req.jobs or os.cpu_count() or 1, exact=self.req.exact, evaluator=False)
        return [(c, ex.submit(run_chunk, c)) for c in work]

    def _check_ahead(self, k: int, pts: Sequence[Point], figs: Figures, parts: Any) -> None:
        """Grid run ``k``'s boundaries (the check re-simulates them whatever it draws), found now; with the runner's pool
        (entered, ``--jobs`` > 1) their simulations and evaluated rows submitted, made while the plan goes on. Does not block."""
        from kvpipe.sweep_work import Ahead

        self._bounds[k] = boundaries(pts, figs, parts)
        workers = self.req.jobs or os.cpu_count() or 1
        if self._stack is None or workers < 2 or not self.req.check_n:
            return
        self._ahead = self._ahead or Ahead()
        mine = [pts[i] for i in sorted(self._bounds[k]) if figs.fits[i]]
        with self._workers() as ex:
            self._ahead.submit(ex, mine, AHEAD_PIECES * workers)  # small pieces: a later run may go before most of them
            self._rows_ahead.append((mine, ex.submit(_evaluated_rows, mine)))

    def _hold(self) -> list[Any]:
        """Cancel the check's work submitted ahead (:meth:`_check_ahead`) that has not started; what to resume."""
        if self._ahead is None:
            return []
        rows = [k for k, (_, f) in enumerate(self._rows_ahead) if f.cancel()]
        return [self._ahead.hold(), rows]

    def _resume(self, ex: Any, held: list[Any]) -> None:
        """Submit again what :meth:`_hold` cancelled, in its order."""
        sims, rows = held
        self._ahead.resume(ex, sims)
        for k in rows:
            mine = self._rows_ahead[k][0]
            self._rows_ahead[k] = (mine, ex.submit(_evaluated_rows, mine))

    def _evaluated_rows(self, pts: list[Point]) -> list[dict[str, Any] | None]:
        """:func:`_evaluated_rows` of ``pts``: those made ahead (:meth:`_check_ahead`) taken, the rest made here. Blocks."""
        known = {id(p): (p, r) for ps, f in self._rows_ahead for p, r in zip(ps, f.result(), strict=True)}
        got = [known.get(id(p), (None, None)) for p in pts]
        rest = [p for p, (q, _) in zip(pts, got, strict=True) if q is not p]
        made = iter(_evaluated_rows(rest))
        return [r if q is p else next(made) for p, (q, r) in zip(pts, got, strict=True)]

    def _simulated(self, pts: list[Point]) -> list[dict[str, Any] | None]:
        """The simulator's rows of ``pts`` in order (None where a point failed: it does not fit). Blocks."""
        from kvpipe.sweep_work import chunk_rows

        with self._workers() if pts else contextlib.nullcontext() as ex:
            return chunk_rows(pts, self._submit(ex, pts))

    def rows(self, pts: Sequence[Point]) -> list[dict[str, Any] | None]:
        """Whole rows of a few points (the evaluator's where it answers them, kept for the check; else simulated);
        None where a point does not fit the device. Blocks."""
        inside = [not self.req.exact and self._in_envelope(p) for p in pts]
        mine = [p for p, ok in zip(pts, inside, strict=True) if ok]
        got = iter(_evaluated_rows(mine))
        sims = iter(self._simulated([p for p, ok in zip(pts, inside, strict=True) if not ok]))
        out = [next(got) if ok else next(sims) for ok in inside]
        kept = [(p, r) for p, r, ok in zip(pts, out, inside, strict=True) if ok and r is not None]
        if kept:
            figs = Figures.of_rows([r for _, r in kept])
            self.evaluated.append(([p for p, _ in kept], replace(figs, evaluated=np.ones(len(kept), dtype=bool))))
        return out

    def mark(self, pts: Sequence[Point]) -> None:
        """Points (already run) the check re-simulates whatever it draws: where the plan's answer changes."""
        self.marked |= {id(p) for p in pts}

    def check(self, n: int, meanwhile: Callable[[], None] | None = None) -> tuple[int, float]:
        """(the evaluator's points in the plan, the largest relative disagreement of the sample re-simulated on the
        simulator's default path, exact where the two differ):
        at least ``n`` of them drawn with a fixed seed (and at least ``ARM_N`` of each arm, ``sim.evaluator.check.draw``:
        the resident arm's points are the evaluator's too) plus every boundary (:func:`boundaries`). Raises
        EvaluatorDisagreement above 1e-9. ``meanwhile``: called (if the check runs) once the sample's rows are made,
        while its simulations run on the workers (a plan's text is made then). Blocks for the simulations (``--jobs``
        workers)."""
        from kvpipe.sweep_work import check_rows
        from sim.evaluator.check import draw

        total = sum(len(p) for p, _ in self.evaluated)
        if not total or not n:
            return total, 0.0
        starts = _starts(self.evaluated)
        figs = Figures.merge(total, [(np.arange(lo, lo + len(ps)), f) for lo, (ps, f) in zip(starts, self.evaluated, strict=True)])
        arms = np.concatenate([ps.field(2, lambda c: c.arm, object) if isinstance(ps, PointGrid)  # a grid's: per config
                               else np.array([p.transport.arm for p in ps], dtype=object) for ps, _ in self.evaluated])
        chosen = draw(arms.tolist(), n, seed=0)  # and at least ARM_N of each arm the evaluator answered
        for k, (lo, (ps, _)) in enumerate(zip(starts, self.evaluated, strict=True)):
            if k in self.grids:
                bounds = self._bounds.get(k)
                chosen |= {lo + i for i in (bounds if bounds is not None else boundaries(*self.evaluated[k]))}
            if self.marked:  # of a grid, only the points made can be marked
                chosen |= {lo + i for i, p in (ps.made().items() if isinstance(ps, PointGrid) else enumerate(ps))
                           if id(p) in self.marked}
        order = sorted(chosen)
        sample, mine = [self._point(starts, i) for i in order], figs.take(order)
        if self._ahead is not None:  # the rest of the sample's simulations start, while its rows are evaluated here
            with self._workers() as ex:
                self._ahead.submit(ex, [p for p, ok in zip(sample, mine.fits.tolist(), strict=True) if ok], self.req.jobs or 2)
        rows = self._evaluated_rows(sample)
        same_as_rows(mine, rows)
        self.checked = sum(r is not None for r in rows)  # a chosen point that does not fit has no row to compare
        if meanwhile is not None:
            meanwhile()
        worst, self.checked_exact = check_rows(sample, rows, self.req.jobs, self._workers, self._ahead)
        return total, worst


    def _point(self, starts: list[int], i: int) -> Point:
        """The ``i``-th point the runner evaluated (``starts``: each run's first index, :func:`_starts`)."""
        k = bisect.bisect_right(starts, i) - 1
        return self.evaluated[k][0][i - starts[k]]


def _starts(runs: list[tuple[Sequence[Point], Figures]]) -> list[int]:
    return np.cumsum([0] + [len(ps) for ps, _ in runs])[:-1].tolist()


def _evaluated_rows(pts: Sequence[Point]) -> list[dict[str, Any] | None]:
    """The evaluator's rows of ``pts`` (None where a point does not fit)."""
    from sim.evaluator.evaluate import evaluations

    return [ev.row(i) if ev.plans.fits[i] else None for _, ev in evaluations(pts) for i in range(len(ev.points))]
