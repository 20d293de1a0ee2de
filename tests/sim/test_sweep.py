"""kvpipe sweep: same rows as simulate, parallel, resumable, Dask, one-line errors."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from kvpipe import sweep
from kvpipe.cli import main
from kvpipe.commands.args import UsageError, expand_ranges
from sim.evaluator import row_disagreement

GRID = ["--context", "2048,16384", "--depth", "0,1", "--budget", "0,128", "--tokens", "2"]


def _simulate_json(capsys: pytest.CaptureFixture[str], args: list[str]) -> list[dict]:
    assert main(["simulate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _sweep(tmp: Path, args: list[str], *extra: str) -> int:
    return main(["sweep", *args, "--out", str(tmp), "--quiet", *extra])


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_rows_match_simulate_json_and_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expected = _simulate_json(capsys, [*GRID, "--exact"])
    assert _sweep(tmp_path, GRID, "--jobs", "1", "--exact") == 0
    got = json.loads((tmp_path / "rows.json").read_text())
    assert {r.pop("engine") for r in got} == {"simulator"}
    assert got == expected  # same schema, same values, grid order
    main(["simulate", *GRID, "--exact", "--csv", str(tmp_path / "sim.csv")])
    sim_csv = list(csv.DictReader(io.StringIO((tmp_path / "sim.csv").read_text())))
    sweep_csv = [{k: v for k, v in r.items() if k != "engine"} for r in csv.DictReader(io.StringIO((tmp_path / "rows.csv").read_text()))]
    assert sweep_csv == sim_csv


def test_default_path_evaluates_within_1e9_and_checks_a_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --exact the envelope points come from the compiled evaluator: every field within 1e-9 of the simulator's
    exact rows, and the summary prints the sample check."""
    expected = _simulate_json(capsys, [*GRID, "--exact"])
    assert _sweep(tmp_path, GRID, "--jobs", "1") == 0
    out = capsys.readouterr().out
    assert "8 evaluated, 0 distinct simulations" in out
    assert "sample check: 8 evaluated points re-simulated on the simulator's default path" in out
    got = json.loads((tmp_path / "rows.json").read_text())
    assert {r["engine"] for r in got} == {"evaluator"}
    assert max(row_disagreement(a, b) for a, b in zip(got, expected, strict=True)) <= 1e-9
    outside = sweep.run_sweep(sweep_points([*GRID, "--pageable"]), jobs=1, progress=False)
    assert {r["engine"] for r in outside.rows} == {"simulator"} and outside.check is None


def test_parallel_processes_give_the_same_rows(tmp_path: Path) -> None:
    assert _sweep(tmp_path / "a", GRID, "--jobs", "1") == 0
    assert _sweep(tmp_path / "b", GRID, "--jobs", "2") == 0
    a = json.loads((tmp_path / "a" / "rows.json").read_text())
    b = json.loads((tmp_path / "b" / "rows.json").read_text())
    assert a == b and len(a) == 8


def test_rerun_skips_done_points_and_extends(tmp_path: Path) -> None:
    first = sweep.run_sweep(sweep_points(GRID), tmp_path, jobs=1, progress=False)
    assert (first.ran, first.resumed) == (8, 0)
    again = sweep.run_sweep(sweep_points(GRID), tmp_path, jobs=1, progress=False)
    assert (again.ran, again.resumed) == (0, 8) and again.rows == first.rows
    bigger = GRID[:1] + ["2048,16384,32768"] + GRID[2:]
    more = sweep.run_sweep(sweep_points(bigger), tmp_path, jobs=1, progress=False, resume=True)  # another grid: --resume
    assert (more.ran, more.resumed) == (4, 8)
    assert [r["context"] for r in more.rows] == [2048] * 4 + [16384] * 4 + [32768] * 4


