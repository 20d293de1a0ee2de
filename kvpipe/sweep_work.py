"""A sweep's work: points in chunks of whole partitions, each chunk run in a worker, and the re-simulations the sample
checks compare with.

A chunk is points that travel together to one worker (``concurrent.futures``): whole *partitions* of a grid (the
points that differ only in depth and budget, the only ones that can share a simulation), so the worker's point planner
(``sim.run.tasks``) maps its chunk to the distinct simulations that decide it, each run once, on the fast path of
``sim.run.decode.run_steady`` unless ``exact``; or points inside the compiled evaluator's envelope, which the worker evaluates.
:func:`simulated_rows` is the simulator's answer every sample check compares the evaluator with (the default path;
:func:`exact_rows` where the two disagree). ``kvpipe.sweep`` runs chunks into a row store; a plan
(``kvpipe.plan_run``) runs them for the points outside the envelope, with no store.

Units: seconds inside; the rows carry their own units in their field names.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from sim.rows import KEY_DEFAULTS, KEY_FIELDS, Key, _norm, placement_fields, row
from sim.run import tasks
from sim.run.point import Point

SIMULATED = {"engine": "simulator"}
EVALUATED_PER_CHUNK = 512  # envelope points per evaluator chunk (its cost is mostly per point; a few per worker)


def key_of_point(p: Point) -> Key:
    """The grid coordinates the row of ``p`` will carry (the labels ``sim.rows.row`` uses)."""
    wl = p.workload
    fields = {"model": wl.model.name, "hardware": p.hardware.name, "cache_type": wl.cache_k.name, "context": p.context,
              "contexts": list(wl.contexts), "parallel": wl.n_parallel, "unified": wl.unified, "split_mode": wl.split_mode,
              "depth": p.transport.depth, "budget_mib": p.transport.budget_mib, "tokens": wl.tokens, "arm": p.transport.arm,
              "cache_type_v": wl.cache_v.name, "kv_gpu_layers": KEY_DEFAULTS["kv_gpu_layers"],
              "n_gpu_layers": KEY_DEFAULTS["n_gpu_layers"], "kv_copy": KEY_DEFAULTS["kv_copy"], **placement_fields(wl)}
    return tuple(_norm(k, fields[k]) for k in KEY_FIELDS)


@dataclass(frozen=True)
class Chunk:
    """Points that travel together: whole partitions of the grid (``sim.run.tasks.partitions``: the points that may
    share a simulation), ``todo`` marking those to run (the others only count in ``shared_with_n``), and ``exact``."""

    points: tuple[Point, ...]
    todo: tuple[bool, ...]
    exact: bool = False
    evaluate: bool = False  # the points to do are inside the evaluator's envelope: evaluate them, not simulate

    @property
    def todo_points(self) -> list[Point]:
        return [p for p, t in zip(self.points, self.todo, strict=True) if t]


def run_chunk(chunk: Chunk | Sequence[Point]) -> list[dict[str, Any] | str]:
    """Plan the chunk's points into their distinct simulations (``sim.run.tasks``) and run each (in a worker); a row
    per point to do, in order, or a one-line error. A plain list of points is a chunk of its own. Blocks for the
    simulations."""
    if not isinstance(chunk, Chunk):
        chunk = Chunk(tuple(chunk), (True,) * len(chunk))
    if chunk.evaluate:
        return _evaluated(chunk.todo_points)
    out: dict[int, dict[str, Any] | str] = {}
    for task in tasks.tasks(list(chunk.points), list(chunk.todo), exact=chunk.exact):
        try:
            rows: list[dict[str, Any] | str] = [row(r) | SIMULATED for r in tasks.run_task(task)]
        except Exception as exc:  # one bad point must not sink the sweep; reported at the end
            rows = [f"{type(exc).__name__}: {exc}"] * len(task.members)
        for m, r in zip(task.members, rows, strict=True):
            out[m.index] = r
    return [out[i] for i, t in enumerate(chunk.todo) if t]


def _evaluated(points: Sequence[Point]) -> list[dict[str, Any] | str]:
    """The rows of envelope points from the compiled evaluator (which plans them together); a point whose graph does
    not fit is simulated, which reports why. Blocks for the evaluation (CPU)."""
    from sim.evaluator.evaluate import evaluations

    out: list[dict[str, Any] | str | None] = []
    t = time.perf_counter()
    for _, ev in evaluations(points):
        wall = (time.perf_counter() - t) / len(ev.points)
        out += [ev.row(i, wall) if ev.plans.fits[i] else None for i in range(len(ev.points))]
        t = time.perf_counter()
    rest = [i for i, r in enumerate(out) if r is None]
    if rest:
        for i, got in zip(rest, run_chunk([points[i] for i in rest]), strict=True):
            out[i] = got
    return [r for r in out if r is not None]


def chunk_rows(pts: Sequence[Point], sims: list[tuple[Chunk, Any]]) -> list[dict[str, Any] | None]:
    """The rows of ``pts`` from their chunks' submitted :func:`run_chunk` (chunk, future) pairs (None where a point
    failed: it does not fit), as a plan runs the points outside the envelope. Blocks."""
    from sim.rows import key_of_row

    by_key = {key_of_row(r): r for _, fut in sims for r in fut.result() if not isinstance(r, str)}
    return [by_key.get(key_of_point(p)) for p in pts]


def _sample_rows(points: Sequence[Point], exact: bool) -> list[dict[str, Any]]:
    """A sample check's simulations of whole partitions (in a worker): planned together (``sim.run.tasks.tasks``),
    each distinct one run once -- the default path, or every token if ``exact`` -- with no race checker (the check
    compares rows); each point's row, in order. Raises what a simulation raises."""
    pts = list(points)
    out: list[dict[str, Any] | None] = [None] * len(pts)
    for t in tasks.tasks(pts):
        task = dataclasses.replace(t, exact=True) if exact else t
        for m, r in zip(task.members, tasks.run_task(task, checked=False), strict=True):
            out[m.index] = row(r) | SIMULATED
    return [r for r in out if r is not None]


