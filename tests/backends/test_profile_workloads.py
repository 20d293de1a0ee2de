"""A calibrated profile holds one compute model per (model, cache type); every command must pick the point's.

Before this, ``kvpipe simulate --hardware calibrated.json`` used the first
calibrated model's compute and launch costs for every model and cache type,
while ``kvpipe validate`` picked the model's entry but ignored the cache type.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from backends.profile import for_workload, load_profile, profile_from_dict, workload_entry
from kvpipe.commands.args import points_from_args

H200_FILE = Path(__file__).resolve().parents[2] / "validate" / "results" / "h200" / "run3" / "calibrated.json"


def _entry(layer_us: float, launch_us: float, cache: str) -> dict:
    return {"compute": {"layer_us": layer_us, "attn_us": 10.0, "attn_GBps": 100.0, "head_us": 50.0, "cpu_split_us": 5.0},
            "launch_us": launch_us, "event_us": 1.5, "cache_type": cache}


def _profile(workloads: dict) -> dict:
    data = json.loads(H200_FILE.read_text())
    data["workloads"] = workloads
    return data


def test_the_entry_of_the_model_and_cache_type_is_used() -> None:
    hw = profile_from_dict(_profile({"m@q8_0": _entry(100.0, 30.0, "q8_0"), "m@f16": _entry(200.0, 40.0, "f16")}))
    q8, f16 = for_workload(hw, "m", "q8_0"), for_workload(hw, "m", "f16")
    assert q8.devices[0].compute.layer_s == pytest.approx(100e-6)
    assert f16.devices[0].compute.layer_s == pytest.approx(200e-6)
    assert (q8.host.launch_s, f16.host.launch_s) == (pytest.approx(30e-6), pytest.approx(40e-6))
    assert f16.host.copy_issue_s == hw.host.copy_issue_s  # only the program's costs change


def test_an_entry_keyed_by_model_alone_matches_only_its_cache_type() -> None:
    hw = profile_from_dict(_profile({"m": _entry(100.0, 30.0, "q8_0")}))
    assert workload_entry(hw, "m", "q8_0") is not None
    assert workload_entry(hw, "m", "f16") is None
    assert for_workload(hw, "m", "f16") is hw  # uncalibrated for f16: the profile as it is
    assert for_workload(hw, "other", "q8_0") is hw


def test_simulate_reads_the_calibrated_entry_of_each_model() -> None:
    hw = load_profile(str(H200_FILE))
    args = argparse.Namespace(model="llama-3.1-8b,qwen3.8-27b", hardware=str(H200_FILE), cache_type="q8_0,f16",
                              context="4096", depth="1", budget="0", tokens=2, pageable=False)
    pts = {(p.workload.model.name, p.workload.cache_k.name): p for p in points_from_args(args)}
    data = json.loads(H200_FILE.read_text())["workloads"]
    for model in ("llama-3.1-8b", "qwen3.8-27b"):
        got = pts[(model, "q8_0")].hardware
        assert got.host.launch_s == pytest.approx(data[model]["launch_us"] * 1e-6)
        assert got.devices[0].compute.layer_s == pytest.approx(data[model]["compute"]["layer_us"] * 1e-6)
        assert pts[(model, "f16")].hardware == hw  # no f16 entry in this file: the profile as it is
    assert pts[("llama-3.1-8b", "q8_0")].hardware.host.launch_s != pts[("qwen3.8-27b", "q8_0")].hardware.host.launch_s


def test_rows_say_which_calibrated_entry_they_used_and_the_table_flags_a_missing_one() -> None:
    from sim.rows import row
    from sim.run.run import run_point
    from sim.telemetry import table

    args = argparse.Namespace(model="llama-3.1-8b", hardware=f"{H200_FILE},h200-gen5x16", cache_type="q8_0,f16",
                              context="1024", depth="1", budget="0", tokens=1, pageable=False)
    rows = {(r["hardware"], r["cache_type"]): r for r in (row(run_point(p, checked=False, warmup=0)) for p in points_from_args(args))}
    assert rows[("calibrated-nvidia-h200", "q8_0")]["calibrated_entry"] == "llama-3.1-8b"  # the file's legacy key
    assert rows[("calibrated-nvidia-h200", "f16")]["calibrated_entry"].startswith("none")
    assert rows[("h200-gen5x16", "f16")]["calibrated_entry"] == ""  # a preset has no calibrated entries
    flagged = [line for line in table(list(rows.values())).splitlines() if "no calibrated entry" in line]
    assert len(flagged) == 1 and " f16 " in flagged[0] and "calibrated-nvidia-h200" in flagged[0]
