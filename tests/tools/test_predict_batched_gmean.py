"""predict_batched.py compare: the median of runs 6-8 (their committed comparison reproduced) and run 9's geometric
mean over the complete rounds (the rounds every configuration given finished)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "llamacpp" / "predict_batched.py"
RESULTS = ROOT / "validate" / "results" / "h200-llamacpp"


def _compare(out: Path, files: list[str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), "compare", "--out", str(out), *extra, *files], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_median_default_reproduces_run_8s_committed_comparison(tmp_path: Path) -> None:
    committed = RESULTS / "prediction-batched8"
    shutil.copy(committed / "prediction.json", tmp_path / "prediction.json")
    call2 = RESULTS / "run8" / "call2"
    files = [str(p.relative_to(ROOT)) for pp in (640, 1088) for p in sorted(call2.glob(f"r8-batched-*-pp{pp}-*.jsonl"))]
    res = _compare(tmp_path, files)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "comparison.md").read_bytes() == (committed / "comparison.md").read_bytes()
    got, want = (json.loads((d / "comparison.json").read_text()) for d in (tmp_path, committed))
    assert {k: v for k, v in got.items() if k != "prediction"} == {k: v for k, v in want.items() if k != "prediction"}


def _write_call(path: Path, pp: int, tps: dict[int, float]) -> str:
    rows = [{"pp": pp, "tg": 64, "pl": pl, "n_kv": pl * (pp + 64), "t_tg": 64 * pl / t, "speed_tg": t} for pl, t in tps.items()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _setup(tmp_path: Path) -> Path:
    out = tmp_path / "pred"
    out.mkdir()
    held = [{"layout": lay, "pp": 832, "tg": 64, "pl": pl, "predicted_tps": 100.0, "command": ""}
            for lay in ("split", "unified") for pl in (1, 2)]
    (out / "prediction.json").write_text(json.dumps({"held_out": held}))
    return out


def test_gmean_uses_only_the_rounds_every_configuration_finished(tmp_path: Path) -> None:
    out, d = _setup(tmp_path), tmp_path / "files"
    d.mkdir()
    files = []
    # held-out split: rounds 1-3 finished; unified: rounds 1-3 finished; calibration -npp 512 split: round 2 cut short
    # (no -npl 2 row), round 3 finished. Complete rounds: 1 and 3 (round 2 is missing a finished calibration call).
    speeds = {1: 80.0, 2: 200.0, 3: 125.0}
    for k, t in speeds.items():
        for lay in ("split", "unified"):
            files.append(_write_call(d / f"r9-batched-{lay}-pp832-r{k}.jsonl", 832, {1: t, 2: 2 * t}))
    files.append(_write_call(d / "r9-batched-split-pp512-r1.jsonl", 512, {1: 1.0, 2: 1.0}))
    files.append(_write_call(d / "r9-batched-split-pp512-r2.jsonl", 512, {1: 1.0}))
    files.append(_write_call(d / "r9-batched-split-pp512-r3.jsonl", 512, {1: 1.0, 2: 1.0}))
    (d / "r9-batched-split-pp512-r4.jsonl").write_text("")  # killed before its first row
    files.append(str(d / "r9-batched-split-pp512-r4.jsonl"))
    res = _compare(out, files, "--statistic", "gmean")
    assert res.returncode == 0, res.stderr
    data = json.loads((out / "comparison.json").read_text())
    assert data["complete_rounds"] == [1, 3]
    one = math.sqrt(80.0 * 125.0)  # the geometric mean of rounds 1 and 3: 100 t/s
    for r in data["rows"]:
        assert len(r["calls_tps"]) == 2 and math.isclose(r["measured_tps"], one * r["pl"])
        assert math.isclose(r["error"], 100.0 / (one * r["pl"]) - 1.0, abs_tol=1e-12)
    assert "geometric mean of 2 complete rounds" in (out / "comparison.md").read_text()
    # the median over every call (the default) would have taken round 2 as well (it reads every file: not the empty one)
    res = _compare(out, files[:-1])
    med = {r["pl"]: r["measured_tps"] for r in json.loads((out / "comparison.json").read_text())["rows"]}
    assert res.returncode == 0 and med == {1: 125.0, 2: 250.0}


def test_gmean_refuses_files_without_a_round_and_two_finished_calls_of_one_round(tmp_path: Path) -> None:
    out, d = _setup(tmp_path), tmp_path / "files"
    (d / "a").mkdir(parents=True)
    files = [_write_call(d / f"r9-batched-{lay}-pp832.jsonl", 832, {1: 1.0, 2: 2.0}) for lay in ("split", "unified")]
    res = _compare(out, files, "--statistic", "gmean")
    assert res.returncode != 0 and "has no round (-rK)" in res.stderr and "Traceback" not in res.stderr
    files = [_write_call(p / "r9-batched-split-pp832-r1.jsonl", 832, {1: 1.0, 2: 2.0}) for p in (d, d / "a")]
    res = _compare(out, files, "--statistic", "gmean")
    assert res.returncode != 0 and "two finished calls of split -npp 832 round 1" in res.stderr


def test_two_machines_rounds_of_one_number_stay_two_rounds_with_machines(tmp_path: Path) -> None:
    # run 10: machine A (call1) ran rounds 1-2, machine B (call2, call3) began again at round 1 and ran 1-3
    out = _setup(tmp_path)
    files = []
    for call, ks, t in (("call1", (1, 2), 160.0), ("call2", (1, 2), 90.0), ("call3", (3,), 90.0)):
        (tmp_path / call).mkdir()
        for k in ks:
            for lay in ("split", "unified"):
                files.append(_write_call(tmp_path / call / f"r10-batched-{lay}-pp832-r{k}.jsonl", 832, {1: t, 2: 2 * t}))
    res = _compare(out, files, "--statistic", "gmean")
    assert res.returncode == 1 and "two finished calls of split -npp 832 round 1" in res.stderr
    res = _compare(out, files, "--statistic", "gmean", "--machines", "call1=A,call2=B,call3=B")
    assert res.returncode == 0, res.stderr
    data = json.loads((out / "comparison.json").read_text())
    assert data["complete_rounds"] == ["A1", "A2", "B1", "B2", "B3"]
    want = math.exp((2 * math.log(160.0) + 3 * math.log(90.0)) / 5)
    assert all(math.isclose(r["measured_tps"], want * r["pl"]) and len(r["calls_tps"]) == 5 for r in data["rows"])
    res = _compare(out, files, "--statistic", "gmean", "--machines", "call1=A,call2=B")
    assert res.returncode == 1 and "folder 'call3', which --machines does not name" in res.stderr


def test_drop_outliers_leaves_out_a_call_off_its_rows_median_and_brackets_it(tmp_path: Path) -> None:
    """Issue 28, run 12: with --drop-outliers 0.25 a call more than 25% below its row's median of calls is left out of
    the statistic and shown in brackets; the others count; without the flag every call counts and the rows carry no
    left-out field; a spread outside [0, 1) is one line naming it."""
    out, d = _setup(tmp_path), tmp_path / "files"
    d.mkdir()
    files = []
    for k, t in {1: 100.0, 2: 104.0, 3: 96.0, 4: 60.0}.items():  # round 4: a slow spell, 40% below at both -npl
        for lay in ("split", "unified"):
            files.append(_write_call(d / f"r12-batched-{lay}-pp832-r{k}.jsonl", 832, {1: t, 2: 2 * t}))
    res = _compare(out, files, "--statistic", "gmean", "--drop-outliers", "0.25")
    assert res.returncode == 0, res.stderr
    data = json.loads((out / "comparison.json").read_text())
    kept = (100.0 * 104.0 * 96.0) ** (1 / 3)
    for r in data["rows"]:
        assert r["left_out_tps"] == [60.0 * r["pl"]] and math.isclose(r["measured_tps"], kept * r["pl"])
    assert "100.00 / 104.00 / 96.00 / [60.00] |" in (out / "comparison.md").read_text()
    res = _compare(out, files, "--statistic", "gmean")
    rows = json.loads((out / "comparison.json").read_text())["rows"]
    assert all("left_out_tps" not in r and math.isclose(r["measured_tps"], (kept ** 3 * 60.0) ** 0.25 * r["pl"]) for r in rows)
    res = _compare(out, files, "--drop-outliers", "1.0")
    assert res.returncode != 0 and "--drop-outliers 1.0" in res.stderr and len(res.stderr.strip().splitlines()) == 1
