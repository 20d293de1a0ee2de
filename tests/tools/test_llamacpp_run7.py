"""Run 7 of issues 30 and 28 (tools/llamacpp/README-run7.md): the design the script runs (every ordered configuration
in its own process, calibration and held-out processes alternating), held-out depths and contexts no earlier run used,
the committed held-out predictions being the blind ones, and the report writer runs 5-7 share."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
LCP = ROOT / "tools" / "llamacpp"
RESULTS = ROOT / "validate" / "results" / "h200-llamacpp"


def _mod(name: str) -> Any:
    if str(LCP) not in sys.path:
        sys.path.append(str(LCP))
    return __import__(name)


def test_the_held_out_design_is_the_held_processes_and_each_resident_list_less_its_calibration(tmp_path: Path) -> None:
    script = tmp_path / "run7.sh"
    script.write_text('R7_ORD=("f16 f16 f16 640 cal" "f16 f16 f16 1408 held" "mixed q8_0 q4_0 2176 held")\n'
                      'R7_RES=("f16 f16 f16 7168,8192 8192"\n        "mixed q8_0 q4_0 8192,22528 8192")\n')
    assert _mod("predict_types7").design(script) == (("f16", "f16", 1, 1408), ("q8_0", "q4_0", 1, 2176),
                                                     ("f16", "f16", 0, 7168), ("q8_0", "q4_0", 0, 22528))


def test_the_script_alternates_calibration_and_held_out_processes_one_depth_each() -> None:
    p7 = _mod("predict_types7")
    rows = p7._ordered(p7.SCRIPT)
    assert [r[4] for r in rows] == ["cal", "held"] * 8  # in run order: every held-out process between calibration ones
    assert len({(r[0], r[3]) for r in rows}) == 16
    real = p7.DESIGN
    assert len(real) == 16 and all(sum(1 for r in real if r[:3] == (k, v, n)) == 2 for k, v, n, _ in real)
    # each ordered held-out depth lies inside its type's calibrated depths (so inside its calibrated copy sizes)
    for name in p7.NAMES:
        cal = [r[3] for r in rows if r[0] == name and r[4] == "cal"]
        assert all(min(cal) < r[3] < max(cal) for r in rows if r[0] == name and r[4] == "held")


def test_no_held_out_depth_or_prompt_was_used_by_an_earlier_run() -> None:
    earlier: set[int] = set()
    prompts: set[int] = set()
    for run in ("run1", "run2", "run3", "run4", "run5", "run6"):
        for f in (RESULTS / run).rglob("commands.txt"):
            text = f.read_text()
            for d in re.findall(r" -d (\S+)", text):
                earlier |= {int(x) for x in d.split(",") if x.isdigit()}
            prompts |= {int(x) for x in re.findall(r" -npp (\d+)", text)}
    held = {d for _, _, _, d in _mod("predict_types7").DESIGN}
    assert earlier and prompts and not held & earlier
    pp_held = re.search(r'LCP_R7_PP_HELD:-([\d ]+)\}', (LCP / "run7.sh").read_text())
    assert pp_held is not None and pp_held.group(1).split() == ["768", "1152"] and not {768, 1152} & prompts


def test_the_committed_held_out_predictions_are_the_blind_ones() -> None:
    path = RESULTS / "prediction-types7"
    if not (path / "prediction.json").exists():
        pytest.skip("run 7 not compared yet")
    blind = {(r["cache"], r["nkvo"], r["depth"]): r["predicted_tps"] for r in json.loads((path / "blind.json").read_text())["rows"]}
    rows = json.loads((path / "prediction.json").read_text())["rows"]
    held = {(r["cache"], r["nkvo"], r["depth"]): r["predicted_tps"] for r in rows if r["role"] == "held out"}
    assert held.keys() == blind.keys() and len(held) == 16
    fresh = {(r["cache"], r["nkvo"], r["depth"]): r["predicted_tps"] for r in rows if r["role"] == "second machine"}
    assert fresh and fresh.keys() <= blind.keys()
    for got in (held, fresh):
        assert all(got[k] == pytest.approx(blind[k], rel=1e-9) for k in got)


def _row(cache: str, nkvo: int, err: float, role: str) -> dict[str, Any]:
    return {"cache": cache, "nkvo": nkvo, "depth": 1024, "role": role, "measured_tps": 10.0, "stddev_tps": 0.1,
            "predicted_tps": 10.0 * (1 + err), "band": 0.1, "entry": "m@q8_0", "error": err}


def test_the_report_writer_summarises_the_held_out_and_the_second_machine_apart(tmp_path: Path, capsys: Any) -> None:
    pt = _mod("predict_types")
    cal, held = [_row("q8_0", 1, 0.01, "calibration")], [_row("q8_0", 1, 0.02, "held out"), _row("f16", 0, -0.12, "held out")]
    assert pt.write_report(tmp_path, "typesX", "m.gguf", "kvpipe calibrate", "log", ["a.json"], "median", (cal, held, []),
                           "run 9", "run9/fresh") == 0
    report = json.loads((tmp_path / "prediction.json").read_text())
    assert report["command"] == "python tools/llamacpp/predict.py --set typesX --gguf m.gguf"
    assert report["summary"]["every run"]["runs"] == 2 and report["summary"]["every run"]["max_error"] == -0.12
    assert not report["summary"]["every run"]["met"] and report["summary_second_machine"] == "not run"
    md = (tmp_path / "prediction.md").read_text()
    assert "| held out (run 9) |" in md and "held out (run 4)" not in md and md.endswith("Second machine: not run.\n")
    pt.write_report(tmp_path, "typesX", "m.gguf", "c", "log", [], "median", (cal, held, [_row("q8_0", 1, 0.2, "second machine")]),
                    "run 9", "run9/fresh")
    md = (tmp_path / "prediction.md").read_text()
    assert "| second machine (run9/fresh, nothing fitted) |" in md and "+20.0%" in md
    assert "log" in capsys.readouterr().out
