"""Sweeps: many points in parallel, written as rows, resumable.

A sweep is a list of points (the cross product of the grid flags) run on an
executor -- a ``concurrent.futures.ProcessPoolExecutor`` over local cores, or
a Dask cluster through ``dask.distributed``'s executor, which has the same
interface -- each point through :func:`sim.checks.run_checked`, so whatever
checks a plain ``simulate`` applies apply here too. Points travel in small
chunks of whole *partitions* (the points that differ only in depth and budget,
the only ones that can share a simulation; a simulation costs a few
milliseconds per simulated token, so one per task would spend a fair share of
the time on pickling), and the worker's point planner (``sim.distinct``) maps
its chunk to the distinct simulations that decide it, each run once, on the
fast path of ``sim.steady`` unless ``exact``.

Points inside the compiled evaluator's envelope (``sim.evaluator.in_envelope``: one device, pinned, one sequence,
the transport arm, no mutation) are not simulated unless ``exact``: the evaluator computes every token of them
exactly, a few hundred points to a chunk, and their rows say ``engine: evaluator``; the rest are simulated
(``engine: simulator``). A sweep that evaluated points then re-simulates a sample of them, exact
(``sim.evaluator.check_sample``: at least ``check_n``, plus every point where the best depth or a decline changes
between neighbouring contexts), and reports the largest relative disagreement; above 1e-9 it raises
``EvaluatorDisagreement`` (the rows are written first).

Every row has exactly the schema of ``kvpipe simulate --json``, plus ``engine``. A point is
identified by its *grid coordinates*, the row fields that name it (model,
hardware, cache type, context, depth, budget, tokens). With an output folder
each finished row is appended to a journal (``rows.jsonl``, one JSON object a
line, flushed as it lands), and ``rows.json`` / ``rows.csv`` are rewritten
atomically every few seconds and at the end; rerunning into the same folder
skips every point whose coordinates the folder already holds, so an
interrupted sweep loses at most the points in flight. Settings that are not in
the row (pageable cache, mutations) are kept in ``sweep.json`` and a rerun with
different ones is refused rather than mixed in; so is a rerun of another grid
unless ``resume``, and a folder holding rows with no ``sweep.json`` (someone
else's). One sweep at a time holds a folder (a ``flock``, see :class:`RowStore`),
and local workers die with the sweep, even when it is killed by SIGKILL
(:func:`_worker_init`).

Units: seconds inside; the rows carry their own units in their field names.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.files import LARGE_LIMIT, check_nesting, parse_json, read_bytes, shown
from sim import checks, distinct
from sim.errors import InputError
from sim.rows import KEY_DEFAULTS, KEY_FIELDS, Key, _norm, key_of_row, with_gains  # noqa: F401 - the schema, re-exported
from sim.safe_write import write_outputs
from sim.simulate import Point, placement_fields, row
from sim.telemetry import rows_to_csv, write_atomic

SNAPSHOT_EVERY_S = 2.0
SIMULATED = {"engine": "simulator"}
EVALUATED_PER_CHUNK = 512  # envelope points per evaluator chunk (its cost is mostly per point; a few per worker)
CHECK_N = 32  # evaluator rows the sample check re-simulates at least
ROWS_JSON, ROWS_CSV, JOURNAL, MANIFEST, LOCK = "rows.json", "rows.csv", "rows.jsonl", "sweep.json", ".kvpipe-sweep.lock"

def key_of_point(p: Point) -> Key:
    """The grid coordinates the row of ``p`` will carry (the labels ``sim.simulate.row`` uses)."""
    wl = p.workload
    fields = {"model": wl.model.name, "hardware": p.hardware.name, "cache_type": wl.cache_k.name, "context": p.context,
              "contexts": list(wl.contexts), "parallel": wl.n_parallel, "unified": wl.unified, "split_mode": wl.split_mode,
              "depth": p.transport.depth, "budget_mib": p.transport.budget_mib, "tokens": wl.tokens, "arm": p.transport.arm,
              "cache_type_v": wl.cache_v.name, "kv_gpu_layers": KEY_DEFAULTS["kv_gpu_layers"],
              "n_gpu_layers": KEY_DEFAULTS["n_gpu_layers"], **placement_fields(wl)}
    return tuple(_norm(k, fields[k]) for k in KEY_FIELDS)


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


# ------------------------------------------------------------- executors


@dataclass(frozen=True)
class Chunk:
    """Points that travel together: whole partitions of the grid (``sim.distinct.partitions``: the points that may
    share a simulation), ``todo`` marking those to run (the others only count in ``shared_with_n``), and ``exact``."""

    points: tuple[Point, ...]
    todo: tuple[bool, ...]
    exact: bool = False
    evaluate: bool = False  # the points to do are inside the evaluator's envelope: evaluate them, not simulate

    @property
    def todo_points(self) -> list[Point]:
        return [p for p, t in zip(self.points, self.todo, strict=True) if t]


def run_chunk(chunk: Chunk | Sequence[Point]) -> list[dict[str, Any] | str]:
    """Plan the chunk's points into their distinct simulations (``sim.distinct``) and run each (in a worker); a row
    per point to do, in order, or a one-line error. A plain list of points is a chunk of its own. Blocks for the
    simulations."""
    if not isinstance(chunk, Chunk):
        chunk = Chunk(tuple(chunk), (True,) * len(chunk))
    if chunk.evaluate:
        return _evaluated(chunk.todo_points)
    out: dict[int, dict[str, Any] | str] = {}
    for task in distinct.tasks(list(chunk.points), list(chunk.todo), exact=chunk.exact):
        try:
            rows: list[dict[str, Any] | str] = [row(r) | SIMULATED for r in checks.run_task(task)]
        except Exception as exc:  # one bad point must not sink the sweep; reported at the end
            rows = [f"{type(exc).__name__}: {exc}"] * len(task.members)
        for m, r in zip(task.members, rows, strict=True):
            out[m.index] = r
    return [out[i] for i, t in enumerate(chunk.todo) if t]


def _evaluated(points: Sequence[Point]) -> list[dict[str, Any] | str]:
    """The rows of envelope points from the compiled evaluator (which plans them together); a point whose graph does
    not fit is simulated, which reports why. Blocks for the evaluation (CPU)."""
    from sim.evaluator.evaluate import evaluations

    t = time.perf_counter()
    done = evaluations(points)
    wall = (time.perf_counter() - t) / max(1, len(points))
    out: list[dict[str, Any] | str | None] = [ev.row(i, wall) if ev.plans.fits[i] else None
                                              for _, ev in done for i in range(len(ev.points))]
    rest = [i for i, r in enumerate(out) if r is None]
    if rest:
        for i, got in zip(rest, run_chunk([points[i] for i in rest]), strict=True):
            out[i] = got
    return [r for r in out if r is not None]


def exact_row(point: Point) -> dict[str, Any]:
    """The simulator's row of ``point``, every token simulated (what the sample check compares with). Blocks."""
    return row(checks.run_checked(point, exact=True)) | SIMULATED


