"""Run 6 of issues 30 and 28 (tools/llamacpp/README-run6.md): the design the script runs, and the committed held-out
predictions being the blind ones (made before any held-out file was read)."""

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


def _types6() -> Any:
    if str(LCP) not in sys.path:
        sys.path.append(str(LCP))
    import predict_types6

    return predict_types6


def test_the_held_out_design_is_each_process_depths_less_its_calibration_ones(tmp_path: Path) -> None:
    script = tmp_path / "run6.sh"
    script.write_text('R6_TYPES=("f16 f16 f16 640,1152,3072 640,3072 12800,8192 8192"\n'
                      '          "mixed q8_0 q4_0 1024,2816 1024 8192,28672 8192")\n')
    assert _types6().design(script) == (("f16", "f16", 1, 1152), ("f16", "f16", 0, 12800), ("q8_0", "q4_0", 1, 2816),
                                        ("q8_0", "q4_0", 0, 28672))
    real = _types6().DESIGN  # the script as it ran: every type and the pair at both arms, two held-out depths each
    assert len(real) == 16 and {(k, v) for k, v, _, _ in real} == {("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0")}
    assert all(sum(1 for r in real if r[:3] == (k, v, n)) == 2 for k, v, n, _ in real)


def test_no_held_out_depth_or_prompt_was_used_by_an_earlier_run() -> None:
    earlier: set[int] = set()
    prompts: set[int] = set()
    for run in ("run1", "run2", "run3", "run4", "run5"):
        for f in (RESULTS / run).rglob("commands.txt"):
            text = f.read_text()
            for d in re.findall(r" -d (\S+)", text):
                earlier |= {int(x) for x in d.split(",") if x.isdigit()}
            prompts |= {int(x) for x in re.findall(r" -npp (\d+)", text)}
    held = {d for _, _, _, d in _types6().DESIGN}
    assert earlier and prompts and not held & earlier
    pp_held = re.search(r'LCP_R6_PP_HELD:-(\d+)', (LCP / "run6.sh").read_text())
    assert pp_held is not None and pp_held.group(1) == "896" and 896 not in prompts


@pytest.mark.parametrize("folder", ["prediction-types6"])
def test_the_committed_held_out_predictions_are_the_blind_ones(folder: str) -> None:
    path = RESULTS / folder
    if not (path / "prediction.json").exists():
        pytest.skip("run 6 not compared yet")
    blind = {(r["cache"], r["nkvo"], r["depth"]): r["predicted_tps"] for r in json.loads((path / "blind.json").read_text())["rows"]}
    rows = json.loads((path / "prediction.json").read_text())["rows"]
    for role in ("held out", "second machine"):
        got = {(r["cache"], r["nkvo"], r["depth"]): r["predicted_tps"] for r in rows if r["role"] == role}
        assert got.keys() == blind.keys() and len(got) == 16, role
        assert all(got[k] == pytest.approx(blind[k], rel=1e-9) for k in got), role