def test_interrupted_sweep_keeps_finished_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = sweep.run_chunk
    calls = []
    grid = ["--context", "2048,4096,8192,16384", *GRID[2:]]  # four partitions (a chunk holds whole ones): 16 points
    # --exact: the simulator's chunks (the evaluator answers these 16 points in one chunk; it shares the row store)

    def flaky(chunk):  # type: ignore[no-untyped-def]
        calls.append(sum(chunk.todo))  # rows: a chunk holds whole partitions, some points of them resumed
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(chunk)

    monkeypatch.setattr(sweep, "run_chunk", flaky)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(sweep_points(grid), tmp_path, jobs=1, progress=False, exact=True)
    kept = json.loads((tmp_path / "rows.json").read_text())
    assert len(kept) == sum(calls[:2]) > 0
    journal = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert journal == kept
    # Killed before the last snapshot: the journal alone resumes, and a line cut short is ignored, not fatal.
    (tmp_path / "rows.json").unlink()
    with open(tmp_path / "rows.jsonl", "a") as f:
        f.write('{"model": "qwen3.8-27b", "hard')
    monkeypatch.setattr(sweep, "run_chunk", real)
    rest = sweep.run_sweep(sweep_points(grid), tmp_path, jobs=1, progress=False, exact=True)
    assert (rest.ran, rest.resumed) == (16 - len(kept), len(kept))
    fresh = sweep.run_sweep(sweep_points(grid), None, jobs=1, progress=False, exact=True)
    assert rest.rows == fresh.rows


def test_failed_point_reported_others_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from sim.run import tasks

    real = tasks.run_point

    def broken(point, **kw):  # type: ignore[no-untyped-def]
        if point.context == 16384 and point.transport.depth == 1:
            raise RuntimeError("boom")
        return real(point, **kw)

    monkeypatch.setattr(tasks, "run_point", broken)
    assert _sweep(tmp_path, GRID, "--jobs", "1", "--exact") == 1  # the simulator's path (the evaluator's runs no simulation)
    err = capsys.readouterr().err
    assert "boom" in err and "16384" in err
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert len(rows) == 6 and not any(r["context"] == 16384 and r["depth"] == 1 for r in rows)


def test_dask_local_cluster_gives_the_same_rows(tmp_path: Path) -> None:
    distributed = pytest.importorskip("dask.distributed", reason="the 'cluster' extra is part of dev: CI installs it")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, protocol="tcp",
                                  dashboard_address=None) as cluster:
        assert _sweep(tmp_path / "dask", GRID, "--dask", cluster.scheduler_address) == 0
    assert _sweep(tmp_path / "local", GRID, "--jobs", "1") == 0
    a = json.loads((tmp_path / "dask" / "rows.json").read_text())
    assert a == json.loads((tmp_path / "local" / "rows.json").read_text())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--budget=-1,128"], "budget -1"),
        (["--context", ","], "empty value"),
        (["--jobs", "-1"], "--jobs"),
        (["--context", "4096..1024/256"], "range"),
        (["--depth", "0,15"], "depth 15"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                      message: str) -> None:
    assert _sweep(tmp_path, ["--tokens", "1", *args]) == 2
    assert message in _one_line_error(capsys)
    assert not (tmp_path / "rows.json").exists()


def test_empty_grid_and_changed_settings_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="empty"):
        sweep.run_sweep([], tmp_path)
    assert _sweep(tmp_path, ["--context", "4096", "--tokens", "1", "--jobs", "1"]) == 0
    assert _sweep(tmp_path, ["--context", "4096", "--tokens", "1", "--jobs", "1", "--pageable"]) == 2
    assert "another --out" in _one_line_error(capsys)


def test_expand_ranges() -> None:
    assert expand_ranges("1024..4096/1024,65536") == "1024,2048,3072,4096,65536"
    assert expand_ranges("0..1/0.5") == "0,0.5,1"
    assert expand_ranges("0..3") == "0,1,2,3"
    assert expand_ranges("2048:4096,1024") == "2048:4096,1024"  # ':' joins one context per sequence
    for bad in ("1..", "a..b", "4..1/1", "1..4/0", "1..4/x"):
        with pytest.raises(UsageError, match="range"):
            expand_ranges(bad)


def sweep_points(args: list[str]):  # type: ignore[no-untyped-def]
    from kvpipe.cli import build_parser

    ns = build_parser().parse_args(["sweep", *args])
    from kvpipe.commands.sweep import grid_points

    return grid_points(ns)