class _Serial(Executor):
    """This process, one task after another (``--jobs 1``: no pool, easy to debug and profile)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        f: Future[Any] = Future()
        f.set_result(fn(*args, **kwargs))
        return f


@contextmanager
def executor_for(jobs: int | None = None, dask_address: str | None = None) -> Iterator[Executor]:
    """An executor: Dask at ``dask_address``, else ``jobs`` local processes (default: all cores; 1 = this process).

    Raises InputError if dask.distributed is missing or the scheduler cannot be reached.
    """
    if dask_address:
        try:
            from dask.distributed import Client
        except ImportError:
            raise InputError("--dask needs dask.distributed: pip install 'kvpipe[cluster]'") from None
        try:
            client = Client(dask_address, timeout="10s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise InputError(f"cannot reach the Dask scheduler at {dask_address!r}: {exc}") from None
        try:
            yield client.get_executor(pure=False)
        finally:
            client.close()
        return
    n = jobs or os.cpu_count() or 1
    if not 1 <= n <= max_jobs():
        raise InputError(f"--jobs {jobs} out of range; allowed: 0 (every core) or 1..{max_jobs()} workers")
    if n == 1:
        yield _Serial()
        return
    pool = ProcessPoolExecutor(max_workers=n, initializer=_worker_init, initargs=(os.getpid(),))
    try:
        yield pool
    except BaseException:  # interrupted (Ctrl-C, SIGTERM) or failed: the workers end now, not after their chunks
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True, cancel_futures=True)


def max_jobs() -> int:
    """The most local worker processes a sweep may start: 4 per core, at least 32 (each is a whole Python process)."""
    return max(32, 4 * (os.cpu_count() or 1))


def _worker_init(parent: int) -> None:
    """A worker leaves Ctrl-C to the parent, which keeps finished rows and ends the pool; SIGTERM ends it; and it dies
    with its parent, even one killed by SIGKILL (which runs no cleanup): Linux sends it SIGTERM when the parent
    thread ends (``prctl(PR_SET_PDEATHSIG)``), and a watcher thread checks ``os.getppid()`` where that is missing."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="kvpipe-parent-watch").start()