def simulated_rows(ex: Executor, points: Sequence[Point], exact: bool = False, workers: int = 2,
                   ahead: Ahead | None = None) -> list[dict[str, Any]]:
    """The simulator's rows of ``points`` (in order), each distinct simulation once, as a sample check compares them:
    the points the point planner finds to be one run (``sim.run.tasks.tasks``: every budget of an ordered or declined
    point, every budget that leaves each token's plan the same) share one simulation, and each gets its own row from it
    (``sim.run.tasks.member_result``, as a sweep's rows do). The simulator's default path (``kvpipe simulate``'s: the
    steady tokens extrapolated, ``sim.run.decode.run_steady``) unless ``exact`` (every token), and no race checker
    either way: the check compares rows, not hazards. ``tests/sim/test_fast_path.py`` holds both kinds of row to each
    point's own exact, checked simulation. The points go to ``ex`` in about two pieces per worker (``workers``) of
    whole partitions (a simulation never spans two), each planned where it runs, so that the worker's graphs serve
    both its planning and its simulations. ``ahead``: default-path simulations submitted before (:class:`Ahead`),
    whose points take their rows from them. Blocks."""
    pts = list(points)
    out: list[dict[str, Any] | None] = ahead.rows_of(pts) if ahead is not None and not exact else [None] * len(pts)
    rest = [i for i, r in enumerate(out) if r is None]
    for i, r in zip(rest, _collect(len(rest), _submit_sample(ex, [pts[i] for i in rest], exact, workers)), strict=True):
        out[i] = r
    return [r for r in out if r is not None]


