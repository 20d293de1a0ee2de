"""A host that launches a split's kernels for a while: the GPU starts at once, the host can do nothing else meanwhile.

Seen on the H200 (validate/results/h200/run6, f16 at 32,768): the Python
program spends ~1.1 ms launching an attention split; the delivery for the next
split is issued only after that, and where copy ~ compute the consumer waits
for it. ``HostCosts.split_launch_s`` (calibrated: the mean host launch time of
a split) models it; 0 keeps every earlier simulation as it was.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from backends.base import CopyRange, Work, WorkKind
from backends.profile import for_workload, load_profile, profile_from_dict
from backends.simpy_machine import SimMachine
from sim.run.point import Point
from sim.run.run import run_point
from sim.transport.scheduler import TransportConfig
from sim.workload import cache_type, load_model
from tests.conftest import fast_profile
from validate.calibrate import _residual, refit

RUN4 = Path(__file__).resolve().parents[2] / "validate" / "results" / "h200" / "run4" / "calibrated.json"


def _spans(split_launch_s: float, kind: WorkKind) -> tuple[dict[str, tuple[float, float]], float]:
    hw = fast_profile(load_profile("rtx4070-gen4x16"), h2d_gbps=10.0)
    hw = replace(hw, devices=tuple(replace(d, dram_bytes_per_s=0.0) for d in hw.devices))  # no copy-under-kernel stretch
    m = SimMachine(replace(hw, host=replace(hw.host, launch_s=1e-3, split_launch_s=split_launch_s)), trace=True)
    out: dict[str, float] = {}

    def prog():  # type: ignore[no-untyped-def]
        consumer, transfer = m.create_stream(0, "consumer0"), m.create_stream(0, "transfer0")
        host, dev = m.alloc_host(1 << 20, "host"), m.alloc(0, 1 << 20, "dev")
        yield from m.launch(consumer, Work("split", 10e-3, 1, kind=kind))
        out["copy_issued"] = m.now_s()
        yield from m.copy(transfer, dev, host, [CopyRange(0, 0, 1 << 20)], tag="delivery1")
        yield from m.synchronize(consumer)
        yield from m.synchronize(transfer)

    m.run(prog())
    spans = {s.name: (s.start_s, s.end_s) for s in m.timeline() if s.track in ("consumer0", "transfer0")}
    return spans, out["copy_issued"]


def test_the_kernel_starts_when_launched_and_the_host_is_busy_until_the_split_is_launched() -> None:
    spans, issued = _spans(4e-3, WorkKind.GPU_SPLIT)
    assert spans["split"][0] == pytest.approx(1e-3)  # enqueued after the first launch's cost, as before
    assert spans["split"][1] == pytest.approx(11e-3)  # its GPU time is unchanged (it already spans the launching)
    assert issued == pytest.approx(5e-3)  # the next delivery waits for the host: 1 ms + 4 ms
    assert spans["delivery1"][0] >= issued


def test_zero_or_a_non_split_launch_changes_nothing() -> None:
    base, issued0 = _spans(0.0, WorkKind.GPU_SPLIT)
    assert issued0 == pytest.approx(1e-3)
    assert _spans(4e-3, WorkKind.OTHER) == (base, issued0)  # a calibration micro-kernel is not a split


def _profile() -> dict:
    return json.loads(RUN4.read_text())


def test_refit_takes_the_measured_split_launch_and_refits_the_glue_to_the_ordered_tokens() -> None:
    data = _profile()
    key = "llama-3.1-8b@f16"
    out = refit(data, {"llama-3.1-8b": load_model("llama-3.1-8b"), "qwen3.8-27b": load_model("qwen3.8-27b")})
    w = out["workloads"][key]
    assert w["split_launch_us"] == pytest.approx(data["workloads"][key]["host_launch_us_mean"])
    assert data["workloads"][key].get("split_launch_us") is None  # the input is left alone
    hw = for_workload(profile_from_dict(out), "llama-3.1-8b", "f16")
    assert hw.host.split_launch_s == pytest.approx(w["split_launch_us"] * 1e-6)
    m, ct = load_model("llama-3.1-8b"), cache_type("f16")
    from sim.graph import decode_graph
    from sim.workload import Workload

    runs = []
    for ctx, t in zip(w["windows"], w["token_ms_measured"]["ordered"], strict=True):
        wl = Workload(m, ct, ct, (ctx,), tokens=3)
        runs.append((wl, 0, t * 1e-3, sum(1 for s in decode_graph(wl, hw.devices[0].compute, ctx).splits if s.kind == "gpu")))
    assert abs(statistics.median(_residual(runs, hw, 1))) < 1e-6  # the glue zeroes the median ordered residual


def test_where_copy_is_close_to_compute_the_launching_host_costs_the_pipelined_token() -> None:
    out = refit(_profile(), {"llama-3.1-8b": load_model("llama-3.1-8b"), "qwen3.8-27b": load_model("qwen3.8-27b")})
    hw = for_workload(profile_from_dict(out), "llama-3.1-8b", "f16")
    off = replace(hw, host=replace(hw.host, split_launch_s=0.0))
    from sim.workload import Workload

    wl = Workload(load_model("llama-3.1-8b"), cache_type("f16"), cache_type("f16"), (32768,), tokens=2)
    t = {name: statistics.fmean(g.total_s for g in run_point(Point(wl, h, TransportConfig(depth=1, budget_mib=0.0)), checked=False,
                                                             warmup=0).graphs)
         for name, h in (("on", hw), ("off", off))}
    assert t["on"] > 1.03 * t["off"]
