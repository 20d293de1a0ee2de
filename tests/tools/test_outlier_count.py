"""tools/llamacpp/outlier_count.py: the call-rows the outlier rule leaves out, per run (issue 28, run 13's design)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.llamacpp.outlier_count import left_out, main


def _call(root: Path, run: int, layout: str, pp: int, k: int, tps: dict[int, float]) -> None:
    d = root / f"run{run}" / "call1"
    d.mkdir(parents=True, exist_ok=True)
    rows = [{"pp": pp, "tg": 64, "pl": pl, "n_kv": pl * (pp + 64), "t_tg": 64 * pl / t, "speed_tg": t} for pl, t in tps.items()]
    (d / f"r{run}-batched-{layout}-pp{pp}-r{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_only_the_call_rows_outside_their_configurations_spread_are_counted(tmp_path: Path) -> None:
    """Four calls of one configuration, the last 40% slow at one sequence only: that call-row alone is left out; the
    same t/s in another configuration (another -npp) is held to its own calls and kept."""
    for k, (one, two) in enumerate([(100.0, 150.0), (104.0, 155.0), (96.0, 148.0), (60.0, 151.0)], start=1):
        _call(tmp_path, 12, "split", 512, k, {1: one, 2: two})
        _call(tmp_path, 12, "split", 800, k, {1: 60.0 + k, 2: 90.0})
    n, out = left_out(tmp_path, 12, 0.25)
    assert n == 16 and out == [("split", 512, 1, 4, 60.0)]
    assert left_out(tmp_path, 12, 0.45) == (16, [])  # 40% slow is inside a spread of 0.45


@pytest.mark.parametrize("argv, named", [(["--runs", "9,x"], "'9,x'"), (["--spread", "1.5"], "1.5"), (["--runs", "3"], "run 3")])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                          named: str) -> None:
    _call(tmp_path, 12, "split", 512, 1, {1: 100.0})
    assert main(["--root", str(tmp_path), "--runs", "12", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and named in err