def test_parallel_sequences_are_part_of_the_grid_coordinates(tmp_path: Path) -> None:
    grid = ["--context", "4096,2048:4096", "--parallel", "2", "--depth", "0,1", "--tokens", "1", "--jobs", "1"]
    assert _sweep(tmp_path / "a", grid) == 0
    rows = json.loads((tmp_path / "a" / "rows.json").read_text())
    assert {r["context"] for r in rows} == {4096}  # same longest context, different sequences: still 4 points
    assert len(rows) == 4 and len({sweep.key_of_row(r) for r in rows}) == 4
    again = sweep.run_sweep(sweep_points(grid), tmp_path / "a", jobs=1, progress=False)
    assert (again.ran, again.resumed) == (0, 4)
    grid = ["--context", "4096", "--parallel", "1,2", "--depth", "0", "--tokens", "1", "--jobs", "1"]
    assert _sweep(tmp_path / "b", grid) == 0
    assert sorted(r["parallel"] for r in json.loads((tmp_path / "b" / "rows.json").read_text())) == [1, 2]


def test_models_x_hardware_grid_matches_simulate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = ["--model", "qwen3.8-27b,llama-3.1-8b", "--hardware", "rtx4070-gen4x16,h200-gen5x16", "--context", "8192",
            "--depth", "0,1", "--tokens", "1"]
    expected = _simulate_json(capsys, grid)  # one token: the fast path simulates it, exact
    assert _sweep(tmp_path, grid, "--jobs", "2") == 0
    got = json.loads((tmp_path / "rows.json").read_text())
    assert max(row_disagreement(a, b) for a, b in zip(got, expected, strict=True)) <= 1e-9
    assert len({sweep.key_of_row(r) for r in got}) == 8 and {r["engine"] for r in got} == {"evaluator"}


def test_dask_missing_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # import fails as if the extra were not installed
    assert _sweep(tmp_path, ["--context", "4096", "--tokens", "1"], "--dask", "tcp://127.0.0.1:8786") == 2
    assert "pip install 'kvpipe[cluster]'" in _one_line_error(capsys)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


@pytest.mark.benchmark
def test_thousand_point_sweep_benchmark(tmp_path: Path) -> None:
    """The issue's benchmark: 1,020 reference points, --jobs 2, the default path (the evaluator and its sample check)
    then --exact (prints wall and CPU, how many points ran and in how many simulations).

    A benchmark: it asserts nothing; the sweep's results are held by the other tests (tests/sim/test_fast_path.py)."""
    import os
    import time

    grid = ["--context", "1024..52224/1024", "--depth", "0..4", "--budget", "0,64,128,256"]
    points = sweep_points(grid)
    walls = {}
    for exact in (False, True):
        t, cpu = time.perf_counter(), os.times()
        res = sweep.run_sweep(points, tmp_path / str(exact), jobs=2, progress=False, exact=exact)
        wall, after = time.perf_counter() - t, os.times()
        used = (after.user + after.children_user + after.system + after.children_system) - (
            cpu.user + cpu.children_user + cpu.system + cpu.children_system)
        walls[exact] = wall
        print(f"{len(points):,} points ({res.ran:,} ran in {res.simulations:,} simulations, {len(res.failed)} failed), "
              f"8 tokens each, --jobs 2{' --exact' if exact else ''}: wall {wall:.1f} s, CPU {used:.1f} s")
    print(f"fast path {walls[True] / walls[False]:.2f}x faster than --exact")


def test_resident_and_ordered_rows_of_one_context_are_two_rows(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import argparse

    from kvpipe.commands.args import add_grid_args, points_from_args
    from kvpipe.sweep import gain_rows, run_sweep

    p = argparse.ArgumentParser()
    add_grid_args(p)
    args = p.parse_args(["--context", "4096", "-nkvo", "0,1", "--depth", "0,1", "--budget", "0", "--tokens", "2"])
    res = run_sweep(points_from_args(args), tmp_path / "sw", jobs=1, progress=False)
    rows = gain_rows(res.rows)
    assert sorted((r["arm"], r["depth"]) for r in rows) == [("resident", 0), ("transport", 0), ("transport", 1)]
    ordered = next(r for r in rows if (r["arm"], r["depth"]) == ("transport", 0))
    piped = next(r for r in rows if r["depth"] == 1)
    assert piped["gain"] == pytest.approx(piped["tokens_per_s"] / ordered["tokens_per_s"] - 1)  # against ordered, not resident
