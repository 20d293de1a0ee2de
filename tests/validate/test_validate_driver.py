"""``kvpipe validate``'s driver on the simulated machine: groups take turns, a stopped run leaves a whole partial report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpipe.cli import main as kvpipe
from validate.gpu_run import GroupRunner

HW = str(Path(__file__).resolve().parents[2] / "validate" / "results" / "h200" / "run3" / "calibrated.json")
ARGS = ["validate", "--machine", "simpy", "--hardware", HW, "--model", "llama-3.1-8b", "--context", "256,512",
        "--depth", "0,1", "--tokens", "2", "--scale", "0.02"]


def test_the_groups_of_a_model_take_turns_and_each_repetition_is_probed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[tuple[int, int]] = []
    real = GroupRunner.rep

    def spy(self: GroupRunner, rep: int, last: bool = True) -> None:
        order.append((max(self.workload.context), rep))
        real(self, rep, last)

    monkeypatch.setattr(GroupRunner, "rep", spy)
    assert kvpipe([*ARGS, "--reps", "2", "--out", str(tmp_path)]) == 0
    assert order == [(256, 0), (512, 0), (256, 1), (512, 1)]
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["complete"] is True and doc["repetitions_done"] == 2
    assert all(p["repetitions"] == 2 and p["host_probe_launch_us"] > 0 for p in doc["points"])
    kernels = [p for p in doc["points"] if p["arm"] != "copy-only"]  # copy-only launches no split
    assert all(p["host_split_launch_us"] > 0 and p["host_split_launch_vs_calibration"] > 0 for p in kernels)
    assert {p["arm"] for p in doc["points"]} == {"transport", "resident", "copy-only"}
    assert all(0 < p["ceiling_share"] <= 1.0 for p in doc["points"] if p["arm"] == "transport")
    assert (tmp_path / "gain_vs_depth.png").exists()


def test_a_run_stopped_after_one_repetition_leaves_that_repetition_s_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = GroupRunner.rep

    def stop_at_second(self: GroupRunner, rep: int, last: bool = True) -> None:
        if rep == 1:
            raise KeyboardInterrupt  # what a deadline's signal or a crash does half-way
        real(self, rep, last)

    monkeypatch.setattr(GroupRunner, "rep", stop_at_second)
    assert kvpipe([*ARGS, "--reps", "3", "--out", str(tmp_path)]) == 130  # "kvpipe: interrupted", no traceback
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["complete"] is False and doc["repetitions_done"] == 1
    assert {(p["context"], p["depth"]) for p in doc["points"] if p["arm"] == "transport"} == {(256, 0), (256, 1), (512, 0), (512, 1)}
    assert all(p["repetitions"] == 1 for p in doc["points"])
    assert "Partial report" in (tmp_path / "report.md").read_text()
    assert not list(tmp_path.glob(".*"))  # every file whole: written aside, then renamed


@pytest.mark.parametrize("extra", [["--mutate", "no-release-wait"], ["--no-pack", "--parallel", "2", "--no-kv-unified"]])
def test_validate_predicts_the_configuration_it_measures(tmp_path: Path, extra: list[str]) -> None:
    # on the simulated machine a measurement is the simulation of what ran: a prediction of anything else errs
    assert kvpipe([*ARGS, "--reps", "1", *extra, "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "report.json").read_text())
    transport = [p for p in doc["points"] if p["arm"] == "transport"]
    assert all(abs(p["error"]) < 1e-9 for p in doc["points"])
    if "--mutate" in extra:
        assert all(p["mutations"] == ["no-release-wait"] for p in transport)
    else:
        assert all(p["pack_streams"] is False and p["parallel"] == 2 for p in transport)
