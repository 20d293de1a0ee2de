"""tools/llamacpp/batched_scatter.py: the call-to-call scatter of llama-batched-bench, its floor, same-call rules."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

LCP = Path(__file__).resolve().parents[2] / "tools" / "llamacpp"
NPL = (1, 2, 4, 8)
MODEL = {1: 50.0, 2: 80.0, 4: 100.0, 8: 120.0}  # a perfect model's t/s per -npl, every configuration


def _tool() -> Any:
    if str(LCP) not in sys.path:
        sys.path.append(str(LCP))
    return __import__("batched_scatter")


def _write(root: Path, run: int, layout: str, pp: int, k: int, tps: dict[int, float]) -> None:
    folder = root / f"run{run}" / "call2"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"pp": pp, "tg": 64, "pl": pl, "n_kv": pl * (pp + 64), "t_tg": 64 * pl / t, "speed_tg": t})
             for pl, t in tps.items()]
    (folder / f"r{run}-batched-{layout}-pp{pp}-r{k}.jsonl").write_text("\n".join(lines) + "\n")


def _scaled(f: float) -> dict[int, float]:
    return {pl: MODEL[pl] * f for pl in NPL}


def test_ratios_to_the_median_and_the_residual_spread(tmp_path: Path) -> None:
    bs = _tool()
    for k, f in ((1, 0.9), (2, 1.0), (3, 1.2)):
        _write(tmp_path, 7, "split", 512, k, _scaled(f))
    _write(tmp_path, 7, "unified", 512, 1, _scaled(1.0))  # one call: left out
    calls = bs.load_calls(tmp_path, [7])
    groups = bs.by_config(calls)
    assert len(calls) == 4 and list(groups) == [(7, "split", 512)]
    ratio = bs.ratios_to_median(groups, list(NPL))
    assert ratio[4] == pytest.approx([-0.1, 0.0, 0.2])
    pool = bs.residuals(groups, list(NPL))
    logs = [math.log(f) for f in (0.9, 1.0, 1.2)]
    mean = sum(logs) / 3
    assert [v[0] for v in pool] == pytest.approx([(x - mean) * math.sqrt(1.5) for x in logs])
    # every row of a call moves with it: correlation 1, and dividing out its -npl 1 row leaves nothing
    for t in bs.together(pool, list(NPL)):
        assert t["corr"] == pytest.approx(1.0) and t["rms_same_call"] == pytest.approx(0.0, abs=1e-12)


def test_the_floor_is_zero_without_scatter_and_the_scatter_itself_with_one_call() -> None:
    bs = _tool()
    quiet = bs.floor([(0.0,) * 4], 3, 4, 50, 1)
    assert quiet["median_abs"] == 0.0 and quiet["max_abs"] == 0.0 and quiet["met_share"] == 1.0
    d = math.log(1.08)
    one = bs.floor([(d,) * 4, (-d,) * 4], 1, 4, 200, 1)  # every row |exp(-/+d) - 1|: 7.4% or 8.0%
    assert 1 - 1 / 1.08 - 1e-12 <= one["median_abs"] <= 0.08 + 1e-12 and one["max_abs"] <= 0.08 + 1e-12
    assert one["met_share"] == 0.0  # every row above 5%
    # two calls: an opposite pair averages out exactly, a like pair does not; so in between
    assert 0.0 < bs.floor([(d,) * 4, (-d,) * 4], 2, 4, 200, 1)["median_abs"] < one["median_abs"]


@pytest.mark.parametrize("stat", ["median", "mean"])
def test_a_call_slower_by_a_fifth_makes_a_perfect_model_25_percent_fast(stat: str) -> None:
    f = _tool().floor([(math.log(0.8),) * 4], 3, 2, 5, 1, stat)  # measured = 0.8 x truth: predicted / measured - 1
    assert f["median_abs"] == pytest.approx(0.25) and f["max_abs"] == pytest.approx(0.25) and f["met_share"] == 0.0


def test_the_geometric_mean_of_an_opposite_pair_is_exact_where_the_median_of_three_is_not() -> None:
    bs = _tool()
    d = math.log(1.2)
    pool = [(d,) * 4, (-d,) * 4]
    # mean of 2: a like pair (half the draws) errs by ~20%, an opposite pair by 0 -- never in between
    two = bs.floor(pool, 2, 1, 400, 3, "mean")
    assert 0.3 < two["met_share"] < 0.7
    three = bs.floor(pool, 3, 1, 400, 3, "median")  # the median of three is always one of the calls: never 0
    assert three["met_share"] == 0.0 and three["median_abs"] >= 1 - 1 / 1.2 - 1e-12


def test_same_call_normalisation_removes_a_calls_own_factor(tmp_path: Path) -> None:
    bs = _tool()
    for k, f in ((1, 0.8), (2, 1.25)):  # two calls of one configuration, each off the model by its own factor
        _write(tmp_path, 8, "split", 640, k, _scaled(f))
    cal = [{"sequences": pl, "unified": False, "measured_tps": MODEL[pl] * f, "fitted_tps": MODEL[pl]}
           for f in (0.8, 1.25) for pl in NPL]  # calibration calls in rounds 1 and 2, as slow / fast as the held-out
    pred = {"fit_from": "llama-batched-bench x/r8-batched-split-pp512-r1.jsonl, x/r8-batched-split-pp512-r2.jsonl (kvpipe ...)",
            "calibration": cal,
            "held_out": [{"layout": "split", "pp": 640, "pl": pl, "predicted_tps": MODEL[pl] * 0.95} for pl in NPL]}
    calls = bs.load_calls(tmp_path, [8])
    rows = bs.same_call(calls, pred)
    assert [r["pl"] for r in rows] == [2, 4, 8]
    measured = (0.8 + 1.25) / 2
    for r in rows:
        assert r["cross_error"] == pytest.approx(0.95 / measured - 1)
        assert r["cross_call_errors"] == pytest.approx([0.95 / 0.8 - 1, 0.95 / 1.25 - 1])
        assert r["same_call_errors"] == pytest.approx([0.0, 0.0]) and r["same_error"] == pytest.approx(0.0)
        assert r["fixed_error"] == pytest.approx(0.0)  # the calibration calls' ratios are the model's: no correction
    assert bs.round_factors(pred) == {1: pytest.approx(0.8), 2: pytest.approx(1.25)}
    # each held-out call scaled by its round's factor: what is left is the model's own -5%, on every row
    assert [r["round_error"] for r in bs.round_rule(calls, pred)] == pytest.approx([-0.05] * 4)
    pred["fit_from"] = "llama-batched-bench x/r8-batched-split-pp512-r1.jsonl, x/r8-batched-split-pp512-r1.jsonl"
    with pytest.raises(SystemExit, match="round 2"):
        bs.round_rule(calls, pred)


def test_the_ratio_correction_reads_each_calibration_call_against_its_own_first_row() -> None:
    bs = _tool()
    cal = []
    for f in (1.0, 0.5):  # two calls; each runs its -npl 2 row 10% faster, relative to -npl 1, than the fit
        cal += [{"sequences": pl, "unified": True, "measured_tps": MODEL[pl] * f * (1.1 if pl == 2 else 1.0),
                 "fitted_tps": MODEL[pl]} for pl in NPL]
    fix = bs.ratio_correction({"calibration": cal})
    assert fix[("unified", 2)] == pytest.approx(1.1) and fix[("unified", 8)] == pytest.approx(1.0)


@pytest.mark.parametrize(("argv", "message"), [(["--calls", "0,2"], "--calls '0,2'"), (["--draws", "0"], "--draws 0"),
                                               (["--runs", "x"], "--runs 'x'"), (["--root", "/nonexistent"], "--root")])
def test_bad_arguments_get_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _tool().main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_call_cut_short_is_left_out_by_name_and_the_rows_of_whole_calls_stay(tmp_path: Path, capsys: Any) -> None:
    bs = _tool()
    for k, f in ((1, 0.9), (2, 1.1)):
        _write(tmp_path, 13, "unified", 1280, k, _scaled(f))
    _write(tmp_path, 13, "unified", 1280, 3, {1: 40.0, 2: 60.0})  # stopped after its -npl 2 row
    calls = bs.load_calls(tmp_path, [13])
    assert sorted(c.repeat for c in calls) == [1, 2]
    assert bs.npls(calls) == list(NPL)
    assert "unified -npp 1280 -r3 left out: cut short, no -npl 4,8 row" in capsys.readouterr().err
