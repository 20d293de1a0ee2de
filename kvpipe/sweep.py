"""Sweeps: many points in parallel, written as rows, resumable.

A sweep is a list of points (the cross product of the grid flags) run on an
executor -- a ``concurrent.futures.ProcessPoolExecutor`` over local cores, or
a Dask cluster through ``dask.distributed``'s executor, which has the same
interface -- each point through :func:`sim.run.run.run_point`, so whatever
checks a plain ``simulate`` applies apply here too. Points travel in small
chunks of whole *partitions* (the points that differ only in depth and budget,
the only ones that can share a simulation; a simulation costs a few
milliseconds per simulated token, so one per task would spend a fair share of
the time on pickling), and the worker's point planner (``sim.run.tasks``) maps
its chunk to the distinct simulations that decide it, each run once, on the
fast path (``sim.run.decode.run_steady``) unless ``exact``.

Points inside the compiled evaluator's envelope (``sim.evaluator.in_envelope``: one device, pinned, the transport arm,
no mutation) are not simulated unless ``exact``: the evaluator computes every token of them exactly, a few hundred
points to a chunk, and their rows say ``engine: evaluator``; the rest are simulated (``engine: simulator``). A sweep
that evaluated points then re-simulates a sample of them on the simulator's default path (``sim.evaluator.check_sample``:
at least ``check_n``, plus every point where the best depth or a decline changes between neighbouring contexts; a row
that differs by more than 1e-9 is simulated again exact, which decides), and reports the largest relative
disagreement; above 1e-9 it raises ``EvaluatorDisagreement`` (the rows are written first).

Every row has exactly the schema of ``kvpipe simulate --json``, plus ``engine``. A point is identified by its *grid
coordinates*, the row fields that name it (model, hardware, cache type, context, depth, budget, tokens). The output
folder (journal, snapshots, manifest, lock: ``kvpipe.row_store.RowStore``) lets a rerun skip every point it already
holds, so an interrupted sweep loses at most the points in flight; where the work runs is
``kvpipe.executors.executor_for``; the chunks and what a worker does with one, ``kvpipe.sweep_work``.

Units: seconds inside; the rows carry their own units in their field names.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpipe.executors import _Serial, executor_for, max_jobs  # noqa: F401 - re-exported: where a sweep's work runs
from kvpipe.row_store import JOURNAL, LOCK, MANIFEST, ROWS_CSV, ROWS_JSON, RowStore, grid_id  # noqa: F401 - re-exported
from kvpipe.sweep_work import (  # noqa: F401 - re-exported: a sweep's chunks
    EVALUATED_PER_CHUNK,
    SIMULATED,
    Ahead,
    Chunk,
    check_on,
    chunks,
    exact_rows,
    key_of_point,
    run_chunk,
    simulated_rows,
)
from sim.errors import InputError
from sim.rows import KEY_DEFAULTS, KEY_FIELDS, Key, _norm, key_of_row, with_gains  # noqa: F401 - the schema, re-exported
from sim.run.point import Point

CHECK_N = 32  # evaluator rows the sample check re-simulates at least


def settings_of(points: Sequence[Point], exact: bool = False) -> dict[str, Any]:
    """What a sweep's rows depend on but do not record (checked on resume); ``exact`` only when set, so folders
    written before the fast path resume as fast ones."""

    def values(get: Callable[[Point], Any]) -> list[Any]:
        return sorted({get(p) for p in points}, key=repr)

    return {
        "pinned": values(lambda p: p.workload.pinned),
        "mutations": sorted({m for p in points for m in p.transport.mutations}),
        "ctx_size": values(lambda p: p.workload.ctx_size),
        "tensor_split": [list(t) for t in values(lambda p: tuple(p.workload.tensor_split))],
        "flat_prefix": values(lambda p: p.workload.flat_prefix),
        "pack_streams": values(lambda p: p.transport.pack_streams),
    } | ({"exact": True} if exact else {})


# ------------------------------------------------------------------ sweep


@dataclass
class SweepResult:
    """What a sweep produced: every row (grid order), how many ran now (in how many simulations) or were resumed,
    which failed."""

    rows: list[dict[str, Any]]
    ran: int = 0
    resumed: int = 0
    failed: list[tuple[Key, str]] = field(default_factory=list)
    wall_s: float = 0.0
    simulations: int = 0
    evaluated: int = 0
    check: float | None = None  # the sample check's largest relative disagreement (None: nothing evaluated was checked)
    checked: int = 0  # the evaluator rows it re-simulated (the simulator's default path)
    checked_exact: int = 0  # of those, the rows simulated again exact (the default path's row differed by > 1e-9)


def run_sweep(
    points: Sequence[Point],
    out_dir: str | Path | None = None,
    jobs: int | None = None,
    dask_address: str | None = None,
    progress: bool = True,
    exact: bool = False,
    resume: bool = False,
    check_n: int = CHECK_N,
    evaluator: bool = True,
) -> SweepResult:
    """Run every point not already in ``out_dir``; returns all rows in grid order.

    Unless ``exact``, points inside the evaluator's envelope are evaluated (``sim.evaluator``), and a sample of at
    least ``check_n`` of them (0: none) plus the boundary points is re-simulated on the same executor (the
    simulator's default path; exact where it differs: ``result.check``); a disagreement above 1e-9 raises
    ``sim.evaluator.EvaluatorDisagreement`` after the rows are written. ``evaluator`` False: every point simulated
    (the fast path unless ``exact``), as before the evaluator.

    The points are planned by partition in the workers (``sim.run.tasks``): each distinct simulation runs once, on
    the fast path (``sim.run.decode.run_steady``) unless ``exact``, and every point gets its own row. Blocks until the
    sweep is done (wall time ~ distinct simulations x simulated tokens x a few ms / workers). Raises InputError on an
    empty grid or an unusable output folder. A point that raises is reported in ``failed`` and left out of the rows (a
    rerun retries it). ``resume`` adds this grid to a folder that holds another grid's sweep (``RowStore``).
    """
    if not points:
        raise InputError("the grid is empty; give at least one value per flag")
    from sim.run import run  # noqa: F401 - imported once here, so local workers forked from this process inherit it

    if evaluator and not exact:
        import sim.evaluator.evaluate  # noqa: F401 - the same for the evaluator (each worker imported it on its first chunk)
    t0 = time.perf_counter()
    with executor_for(jobs, dask_address) as ex:  # first: a missing extra or scheduler writes nothing
        order: list[Key] = []
        unique: list[Point] = []
        seen: set[Key] = set()
        for p in points:
            k = key_of_point(p)
            if k not in seen:
                seen.add(k)
                order.append(k)
                unique.append(p)
        store = RowStore(out_dir, settings_of(points, exact), order, resume)
        todo = [k not in store for k in order]
        result = SweepResult(rows=[], resumed=len(order) - sum(todo))
        evaluated: list[tuple[Point, dict[str, Any]]] = []
        place = {id(p): i for i, p in enumerate(unique)}  # grid order, not the order chunks finished: the same sample
        workers = 1 if isinstance(ex, _Serial) else (jobs or os.cpu_count() or 1)
        ahead = Ahead() if check_n and not isinstance(ex, _Serial) else None  # (inline: it would simulate before writing)

        def sample_ahead() -> None:  # the check's simulations start while the rows are written (workers idle else)
            if ahead is not None and evaluated:
                from sim.evaluator.check import sample_indices

                mine = sorted(evaluated, key=lambda pr: place[id(pr[0])])
                ahead.submit(ex, [mine[i][0] for i in sample_indices([r for _, r in mine], check_n)], workers)

        try:
            _collect(ex, chunks(unique, workers, todo, exact, evaluator), store, order, result, progress, evaluated,
                     sample_ahead)
        finally:
            store.close(order)
        if evaluated and check_n:
            _check(ex, sorted(evaluated, key=lambda pr: place[id(pr[0])]), check_n, result, workers, ahead)
    result.rows = store.ordered(order) if out_dir else [store.rows[k] for k in order if k in store.rows]
    result.wall_s = time.perf_counter() - t0
    return result


def _check(ex: Executor, evaluated: list[tuple[Point, dict[str, Any]]], n: int, result: SweepResult, workers: int,
           ahead: Ahead | None = None) -> None:
    """The sample check of the evaluator's rows (``kvpipe.sweep_work.check_on``), its simulations on ``ex`` (``workers``;
    ``ahead``: those submitted while the rows were written)."""
    result.check, result.checked, result.checked_exact = check_on(ex, [p for p, _ in evaluated], [r for _, r in evaluated],
                                                                  n, workers, ahead)


def _collect(ex: Executor, work: list[Chunk], store: RowStore, order: Sequence[Key], result: SweepResult,
             progress: bool, evaluated: list[tuple[Point, dict[str, Any]]] | None = None,
             all_evaluated: Callable[[], None] | None = None) -> None:
    """Run ``work`` on ``ex`` into ``store`` as chunks finish; ``evaluated`` gets every evaluator row's (point, row), and
    ``all_evaluated`` is called once the last evaluator chunk's rows are in ``evaluated``, before they are written.
    Blocks."""
    from tqdm import tqdm

    total = sum(sum(c.todo) for c in work)
    runs: set[Key] = set()  # the simulations the rows came from: their coordinates but depth and budget, and simulated_as
    left = sum(c.evaluate for c in work)  # evaluator chunks not finished
    with tqdm(total=total, desc="sweep", unit="pt", file=sys.stderr, disable=not progress or not total,
              dynamic_ncols=True) as bar:
        for chunk, rows in _results(ex, work):
            done = chunk.todo_points
            mine = [(p, r) for p, r in zip(done, rows, strict=True) if not isinstance(r, str) and r.get("engine") == "evaluator"]
            result.evaluated += len(mine)
            if evaluated is not None:
                evaluated += mine
            left -= chunk.evaluate
            if chunk.evaluate and not left and all_evaluated is not None:
                all_evaluated()
            for p, r in zip(done, rows, strict=True):
                if isinstance(r, str):
                    result.failed.append((key_of_point(p), r))
                else:
                    store.add(r, order)
                    result.ran += 1
                    if r.get("engine") != "evaluator":
                        runs.add(_run_of(r))
            bar.update(len(done))
    result.simulations = len(runs)


def _run_of(r: dict[str, Any]) -> Key:
    own = tuple(v for k, v in zip(KEY_FIELDS, key_of_row(r), strict=True) if k not in ("depth", "budget_mib"))
    sim = r.get("simulated_as") or {"depth": r["depth"], "budget_mib": r["budget_mib"]}
    return (*own, sim["depth"], float(sim["budget_mib"]))


def _results(ex: Executor, work: list[Chunk]) -> Iterator[tuple[Chunk, list[dict[str, Any] | str]]]:
    """(chunk, rows) as chunks finish: inline for the serial executor, else in completion order."""
    if isinstance(ex, _Serial):
        for c in work:
            yield c, run_chunk(c)
        return
    futures = {ex.submit(run_chunk, c): c for c in work}
    for fut in as_completed(futures):
        yield futures[fut], fut.result()


def gain_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with ``gain`` added: tokens/s over its ordered path (``sim.rows.gains``, the one rule). Does not block."""
    return with_gains(rows)
