"""The GPU calibration's fitting, run where no GPU is: synthetic samples and the SimPy machine.

``kvpipe calibrate`` fits a compute model (with a host-bound floor) to the
kernel spans of the decode program; these tests hold the fit to a model it
must recover, the round medians to what they promise, and the whole
``calibrate_workload`` path to a run on the simulated machine.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from backends.profile import ComputeModel, load_profile
from backends.simpy_machine import SimMachine
from sim.functional import functional_model
from sim.program import WeightStore
from sim.workload import CACHE_TYPES, load_model
from validate.calibrate import _fastest_samples, calibrate_workload, fit_compute

TRUE = ComputeModel(layer_s=300e-6, attn_s=100e-6, attn_bytes_per_s=30e9, head_s=500e-6, cpu_split_s=8e-6, attn_floor_s=1.5e-3)


def _samples(model: ComputeModel, windows: list[float]) -> list[tuple[int, bool, float, bool, float]]:
    out = []
    for wb in windows:
        out.append((3, False, wb, False, 3 * model.layer_s))
        for _ in range(4):
            out.append((1, True, wb, False, model.layer_s + model.attention_seconds(wb)))
        out.append((1, True, wb, True, model.layer_s + model.attention_seconds(wb) + model.head_s))
    return out


def test_fit_recovers_a_floored_compute_model() -> None:
    windows = [5e6, 27e6, 72e6, 214e6]  # the first two under the 1.5 ms floor, the others on the line
    fitted = fit_compute(_samples(TRUE, windows), TRUE.cpu_split_s)
    assert fitted.layer_s == pytest.approx(TRUE.layer_s, rel=1e-6)
    assert fitted.attn_floor_s == pytest.approx(TRUE.attn_floor_s, rel=1e-6)
    assert fitted.attn_bytes_per_s == pytest.approx(TRUE.attn_bytes_per_s, rel=1e-6)
    assert fitted.head_s == pytest.approx(TRUE.head_s, rel=1e-6)
    for wb in (10e6, 50e6, 500e6):  # and it predicts windows it never saw
        assert fitted.attention_seconds(wb) == pytest.approx(TRUE.attention_seconds(wb), rel=1e-6)


def test_fit_without_a_floor_keeps_the_line() -> None:
    line = replace(TRUE, attn_floor_s=0.0)
    fitted = fit_compute(_samples(line, [5e6, 27e6, 72e6]), 0.0)
    assert fitted.attention_seconds(5e6) == pytest.approx(line.attention_seconds(5e6), rel=1e-6)
    assert fitted.attention_seconds(300e6) == pytest.approx(line.attention_seconds(300e6), rel=1e-6)


def test_the_fastest_round_wins_even_when_most_rounds_were_slow() -> None:
    base = [(4, True, 1e6, False, 2e-3, 1.5e-3), (3, False, 1e6, True, 1e-3, 0.9e-3)]
    slow = [(n, a, w, la, t * 1.8, h * 1.8) for n, a, w, la, t, h in base]
    assert _fastest_samples([slow, base, slow]) == base
    mixed = [base[0], slow[1]], [slow[0], base[1]]  # element-wise: each split its own fastest round
    assert _fastest_samples(mixed) == base
    assert _fastest_samples([base, base[:1]]) == base[:1]  # the shortest round bounds the samples


def test_calibrate_workload_runs_on_the_simulated_machine_and_fits_its_compute() -> None:
    hw = load_profile("h200-gen5x16-kvpipe")
    model = functional_model(load_model("llama-3.1-8b"))
    be = SimMachine(hw, functional=True)
    steps: list[str] = []
    entry = calibrate_workload(be, model, CACHE_TYPES["f16"], hw, np, WeightStore(), windows=(256, 1024), tokens=2,
                               scale=0.02, progress=steps.append, rounds=2)
    assert entry["rounds"] == 2 and entry["windows"] == [256, 1024]
    assert len(steps) == 2 * 2 * 2  # rounds x windows x (ordered, pipelined)
    assert len(entry["token_ms_measured"]["ordered"]) == 2
    c = entry["compute"]
    assert c["layer_us"] > 0 and c["cpu_split_us"] > 0
    # the simulated machine's attention grows with the window as its profile says: the fit sees the same slope
    true = hw.devices[0].compute
    big, small = 1024 * 4096.0, 256 * 4096.0
    fitted = ComputeModel(layer_s=c["layer_us"] * 1e-6, attn_s=c["attn_us"] * 1e-6, attn_bytes_per_s=c["attn_GBps"] * 1e9,
                          head_s=c["head_us"] * 1e-6, cpu_split_s=c["cpu_split_us"] * 1e-6, attn_floor_s=c["attn_floor_us"] * 1e-6)
    assert fitted.attention_seconds(big) >= fitted.attention_seconds(small)
    if true.attn_bytes_per_s > 0:
        assert fitted.attention_seconds(big) - fitted.attention_seconds(small) == pytest.approx(
            true.attention_seconds(big) - true.attention_seconds(small), rel=0.25, abs=5e-6)
