"""A sweep's sample check starts its simulations as soon as the evaluator's rows are in, before the rows are written,
and answers as the check after the writes did (``kvpipe.sweep.run_sweep``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpipe import sweep, sweep_work
from kvpipe.row_store import RowStore
from sim.evaluator.check import IGNORED, check_sample, sample_indices
from sim.points import GridSpec, points


def _grid() -> list:  # type: ignore[type-arg]
    spec = GridSpec(contexts=tuple((c,) for c in range(1024, 12289, 1024)), depths=(0, 1, 2, 3), budgets_mib=(0, 16, 64),
                    tokens=3)
    return points(spec)


def _rows(res: sweep.SweepResult) -> list[dict]:  # type: ignore[type-arg]
    return [{k: v for k, v in r.items() if k not in IGNORED} for r in res.rows]


def test_the_sample_is_simulated_once_before_the_rows_are_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pts = _grid()
    serial = sweep.run_sweep(pts, tmp_path / "serial", jobs=1, progress=False)  # one process: the check after the writes
    events: list[str] = []
    ahead: list[object] = []
    simulated: list[object] = []
    submit, close, sample = sweep_work.Ahead.submit, RowStore.close, sweep_work._submit_sample

    def submit_ahead(self, ex, pts, workers):  # type: ignore[no-untyped-def]
        events.append("sample submitted")
        ahead.extend(pts)
        return submit(self, ex, pts, workers)

    def close_store(self, order):  # type: ignore[no-untyped-def]
        events.append("rows written")
        return close(self, order)

    def submit_sample(ex, pts, exact, workers):  # type: ignore[no-untyped-def]
        simulated.extend(pts)
        return sample(ex, pts, exact, workers)

    monkeypatch.setattr(sweep_work.Ahead, "submit", submit_ahead)
    monkeypatch.setattr(RowStore, "close", close_store)
    monkeypatch.setattr(sweep_work, "_submit_sample", submit_sample)
    par = sweep.run_sweep(pts, tmp_path / "parallel", jobs=2, progress=False)
    assert events == ["sample submitted", "rows written"]
    assert par.checked == serial.checked == len(ahead) > 32  # the boundaries too
    assert len(simulated) == len(ahead)  # every sample point simulated once: the check took the rows made ahead
    assert par.check == serial.check and par.check is not None and par.check <= 1e-9
    assert _rows(par) == _rows(serial)


def test_sample_indices_are_the_rows_the_check_resimulates() -> None:
    pts = _grid()[:120]
    res = sweep.run_sweep(pts, None, jobs=1, progress=False, check_n=0)
    rows = res.rows
    asked: list[int] = []

    def resimulate(chosen):  # type: ignore[no-untyped-def]
        asked.extend(id(p) for p in chosen)
        return [rows[[id(q) for q in pts].index(id(p))] for p in chosen]  # the evaluator's own rows: no disagreement

    assert check_sample(pts, rows, n=8, resimulate=resimulate) == 0.0
    want = [id(pts[i]) for i in sample_indices(rows, 8)]
    assert asked == want and len(want) > 8
    assert sample_indices([{**r, "engine": "simulator"} for r in rows], 8) == []
