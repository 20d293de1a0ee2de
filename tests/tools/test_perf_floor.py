"""tools/perf_floor.py (issue 26's CPU by part, docs/performance.md): its timing wrappers change no answer, are put
back, and split the CPU into parts that fit in the total; its bad input. The full measurement is a benchmark, not
run here."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import kvpipe.sweep_work as sweep_work
import sim.evaluator as evaluator
from sim.evaluator.check import IGNORED

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "perf_floor.py"
_spec = importlib.util.spec_from_file_location("perf_floor", SCRIPT)
floor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(floor)

GRID = {"contexts": ((2048,), (4096,), (8192,)), "depths": (0, 1, 2), "budgets_mib": (0.0, 16.0), "tokens": 3}


def test_the_plans_parts_fit_in_its_total_and_its_text_is_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    before = (evaluator.summarize, sweep_work._sample_rows)
    spent, text = floor.plan_breakdown((4096, 16384, 32768), 3, (64.0,))
    assert (evaluator.summarize, sweep_work._sample_rows) == before  # the wrappers put back
    assert spent[floor.CHECK_SIMS] > 0 and spent["the evaluator's figures (grid, memory plan)"] > 0
    assert sum(v for k, v in spent.items() if k != "total") <= spent["total"]
    from kvpipe.cli import main

    assert main(["plan", "--context", "4096,16384,32768", "--max-depth", "3", "--budget", "64", "--jobs", "1"]) == 0
    assert capsys.readouterr().out == text + "\n"
    shown = floor.table("t", spent, 2)
    assert f"| **total** | **{spent['total']:.3f}** | |" in shown and f"{spent['total'] / 2:.3f}" in shown


def test_the_sweeps_rows_are_the_unwrapped_sweeps() -> None:
    from kvpipe.sweep import run_sweep
    from sim.points import GridSpec, points

    spent, rows = floor.sweep_breakdown(grid=GRID)
    want = run_sweep(points(GridSpec(**GRID)), jobs=1, progress=False).rows
    assert [{k: v for k, v in r.items() if k not in IGNORED} for r in rows] == \
           [{k: v for k, v in r.items() if k not in IGNORED} for r in want]
    assert spent["the evaluator's rows"] > 0 and spent[floor.CHECK_SIMS] > 0
    assert sum(v for k, v in spent.items() if k != "total") <= spent["total"]


@pytest.mark.parametrize("args,named", [(["--cores", "0"], "--cores 0"), (["--bogus"], "--bogus")])
def test_bad_input_is_one_line_exit_2(args: list[str], named: str) -> None:
    got = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True)
    assert got.returncode == 2 and got.stdout == ""
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("perf_floor: ") and named in lines[0]
