"""A sweep's output folder: the journal, the snapshots, the manifest and the lock.

Each finished row is appended to a journal (``rows.jsonl``, one JSON object a line, flushed as it lands), and
``rows.json`` / ``rows.csv`` are rewritten atomically now and then -- after as many new rows as the folder held at
the last snapshot (at least ``SNAPSHOT_ROWS``), so a sweep of many rows rewrites them a logarithmic number of times,
not every few seconds -- and at the end; the journal is what a rerun resumes from. Settings that are not in the row
are kept in ``sweep.json``; a rerun with other settings, of another grid (unless ``resume``), or into a folder of rows
no sweep recorded is refused. One sweep at a time holds a folder (an exclusive ``flock`` on its lock file).

Units: none (rows carry their own).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backends.files import LARGE_LIMIT, check_nesting, parse_json, read_bytes, shown
from sim.errors import InputError
from sim.rows import KEY_FIELDS, Key, key_of_row
from sim.safe_write import write_outputs
from sim.telemetry import rows_to_csv, write_atomic

ROWS_JSON, ROWS_CSV, JOURNAL, MANIFEST, LOCK = "rows.json", "rows.csv", "rows.jsonl", "sweep.json", ".kvpipe-sweep.lock"
SNAPSHOT_ROWS = 256  # the fewest new rows between two snapshots of rows.json and rows.csv


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
        self._since_snapshot = 0  # rows added since the last snapshot
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
        """Keep a finished row; append it to the journal; snapshot the files after as many new rows as the last snapshot
        held (at least ``SNAPSHOT_ROWS``). Blocks on the writes."""
        key = key_of_row(r)
        self.rows[key] = r
        if self._journal is not None:
            line = self._lines[key] = json.dumps(r)
            try:
                self._journal.write(line + "\n")
                self._journal.flush()
            except OSError as exc:  # a full disk: the rows so far stay in the journal; a rerun resumes from them
                raise InputError(f"cannot write the sweep journal {shown(Path(str(self.dir)) / JOURNAL)}: {exc.strerror or exc}") from None
            self._since_snapshot += 1
            if self._since_snapshot >= max(SNAPSHOT_ROWS, len(self.rows) - self._since_snapshot):
                self.snapshot(order)

    def ordered(self, order: Sequence[Key]) -> list[dict[str, Any]]:
        """Rows in grid order, then any rows of earlier sweeps into the same folder that this grid lacks."""
        seen = set(order)
        first = [self.rows[k] for k in order if k in self.rows]
        return first + [r for k, r in self.rows.items() if k not in seen]

    def snapshot(self, order: Sequence[Key]) -> None:
        """Rewrite rows.json and rows.csv atomically (both or neither). Blocks on the writes."""
        self._since_snapshot = 0
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
