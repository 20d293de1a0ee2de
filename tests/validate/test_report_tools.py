"""``python -m validate.report``: redraw a committed report's plots, compare runs, refuse what is not a report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from validate.report import compare, main

# run 3: the last 48-point report in the format before cache-type keys
H200 = Path(__file__).resolve().parents[2] / "validate" / "results" / "h200" / "run3"


def _doc(tps: float, pred: float) -> dict:
    return {"points": [{"model": "m", "context": 4096, "depth": 1, "budget_mib": 0.0, "measured_tps": tps, "predicted_tps": pred}]}


def test_compare_puts_each_run_beside_the_others_with_the_spread() -> None:
    table = compare([_doc(10.0, 11.0), _doc(15.0, 11.0)])
    row = [line for line in table.splitlines() if line.startswith("| m |")]
    assert row == ["| m | 4,096 | 1 | 0 | 10.00 / 11.00 | 15.00 / 11.00 | 1.50x |"]


def test_replot_redraws_the_committed_h200_report(tmp_path: Path) -> None:
    src = H200 / "report" / "report.json"
    doc = json.loads(src.read_text())
    assert doc["summary"]["exactness_gate"] is True and len(doc["points"]) == 48
    shutil.copy(src, tmp_path / "report.json")
    assert main([str(tmp_path)]) == 0
    for name in ("measured_vs_predicted.png", "gain_vs_depth.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_folder_without_a_report_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read a report" in err


def test_validate_keeps_parallel_sequences_apart_and_counts_every_sequence_s_tokens(tmp_path: Path) -> None:
    from kvpipe.cli import main as kvpipe

    hw = str(H200 / "calibrated.json")
    rc = kvpipe(["validate", "--machine", "simpy", "--hardware", hw, "--model", "llama-3.1-8b", "--context", "256",
                 "--parallel", "1,2", "--no-kv-unified", "--depth", "0,1", "--tokens", "2", "--reps", "1", "--scale", "0.02",
                 "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / "report.json").read_text())
    groups = {(g["parallel"], g["unified"]): g for g in doc["exactness"]["groups"]}
    assert set(groups) == {(1, False), (2, False)} and groups[(1, False)]["output_hash"] != groups[(2, False)]["output_hash"]
    pts = {(p["parallel"], p["depth"]): p for p in doc["points"]}
    for depth in (0, 1):
        one, two = pts[(1, depth)], pts[(2, depth)]
        # two sequences decode two tokens a graph: the measured and predicted t/s both count them
        assert two["measured_tps"] == pytest.approx(two["telemetry"]["tokens_per_s"], rel=1e-9)  # the median run's own row
        assert 1.5 < two["predicted_tps"] / one["predicted_tps"] < 2.5
        assert 1.5 < two["measured_tps"] / one["measured_tps"] < 2.5
    assert "x2 split" in (tmp_path / "report.md").read_text()


def test_host_launch_table_holds_each_traced_arm_s_split_launches_to_the_calibration(tmp_path: Path,
                                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cal = json.loads((H200 / "calibrated.json").read_text())
    cal_us = cal["workloads"]["llama-3.1-8b"]["host_launch_us_mean"]
    split = {"work": "gpu split"}
    trace = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "llama-3.1-8b ctx=4096 depth=1 budget=0 (cupy)"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "host"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "consumer0"}},
        {"ph": "X", "pid": 0, "tid": 0, "name": "launch gpu_attn_l0", "cat": "launch", "args": split, "ts": 0, "dur": cal_us},
        {"ph": "X", "pid": 0, "tid": 0, "name": "launch gpu_attn_l1", "cat": "launch", "args": split, "ts": 0, "dur": 3 * cal_us},
        {"ph": "X", "pid": 0, "tid": 0, "name": "sync consumer0", "cat": "sync", "ts": 0, "dur": 99999.0},  # not a launch
        {"ph": "X", "pid": 0, "tid": 0, "name": "launch gpu_x", "cat": "launch", "args": {"work": "other"}, "ts": 0,
         "dur": 99999.0},  # a launch, not of a split: the kind decides, not the name
        {"ph": "X", "pid": 0, "tid": 1, "name": "launch gpu_attn_l2", "cat": "launch", "args": split, "ts": 0,
         "dur": 99999.0},  # not the host
    ]}
    import gzip

    (tmp_path / "t.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    assert main(["--host-launch", str(H200 / "calibrated.json"), str(tmp_path / "t.json.gz")]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| llama")]
    assert len(row) == 1 and row[0].split("|")[2].strip() == "2" and row[0].split("|")[5].strip() == "2.00"


def test_each_delivery_schedule_gets_its_own_named_line_from_depth_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    from validate.report_tools import plots

    figs = []
    monkeypatch.setattr(plt, "close", figs.append)  # keep the figures the function draws instead of closing them

    def pt(depth: int, tps: float, schedule: str | None = None) -> dict:  # type: ignore[type-arg]
        p = {"model": "m", "cache_type": "q8_0", "hardware": "h", "context": 4096, "budget_mib": 0.0, "depth": depth,
             "arm": "transport", "measured_tps": tps, "measured_tps_min": tps, "measured_tps_max": tps, "predicted_tps": tps}
        return p | ({"schedule": schedule} if schedule else {})

    plots([pt(0, 10.0), pt(1, 15.0), pt(1, 19.0, "fresh"), pt(2, 20.0, "fresh")], tmp_path)
    gain = figs[1].axes[0]  # gain_vs_depth: one panel for the one model
    lines = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in gain.get_lines()}
    ref, fresh = lines["4,096, uncapped measured"], lines["4,096, uncapped, fresh measured"]
    assert ref[0] == [0, 1] and ref[1] == pytest.approx([0.0, 50.0])
    assert fresh[0] == [0, 1, 2] and fresh[1] == pytest.approx([0.0, 90.0, 100.0])  # from the ordered depth 0
