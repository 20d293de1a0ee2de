"""Run 9 of issue 28 (tools/llamacpp/README-run9.md): six rounds of llama-batched-bench, odd rounds ascending -npp and
even rounds the reverse, held-out calls hidden, held-out -npp no earlier run used; h200_bench.sh's batched_rounds still
runs runs 6-8's calls in their order."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import alternating_rounds, assert_held_out_hidden, bench_dry_run

ROOT = Path(__file__).resolve().parents[2]
LCP = ROOT / "tools" / "llamacpp"
RESULTS = ROOT / "validate" / "results" / "h200-llamacpp"
SCRIPT = (LCP / "run9.sh").read_text()


def _dry_run(tmp_path: Path, phase: str, env_extra: dict[str, str] | None = None) -> tuple[list[str], str]:
    """The call names a phase runs, in order (stub binaries), and the summary it wrote."""
    summary, _ = bench_dry_run(tmp_path, phase, env_extra)
    return re.findall(r"\] (r\d-batched-\S+): rc=", summary), summary


def test_six_rounds_odd_ascending_even_reversed_held_out_hidden(tmp_path: Path) -> None:
    names, summary = _dry_run(tmp_path, "run9")
    assert names == alternating_rounds("r9", (512, 832, 1216, 1280)) and len(names) == 48
    assert_held_out_hidden(names, summary, (832, 1216))
    commands = (next((tmp_path / "lcp").glob("out-run9-*")) / "commands.txt").read_text()
    assert " -npp 832 -ntg 64 -npl 1,2,4,8 " in commands and " -c 7424 " in commands  # 8 x (832 + 64) + 256
    assert commands.count(" -kvu") == 24


def test_a_warm_follow_up_call_repeats_no_finished_call(tmp_path: Path) -> None:
    first, _ = _dry_run(tmp_path, "run9", {"LCP_R9_ROUNDS": "2"})
    again, summary = _dry_run(tmp_path, "run9b", {"LCP_R9_ROUNDS": "3"})
    assert len(first) == 16 and again == [n for n in again if n.endswith("-r3")] and len(again) == 8
    assert summary.count("done in an earlier call") == 16


@pytest.mark.parametrize("phase, pps", [("run6", (512, 896, 1280)), ("run7", (512, 768, 1152, 1280)),
                                        ("run8", (512, 640, 1088, 1280))])
def test_runs_6_to_8_keep_their_three_rounds_in_one_order(tmp_path: Path, phase: str, pps: tuple[int, ...]) -> None:
    names, _ = _dry_run(tmp_path, phase, {"LCP_R6_PP_HELD": "896"})
    tag = phase.replace("run", "r")
    assert names == [f"{tag}-batched-{kvu}-pp{pp}-r{k}" for k in (1, 2, 3) for pp in pps for kvu in ("split", "unified")]


def test_no_held_out_prompt_was_used_by_an_earlier_run() -> None:
    prompts: set[int] = set()
    for run in ("run1", "run2", "run3", "run4", "run5", "run6", "run7", "run8"):
        for f in (RESULTS / run).rglob("commands.txt"):
            prompts |= {int(x) for x in re.findall(r" -npp (\d+)", f.read_text())}
    held = re.search(r'LCP_R9_PP_HELD:-([\d ]+)\}', SCRIPT)
    cal = re.search(r'LCP_R9_PP:-([\d ]+)\}', SCRIPT)
    assert held is not None and cal is not None and {512, 1280, 640, 1088} <= prompts
    assert held.group(1).split() == ["832", "1216"] and not {832, 1216} & prompts
    assert cal.group(1).split() == ["512", "832", "1216", "1280"]  # every held-out -npp between the calibration ones
    assert re.search(r'LCP_R9_ROUNDS:-6\}', SCRIPT)


def test_the_committed_comparison_is_the_blind_prediction_against_six_complete_rounds(tmp_path: Path) -> None:
    import json
    import math
    import shutil
    import sys

    path = RESULTS / "prediction-batched9"
    pred = {(r["layout"], r["pp"], r["pl"]): r["predicted_tps"] for r in json.loads((path / "prediction.json").read_text())["held_out"]}
    committed = json.loads((path / "comparison.json").read_text())
    assert {(r["layout"], r["pp"], r["pl"]): r["predicted_tps"] for r in committed["rows"]} == pred and len(pred) == 16
    assert committed["complete_rounds"] == [1, 2, 3, 4, 5, 6]
    for r in committed["rows"]:
        assert len(r["calls_tps"]) == 6
        assert math.isclose(r["measured_tps"], math.exp(sum(map(math.log, r["calls_tps"])) / 6), rel_tol=1e-12)
    # the committed comparison is what compare --statistic gmean gives on every run 9 file
    shutil.copy(path / "prediction.json", tmp_path / "prediction.json")
    files = sorted(str(p.relative_to(ROOT)) for p in (RESULTS / "run9").glob("call*/r9-batched-*.jsonl"))
    assert len(files) == 48
    subprocess.run([sys.executable, str(LCP / "predict_batched.py"), "compare", "--statistic", "gmean", "--out",
                    str(tmp_path), *files], cwd=ROOT, check=True, capture_output=True, timeout=120)
    assert (tmp_path / "comparison.md").read_bytes() == (path / "comparison.md").read_bytes()
