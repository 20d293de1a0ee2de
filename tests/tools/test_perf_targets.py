"""tools/perf_targets.py (issue 26's speed targets, docs/performance.md): the row comparison it prints beside each
sweep pair, and its bad input. The measurements themselves take minutes and are timings, not tests: not run here."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "perf_targets.py"
_spec = importlib.util.spec_from_file_location("perf_targets", SCRIPT)
perf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(perf)

ROW = {"context": 4096, "depth": 1, "ms_per_token": 20.0, "declined": False, "decline_reason": "",
       "breakdown_ms": {"total": 20.0, "waiting_for_consumer": 5.0}, "tokens_per_s_interval": [49.0, 51.0],
       "engine": "evaluator", "tokens_simulated": 0}


def _with(**kw: object) -> dict:
    return {**ROW, **kw}


def test_equal_rows_agree_and_how_a_row_was_answered_is_left_out() -> None:
    other = _with(engine="simulator", tokens_simulated=8)
    assert perf.disagreement([ROW, ROW], [ROW, other]) == 0.0


def test_a_number_is_compared_relative_to_the_larger_side_nested_fields_too() -> None:
    assert perf.disagreement([ROW], [_with(ms_per_token=20.0 * (1 + 1e-10))]) == pytest.approx(1e-10, rel=1e-3)
    nested = _with(breakdown_ms={"total": 20.0, "waiting_for_consumer": 5.5})
    assert perf.disagreement([ROW], [nested]) == pytest.approx(0.5 / 5.5)
    assert perf.disagreement([ROW], [_with(tokens_per_s_interval=[49.0, 51.051])]) == pytest.approx(0.051 / 51.051)


@pytest.mark.parametrize("other", [
    _with(declined=True), _with(decline_reason="ring"), _with(depth=None),
    _with(breakdown_ms={"total": 20.0}), _with(tokens_per_s_interval=[49.0]),
])
def test_a_flag_text_or_shape_that_differs_is_infinite(other: dict) -> None:
    assert math.isinf(perf.disagreement([ROW], [other]))


def test_different_points_are_infinite() -> None:
    assert math.isinf(perf.disagreement([ROW], [ROW, ROW]))
    assert math.isinf(perf.disagreement([ROW], [{**ROW, "extra": 1}]))


@pytest.mark.parametrize("args,named", [(["--repeats", "0"], "--repeats 0"), (["--only", "bench"], "bench")])
def test_bad_input_is_one_line_exit_2(args: list[str], named: str) -> None:
    got = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True)
    assert got.returncode == 2 and got.stdout == ""
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("perf_targets: ") and named in lines[0]