def _submit_sample(ex: Executor, pts: list[Point], exact: bool, workers: int) -> list[tuple[list[int], Any]]:
    """:func:`_sample_rows` of ``pts`` submitted to ``ex`` in about two pieces of whole partitions per worker: (each
    piece's indices, its future). Does not block (but for this process's executor)."""
    if not pts:
        return []
    parts = tasks.partitions(pts)
    n = max(1, min(len(parts), 2 * workers))
    pieces = [[i for part in parts[k * len(parts) // n : (k + 1) * len(parts) // n] for i in part] for k in range(n)]
    # submit, not ``map``: an interrupted ``map`` cancels its futures while the pool marks them broken (a traceback)
    return [(piece, ex.submit(_sample_rows, [pts[i] for i in piece], exact)) for piece in pieces]


def _collect(n: int, submitted: list[tuple[list[int], Any]]) -> list[dict[str, Any] | None]:
    out: list[dict[str, Any] | None] = [None] * n
    for piece, f in submitted:
        for i, r in zip(piece, f.result(), strict=True):
            out[i] = r
    return out


class Ahead:
    """Sample simulations submitted before the check needs them: the points every check re-simulates whatever it
    draws (a grid's boundaries, known once the grid is answered) run on the workers while the plan goes on, the rest
    of the sample while its evaluated rows are made; :func:`simulated_rows` takes their rows (the default path's,
    planned within their batch) instead of simulating them again. Raises at :meth:`rows_of` what a simulation the
    check reads raised."""

    def __init__(self) -> None:
        self.batches: list[tuple[list[Point], list[tuple[list[int], Any]]]] = []
        self._batch_of: dict[int, tuple[Point, int]] = {}  # id(point) -> (the point, its batch)
        self._rows: dict[int, dict[str, Any] | None] = {}  # the rows of the batches collected
        self._collected: set[int] = set()

    def _known(self, p: Point) -> int | None:
        got = self._batch_of.get(id(p))
        return got[1] if got is not None and got[0] is p else None

    def submit(self, ex: Executor, points: Sequence[Point], workers: int) -> None:
        """Submit the default-path simulations of ``points`` (each must fit its device) but those submitted before.
        Does not block (but for this process's executor)."""
        pts = [p for p in points if self._known(p) is None]
        if pts:
            self._batch_of.update((id(p), (p, len(self.batches))) for p in pts)
            self.batches.append((pts, _submit_sample(ex, pts, False, workers)))

    def hold(self) -> list[tuple[int, int]]:
        """Cancel the simulations submitted that have not started (what is submitted next goes first: the check needs
        these only at its end); (batch, piece) of each, for :meth:`resume`. Does not block."""
        return [(k, j) for k, (_, submitted) in enumerate(self.batches) if k not in self._collected
                for j, (_, f) in enumerate(submitted) if f.cancel()]

    def resume(self, ex: Executor, held: list[tuple[int, int]]) -> None:
        """Submit again, in their order, the simulations :meth:`hold` cancelled (the same pieces). Does not block."""
        for k, j in held:
            pts, submitted = self.batches[k]
            piece = submitted[j][0]
            submitted[j] = (piece, ex.submit(_sample_rows, [pts[i] for i in piece], False))

    def rows_of(self, points: Sequence[Point]) -> list[dict[str, Any] | None]:
        """The rows of ``points`` simulated ahead (None for the others). Blocks for the batches that hold them."""
        out: list[dict[str, Any] | None] = []
        for p in points:
            k = self._known(p)
            if k is not None and k not in self._collected:
                pts, submitted = self.batches[k]
                self._rows.update((id(q), r) for q, r in zip(pts, _collect(len(pts), submitted), strict=True))
                self._collected.add(k)
            out.append(self._rows[id(p)] if k is not None else None)
        return out


def exact_rows(ex: Executor, points: Sequence[Point], workers: int = 2) -> list[dict[str, Any]]:
    """:func:`simulated_rows` with every token simulated: what a sample check falls back on where the default path's
    row and the evaluator's disagree. Blocks."""
    return simulated_rows(ex, points, exact=True, workers=workers)


def chunks(points: Sequence[Point], workers: int, todo: Sequence[bool] | None = None, exact: bool = False,
           evaluator: bool = True) -> list[Chunk]:
    """The points to run in chunks of whole partitions: about 8 per worker, at most 16 points to do each unless one
    partition holds more (progress stays live). Partitions with nothing to do are left out. Unless ``exact``, the
    points inside the evaluator's envelope come first (``evaluator``: False simulates them too), in at least one chunk
    per worker of at most ``EVALUATED_PER_CHUNK``."""
    todo = list(todo) if todo is not None else [True] * len(points)
    total = sum(todo)
    if not total:
        return []
    out: list[Chunk] = []
    parts = [part for part in tasks.partitions(points) if any(todo[i] for i in part)]
    if evaluator and not exact:  # partitions inside the evaluator's envelope (depth and budget do not change it) go to it
        from sim.evaluator import in_envelope

        inside = [part for part in parts if in_envelope(points[part[0]]) is None]
        parts = [part for part in parts if in_envelope(points[part[0]]) is not None]
        answer = [points[i] for part in inside for i in part if todo[i]]
        n = max(min(max(1, workers), len(answer)), math.ceil(len(answer) / EVALUATED_PER_CHUNK))
        for k in range(n):
            piece = tuple(answer[k * len(answer) // n : (k + 1) * len(answer) // n])
            out.append(Chunk(piece, (True,) * len(piece), evaluate=True))
        total = sum(todo[i] for part in parts for i in part)
    size = max(1, min(16, math.ceil(total / (max(1, workers) * 8))))
    pts: list[Point] = []
    marks: list[bool] = []
    for part in parts:
        pts += [points[i] for i in part]
        marks += [todo[i] for i in part]
        if sum(marks) >= size:
            out.append(Chunk(tuple(pts), tuple(marks), exact))
            pts, marks = [], []
    if pts:
        out.append(Chunk(tuple(pts), tuple(marks), exact))
    return out


def check_on(ex: Executor, pts: Sequence[Point], rows: Sequence[dict[str, Any]], n: int, workers: int,
             ahead: Ahead | None = None) -> tuple[float, int, int]:
    """The sample check (``sim.evaluator.check_sample``: ``n`` of the evaluated ``rows`` drawn, plus every boundary)
    with its simulations on ``ex`` (``workers``): the simulator's default path (rows simulated ``ahead`` taken from
    it), exact where it differs. Returns (the largest relative disagreement, the points re-simulated, the points
    simulated again exact). Raises EvaluatorDisagreement above the tolerance. Blocks for the simulations."""
    from sim.evaluator import check_sample

    counts = [0, 0]

    def resimulate(chosen: list[Point]) -> list[dict[str, Any]]:
        counts[0] += len(chosen)
        return simulated_rows(ex, chosen, workers=workers, ahead=ahead)

    def exact(chosen: list[Point]) -> list[dict[str, Any]]:
        counts[1] += len(chosen)
        return exact_rows(ex, chosen, workers)

    worst = check_sample(list(pts), list(rows), n=n, resimulate=resimulate, exact=exact)
    return worst, counts[0], counts[1]


def check_rows(pts: list[Point], rows: list[dict[str, Any] | None], jobs: int | None, workers_of: Any = None,
               ahead: Any = None) -> tuple[float, int]:
    """:func:`check_on` of every point of ``pts`` that has a row (a plan's sample, drawn before), on ``jobs`` workers
    (``workers_of``: a context giving them; default a pool of its own): (the largest relative disagreement, the points
    simulated again exact). Raises EvaluatorDisagreement above the tolerance. Blocks."""
    from kvpipe.executors import executor_for

    keep = [(p, r) for p, r in zip(pts, rows, strict=True) if r is not None]
    with (workers_of or (lambda: executor_for(jobs)))() as ex:
        worst, _, again = check_on(ex, [p for p, _ in keep], [r for _, r in keep], len(keep), jobs or os.cpu_count() or 1,
                                   ahead)
    return worst, again