def _die_with_parent() -> None:
    """Ask Linux for SIGTERM when the parent ends (PR_SET_PDEATHSIG); a no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _watch_parent(parent: int, every_s: float = 1.0) -> None:
    """End this worker once its parent is gone (reparented: ``os.getppid()`` changed). Runs in a daemon thread."""
    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(1)


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
    parts = [part for part in distinct.partitions(points) if any(todo[i] for i in part)]
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


# ------------------------------------------------------------------ store


class RowStore:
    """The output folder of a sweep: journal, snapshots, manifest. ``None`` folder = rows kept in memory only.

    The folder is this process's alone while the store is open: an exclusive, non-blocking ``flock`` on
    :data:`LOCK` inside it (a second sweep into it stops with one line naming the holder's pid; the kernel drops the
    lock when the holder dies, even by SIGKILL). Rows already there are resumed only from a folder this sweep
    recognises: its ``sweep.json`` names the same settings and the same grid (``resume`` also takes a folder of
    another grid, to add this grid's points to it); rows with no ``sweep.json``, or of another grid without
    ``resume``, are someone else's and are refused, never rewritten.
    """

    def __init__(self, out_dir: str | Path | None, settings: dict[str, Any], grid: Sequence[Key] = (),
                 resume: bool = False) -> None:
        self.dir = Path(out_dir) if out_dir else None
        self.rows: dict[Key, dict[str, Any]] = {}
        self._lines: dict[Key, str] = {}  # each row as JSON, encoded once for the journal and reused by every snapshot
        self._journal: Any = None
        self._lock: int | None = None
        self._last_snapshot = 0.0
        if self.dir is None:
            return
        self._lock, created = _lock_folder(self.dir)
        try:
            self._open(settings, grid_id(grid), len(grid), resume)
        except BaseException:
            if created:  # a refused folder (someone else's rows) is left as it was, without our lock file
                (self.dir / LOCK).unlink(missing_ok=True)
            self._unlock()
            raise

    def _open(self, settings: dict[str, Any], grid: str, n_points: int, resume: bool) -> None:
        assert self.dir is not None
        manifest = self.dir / MANIFEST
        named = shown(self.dir)
        if manifest.exists():
            old = _read_json(manifest)
            if not isinstance(old, dict):
                raise InputError(f"{shown(manifest)} holds a {type(old).__name__}, not a sweep manifest; allowed: a folder of "
                                 "kvpipe sweep, or another --out")
            if old.get("settings") != settings:
                raise InputError(f"{named} holds a sweep with settings {old.get('settings')}, not {settings}; "
                                 "use another --out")
            if old.get("grid") != grid and not resume:
                raise InputError(f"--out {named} holds a sweep of another grid ({old.get('points', '?')} points; this one "
                                 f"{n_points}); allowed: another --out, or --resume to add this grid's points to it")
        elif any((self.dir / f).exists() for f in (JOURNAL, ROWS_JSON, ROWS_CSV)):
            raise InputError(f"--out {named} holds rows of no sweep kvpipe recorded there (no {MANIFEST}); allowed: a new or "
                             "empty folder, or one kvpipe sweep wrote")
        for r in self._load():
            self.rows[key_of_row(r)] = r
        write_atomic(manifest, json.dumps({"settings": settings, "key_fields": list(KEY_FIELDS), "grid": grid,
                                           "points": n_points}, indent=1))
        # Compact the journal (drops a line cut short by an interruption) before appending to it.
        write_atomic(self.dir / JOURNAL, "".join(json.dumps(r) + "\n" for r in self.rows.values()))
        self._journal = open(self.dir / JOURNAL, "a")  # noqa: SIM115 - closed in close()

    def _load(self) -> list[dict[str, Any]]:
        assert self.dir is not None
        rows: list[Any] = []
        if (self.dir / ROWS_JSON).exists():
            data = _read_json(self.dir / ROWS_JSON)
            if not isinstance(data, list):
                raise InputError(f"{shown(self.dir / ROWS_JSON)} does not hold a list of rows")
            rows += data
        journal = self.dir / JOURNAL
        if journal.exists():
            text = read_bytes(journal, "sweep journal", LARGE_LIMIT, note=False).decode(errors="replace")
            for n, line in enumerate(text.splitlines(), 1):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # the line an interruption cut short; that point runs again
                except RecursionError:
                    raise InputError(f"sweep journal {shown(journal)} line {n} nests too deep; allowed: kvpipe's rows") from None
                check_nesting(rows[-1], f"sweep journal {shown(journal)} line {n}")
        try:
            for r in rows:
                key_of_row(r)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"{shown(self.dir)} holds a row without grid coordinates ({exc}); use another --out") from None
        return rows

    def __contains__(self, key: Key) -> bool:
        return key in self.rows

    def add(self, r: dict[str, Any], order: Sequence[Key]) -> None:
        """Keep a finished row; append it to the journal; snapshot the files now and then. Blocks on the writes."""
        key = key_of_row(r)
        self.rows[key] = r
        if self._journal is not None:
            line = self._lines[key] = json.dumps(r)
            try:
                self._journal.write(line + "\n")
                self._journal.flush()
            except OSError as exc:  # a full disk: the rows so far stay in the journal; a rerun resumes from them
                raise InputError(f"cannot write the sweep journal {shown(Path(str(self.dir)) / JOURNAL)}: {exc.strerror or exc}") from None
            if time.monotonic() - self._last_snapshot > SNAPSHOT_EVERY_S:
                self.snapshot(order)

    def ordered(self, order: Sequence[Key]) -> list[dict[str, Any]]:
        """Rows in grid order, then any rows of earlier sweeps into the same folder that this grid lacks."""
        seen = set(order)
        first = [self.rows[k] for k in order if k in self.rows]
        return first + [r for k, r in self.rows.items() if k not in seen]

    def snapshot(self, order: Sequence[Key]) -> None:
        """Rewrite rows.json and rows.csv atomically (both or neither). Blocks on the writes."""
        self._last_snapshot = time.monotonic()
        if self.dir is None:
            return
        rows = self.ordered(order)
        # One row a line (the C encoder; json.dumps with indent runs the pure-Python one, several times slower).
        text = ",\n".join(self._lines.get(key_of_row(r)) or json.dumps(r) for r in rows)
        write_outputs([(self.dir / ROWS_JSON, f"[\n{text}\n]\n" if rows else "[]\n"),
                       (self.dir / ROWS_CSV, rows_to_csv(rows) if rows else "")])

    def close(self, order: Sequence[Key]) -> None:
        try:
            self.snapshot(order)
        finally:
            if self._journal is not None:
                self._journal.close()
                self._journal = None
            self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor drops the flock
            self._lock = None


def grid_id(grid: Sequence[Key]) -> str:
    """A fingerprint of a grid's points (their coordinates, in any order): what ``sweep.json`` records."""
    return hashlib.sha256(repr(sorted(map(repr, grid))).encode()).hexdigest()[:16]


def _lock_folder(folder: Path) -> tuple[int, bool]:
    """Create ``folder`` if need be and take an exclusive, non-blocking flock on its :data:`LOCK`; the descriptor, and
    whether this call created the lock file. Raises InputError naming the folder and the holder's pid when another
    process holds it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        created = not (folder / LOCK).exists()
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    except FileExistsError:
        raise InputError(f"--out {shown(folder)} exists and is not a folder") from None
    except OSError as exc:
        raise InputError(f"cannot use --out {shown(folder)}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise InputError(f"--out {shown(folder)} is in use by another kvpipe sweep (pid {holder}); allowed: wait for it "
                         "to finish, or give another --out") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd, created


def _read_json(path: Path) -> Any:
    return parse_json(read_bytes(path, "sweep file", LARGE_LIMIT, note=False), f"sweep file {shown(path)}", allow_nan=True)


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
    checked: int = 0  # the evaluator rows it re-simulated


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
    least ``check_n`` of them (0: none) plus the boundary points is re-simulated exact on the same executor
    (``result.check``); a disagreement above 1e-9 raises ``sim.evaluator.EvaluatorDisagreement`` after the rows
    are written. ``evaluator`` False: every point simulated (the fast path unless ``exact``), as before the evaluator.

    The points are planned by partition in the workers (``sim.distinct``): each distinct simulation runs once, on
    the fast path of ``sim.steady`` unless ``exact``, and every point gets its own row. Blocks until the sweep is done (wall time
    ~ distinct simulations x simulated tokens x a few ms / workers). Raises InputError on an empty grid or an
    unusable output folder. A point that raises is reported in ``failed`` and left out of the rows (a rerun
    retries it). ``resume`` adds this grid to a folder that holds another grid's sweep (``RowStore``).
    """
    if not points:
        raise InputError("the grid is empty; give at least one value per flag")
    from sim import checks  # noqa: F401 - imported once here, so local workers forked from this process inherit it
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
        try:
            workers = 1 if isinstance(ex, _Serial) else (jobs or os.cpu_count() or 1)
            _collect(ex, chunks(unique, workers, todo, exact, evaluator), store, order, result, progress, evaluated)
        finally:
            store.close(order)
        if evaluated and check_n:
            place = {k: i for i, k in enumerate(order)}  # grid order, not the order chunks finished: the same sample each run
            _check(ex, sorted(evaluated, key=lambda pr: place[key_of_point(pr[0])]), check_n, result)
    result.rows = store.ordered(order) if out_dir else [store.rows[k] for k in order if k in store.rows]
    result.wall_s = time.perf_counter() - t0
    return result


def _check(ex: Executor, evaluated: list[tuple[Point, dict[str, Any]]], n: int, result: SweepResult) -> None:
    """The sample check of the evaluator's rows (``sim.evaluator.check_sample``), its simulations on ``ex``."""
    from sim.evaluator import check_sample

    def resimulate(pts: list[Point]) -> list[dict[str, Any]]:
        result.checked = len(pts)
        # submit, not ``map``: an interrupted ``map`` cancels its futures while the pool marks them broken (a traceback)
        futures = [ex.submit(exact_row, p) for p in pts]
        return [f.result() for f in futures]

    result.check = check_sample([p for p, _ in evaluated], [r for _, r in evaluated], n=n, resimulate=resimulate)


def _collect(ex: Executor, work: list[Chunk], store: RowStore, order: Sequence[Key], result: SweepResult,
             progress: bool, evaluated: list[tuple[Point, dict[str, Any]]] | None = None) -> None:
    from tqdm import tqdm

    total = sum(sum(c.todo) for c in work)
    runs: set[Key] = set()  # the simulations the rows came from: their coordinates but depth and budget, and simulated_as
    with tqdm(total=total, desc="sweep", unit="pt", file=sys.stderr, disable=not progress or not total,
              dynamic_ncols=True) as bar:
        for chunk, rows in _results(ex, work):
            done = chunk.todo_points
            for p, r in zip(done, rows, strict=True):
                if isinstance(r, str):
                    result.failed.append((key_of_point(p), r))
                else:
                    store.add(r, order)
                    result.ran += 1
                    if r.get("engine") == "evaluator":
                        result.evaluated += 1
                        if evaluated is not None:
                            evaluated.append((p, r))
                    else:
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
