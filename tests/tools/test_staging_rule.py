"""Run 8's staging rule (tools/llamacpp/staging_rule.py): the candidates, leave-one-configuration-out and the choice."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

LCP = Path(__file__).resolve().parents[2] / "tools" / "llamacpp"


def _rule() -> Any:
    if str(LCP) not in sys.path:
        sys.path.append(str(LCP))
    return __import__("staging_rule")


def _tps(p: Any, g: float) -> float:  # a step: 10 ms of compute plus a copy of 100 MB at g GB/s
    return 1.0 / (0.010 + 0.1 / g)


def _procs(rate: Any) -> list[Any]:
    """Two configurations per type, two processes each (at hours 0.0-0.3 and 0.7-1.0), measured at ``rate(kind, t)``."""
    sr = _rule()
    out = []
    for i, kind in enumerate(("f16", "q8_0")):
        for j, depth in enumerate((1024, 4096)):
            for t in (0.1 * (2 * i + j), 1.0 - 0.1 * (2 * i + j)):
                g = rate(kind, t)
                out.append(sr.Process(f"{kind}@{depth}", kind, t, _tps(None, g), g))
    return out


def test_a_rate_per_type_is_chosen_when_the_types_differ_and_time_does_not() -> None:
    sr = _rule()
    procs = _procs(lambda kind, t: 6.0 if kind == "f16" else 9.0)
    score = sr.scores(sr.leave_one_out(procs, _tps))
    assert score["per type"] == pytest.approx(0.0, abs=1e-20) and score["flat"] > 1e-3
    assert sr.choose(score) == "per type"
    assert sr.fit("per type", procs)(procs[0]) == pytest.approx(6.0)


def test_a_drift_in_time_is_chosen_over_the_types_when_time_is_what_moved() -> None:
    sr = _rule()
    procs = _procs(lambda kind, t: 9.0 * (0.8 ** t))  # every type stages 20% slower an hour later
    score = sr.scores(sr.leave_one_out(procs, _tps))
    assert sr.choose(score) == "time drift" and score["time drift"] == pytest.approx(0.0, abs=1e-20)
    late = sr.Process("x", "q4_0", 2.0, 1.0)
    assert sr.fit("time drift", procs)(late) == pytest.approx(9.0 * 0.64)


def test_flat_is_kept_unless_another_candidate_wins_by_the_margin() -> None:
    sr = _rule()
    assert sr.choose({"flat": 1.0, "per type": 0.76, "time drift": 0.9}) == "flat"
    assert sr.choose({"flat": 1.0, "per type": 0.75, "time drift": 0.5}) == "time drift"
    same = _procs(lambda kind, t: 7.0)
    assert sr.choose(sr.scores(sr.leave_one_out(same, _tps))) == "flat"


def test_a_configuration_is_the_median_of_its_processes_and_unknown_inputs_are_refused() -> None:
    sr = _rule()
    a, b = sr.Process("c", "f16", 0.0, 10.0, 5.0), sr.Process("c", "f16", 1.0, 12.0, 6.0)
    pred, err = sr.config_error(lambda p: 5.0, [a, b], lambda p, g: 2.0 * g)
    assert pred == 10.0 and err == pytest.approx(10.0 / 11.0 - 1)
    with pytest.raises(ValueError, match="allowed"):
        sr.fit("per depth", [a, b])
    with pytest.raises(ValueError, match="two starts"):
        sr.fit("time drift", [a, sr.Process("d", "f16", 0.0, 1.0, 5.0)])
    with pytest.raises(ValueError, match="q4_0"):
        sr.fit("per type", [a, b])(sr.Process("e", "q4_0", 0.0, 1.0))
