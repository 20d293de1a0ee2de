"""sim.rows: one gain rule for every table and sweep, whatever order the grid lists its arms in."""

from __future__ import annotations

import pytest

from kvpipe.cli import main
from kvpipe.sweep import gain_rows
from sim.rows import gains, key_of_row


def _row(depth: int, tps: float, arm: str = "transport", budget: float = 0.0, context: int = 16384) -> dict:  # type: ignore[type-arg]
    return {"model": "m", "hardware": "h", "cache_type": "q8_0", "context": context, "contexts": [context], "parallel": 1,
            "unified": True, "split_mode": "none", "depth": depth, "budget_mib": budget, "tokens": 4, "arm": arm,
            "tokens_per_s": tps}


def test_every_arm_is_measured_against_the_ordered_transport_row_in_any_order() -> None:
    rows = [_row(0, 40.0, "resident"), _row(1, 30.0), _row(0, 20.0), _row(1, 10.0, budget=64.0), _row(0, 99.0, context=1)]
    got = gains(rows)
    assert got == [pytest.approx(1.0), pytest.approx(0.5), 0.0, pytest.approx(-0.5), 0.0]
    assert gains(list(reversed(rows))) == list(reversed(got))
    assert [r["gain"] for r in gain_rows(rows)] == got  # the sweep's rows take the same rule


def test_a_grid_without_an_ordered_transport_row_uses_its_own_arm_and_none_without_any() -> None:
    assert gains([_row(0, 8.0, "host-attention"), _row(0, 16.0, "resident")]) == [0.0, 0.0]
    assert gains([_row(1, 8.0)]) == [None]


def test_old_rows_without_the_newer_key_fields_read_as_their_defaults() -> None:
    r = _row(1, 1.0)
    del r["arm"]
    assert key_of_row(r) == key_of_row({**r, "arm": "transport", "cache_type_v": "q8_0", "kv_gpu_layers": 0})


def test_simulate_prints_the_same_gains_whichever_nkvo_comes_first(capsys: pytest.CaptureFixture[str]) -> None:
    tables = []
    for order in ("1,0", "0,1"):
        assert main(["simulate", "-d", "16384", "--depth", "0,1", "--budget", "0", "--tokens", "2", "-nkvo", order]) == 0
        lines = capsys.readouterr().out.splitlines()[2:]
        tables.append(sorted(" ".join(line.split()[5:12]) for line in lines))
    assert tables[0] == tables[1]
    assert any("+0.0%" in line for line in tables[0]) and not any(" -" in line.split("%")[0][-8:] for line in tables[0])
