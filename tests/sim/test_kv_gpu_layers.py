"""``--kv-gpu-layers`` (the fork's device-resident KV layers) and ``-ngl`` (layers on the CPU): graph, scheduler, rows.

The resident layers' windows are never delivered and their rows never go round the host: the program computes
their attention over the device's copy of the host cache's prefix and writes their new rows there, so the output is
the ordered path's at every depth and every N, and a program that skips those rows (or writes the wrong layer's)
gives another output.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from backends.base import OutOfDeviceMemory
from backends.profile import load_profile
from kvpipe.cli import main
from sim import functional as fn
from sim import replay
from sim.graph import decode_graph, layout_of
from sim.placement import ESTIMATE_HOST_WEIGHT_GBPS, cpu_layers_seconds
from sim.points import GridSpec, points
from sim.program.decode import DecodeProgram
from sim.rows import row
from sim.run.point import Point
from sim.run.run import check, run_point
from sim.transport.scheduler import TransportConfig
from tests.conftest import reference_workload

REF = load_profile("rtx4070-gen4x16")
N_ATTN = fn.FUNCTIONAL_ATTN


def fpoint(kv: int, depth: int, **wl: object) -> Point:
    return fn.functional_point(Point(replace(reference_workload(4096, tokens=8), kv_gpu_layers=kv, **wl), REF,  # type: ignore[arg-type]
                                     TransportConfig(depth=depth)))


def frun(kv: int, depth: int, **wl: object):  # type: ignore[no-untyped-def]
    return check(fpoint(kv, depth, **wl), functional=True, graphs=fn.functional_graphs)


def delivered(r) -> list[int]:  # type: ignore[no-untyped-def]
    return [g.early_bytes + g.late_bytes for g in r.result.graphs]


def test_outputs_are_the_ordered_path_s_at_every_depth_and_n_with_no_hazard() -> None:
    runs = {(kv, d): frun(kv, d) for kv in (0, N_ATTN // 4, N_ATTN // 2) for d in (0, 1, 2)}
    ordered = runs[0, 0].program.step_hashes()
    assert len(set(ordered)) == len(ordered)
    for (kv, d), r in runs.items():
        assert r.checker.hazard_count == 0, (kv, d, r.checker.report())
        assert r.program.step_hashes() == ordered, (kv, d)
    # Delivered bytes fall by exactly the resident layers' windows, token by token; one delivery fewer per layer.
    wl = fpoint(0, 1).workload
    for kv in (N_ATTN // 4, N_ATTN // 2):
        for g0, g, d0, d in zip(runs[0, 1].result.graphs, runs[kv, 1].result.graphs, delivered(runs[0, 1]), delivered(runs[kv, 1]),
                                strict=True):
            assert d0 - d == kv * d0 // wl.model.n_attn
            assert g.deliveries == g0.deliveries - kv and g.slot_need_bytes == g0.slot_need_bytes


def test_several_sequences_over_a_split_cache_keep_their_output() -> None:
    kw = {"n_parallel": 3, "unified": False}
    hashes = {(kv, d): frun(kv, d, **kw).program.step_hashes() for kv in (0, 2) for d in (0, 2)}
    assert len({tuple(h) for h in hashes.values()}) == 1


@pytest.mark.parametrize("mutation", ["skip-rows", "wrong-layer"])
def test_a_program_that_skips_or_misplaces_the_resident_rows_is_caught(monkeypatch: pytest.MonkeyPatch, mutation: str) -> None:
    ordered = frun(0, 1).program.step_hashes()
    store_of = DecodeProgram._store_of
    if mutation == "skip-rows":
        monkeypatch.setattr(DecodeProgram, "_store_of", lambda self, res, j: None)
    else:  # the rows of layer j land in layer j - 1's block
        def wrong(self: DecodeProgram, res: object, j: int) -> object:
            return store_of(self, res, max(0, j - 1)) if store_of(self, res, j) else None  # type: ignore[arg-type]

        monkeypatch.setattr(DecodeProgram, "_store_of", wrong)
    assert frun(N_ATTN // 2, 1).program.step_hashes() != ordered


def test_the_binding_holds_only_the_resident_layers() -> None:
    p = fpoint(2, 1)
    g = next(iter(fn.functional_graphs(p)))
    layout = layout_of(p.workload)
    assert g.device_kv_bytes == layout.k_offset(2) == 2 * layout.nbytes // layout.n_attn
    prog = DecodeProgram(p.workload)
    binding = (object(), 0, g.device_kv_bytes)
    assert prog._store_of(binding, 1) is not None and prog._store_of(binding, 2) is None
    merged = g.splits[0]
    assert [w.layer for w in merged.resident] == [a for a in p.workload.model.attn_layers[:2] for _ in "kv"]
    assert not any(s.staged for s in g.splits if s.resident) or merged.attn_layer < 0


def test_the_graph_merges_the_gpu_splits_around_resident_layers_and_keeps_their_gpu_time(qwen) -> None:  # type: ignore[no-untyped-def]
    compute = REF.devices[0].compute
    graphs = {kv: decode_graph(reference_workload(19246, kv_gpu_layers=kv), compute, step=0) for kv in (0, 4, 16)}
    for kv, g in graphs.items():
        assert len(g.splits) == 1 + 2 * (qwen.n_attn - kv)
        assert not any(s.name.startswith("cpu_rows_l") and s.layers[0] in qwen.attn_layers[:kv] for s in g.splits)
        assert sum(len(s.resident) for s in g.splits) == 2 * kv
        gpu_s = sum(s.compute_s for s in g.splits if s.kind == "gpu")
        assert gpu_s == pytest.approx(sum(s.compute_s for s in graphs[0].splits if s.kind == "gpu"), rel=1e-12)


def test_the_prefix_is_charged_to_the_device_and_the_planner_places_it_as_the_scheduler_does() -> None:
    pts = points(GridSpec(contexts=((60000,), (83968,)), kv_gpu_layers=(0, 2, 4), depths=(0, 1, 3), budgets_mib=(0, 128),
                          tokens=4))
    for p in pts:
        r = run_point(p)
        plan = replay.plan_point(p)
        assert plan.fits and [t.fields() for t in plan.tokens] == [{f: getattr(g, f) for f in replay.PLAN_FIELDS}
                                                                    for g in r.graphs], (p.context, p.workload.kv_gpu_layers, p.transport)
    first = {(p.context, p.workload.kv_gpu_layers): replay.plan_point(p).tokens[0].fields() for p in pts
             if (p.transport.depth, p.transport.budget_mib) == (3, 0)}
    assert not first[60000, 0]["declined"] and "headroom" in first[60000, 4]["decline_reason"]  # the prefix leaves the ring less room
    big = replace(pts[-1], workload=replace(pts[-1].workload, kv_gpu_layers=12))
    assert not replay.plan_point(big).fits
    with pytest.raises(OutOfDeviceMemory, match="resident0"):
        run_point(big)


def test_reference_preset_ordered_rows_and_ring(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "-m", "qwen3.8-27b", "--hardware", "rtx4070-gen4x16", "-d", "19246", "--depth", "0,1",
                 "--kv-gpu-layers", "0,4,8", "--json"]) == 0
    rows = {(r.get("kv_gpu_layers", 0), r["depth"]): r for r in json.loads(capsys.readouterr().out)}
    window_mib = 2 * 19456 * 1088 / 2**20  # one layer's K and V windows: 19,456 rows of q8_0 (1,088 B a row)
    rows_mib = 2 * 1088 / 2**20  # and its new K and V rows, which no longer go down for the CPU split
    for kv in (4, 8):
        assert rows[0, 0]["ordered_mib"] - rows[kv, 0]["ordered_mib"] == pytest.approx(kv * (window_mib + rows_mib))
    assert rows[0, 0]["tokens_per_s"] < rows[4, 0]["tokens_per_s"] < rows[8, 0]["tokens_per_s"]
    for kv in (0, 4, 8):
        assert rows[kv, 1]["ring_mib"] == rows[0, 1]["ring_mib"] and rows[kv, 1]["deliveries"] == 16 - kv
        assert rows[kv, 1]["early_mib"] + rows[kv, 1]["late_mib"] == pytest.approx((16 - kv) * window_mib)
    assert "kv_gpu_layers" not in rows[0, 0] and rows[4, 0]["kv_gpu_layers"] == 4


def test_sweep_rows_of_each_n_are_kept_apart(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from kvpipe.sweep import key_of_point, key_of_row

    # llama.cpp's -ngl counts the output layer: -ngl 65 of a 64-layer model is every layer (as 999), 64 leaves one on the CPU
    for name, grid in (("kv", ["--kv-gpu-layers", "0,4,8"]), ("ngl", ["-ngl", "999,65,60"])):
        out = tmp_path / name
        assert main(["sweep", "--context", "8192", "--depth", "0,1", "--tokens", "2", *grid, "--jobs", "1", "--quiet",
                     "--out", str(out)]) == 0
        rows = json.loads((out / "rows.json").read_text())
        assert len(rows) == len({key_of_row(r) for r in rows}) == 4 + 2 * (name == "kv")  # -ngl 65 of 64: every layer
    pts = points(GridSpec(contexts=((8192,),), depths=(0,), n_gpu_layers=(999, 65, 60), kv_gpu_layers=(0,)))
    assert key_of_point(pts[0]) == key_of_point(pts[1]) != key_of_point(pts[2])
    capsys.readouterr()


def test_ngl_runs_the_first_layers_in_one_cpu_split_priced_by_the_profile_or_an_estimate(qwen) -> None:  # type: ignore[no-untyped-def]
    compute = REF.devices[0].compute
    wl = reference_workload(8192, n_gpu_layers=40)
    g = decode_graph(wl, compute, step=0)
    first, gpu0 = g.splits[0], g.splits[1]
    start = wl.gpu_layer_start
    assert (first.kind, first.name, first.layers) == ("cpu", "cpu_layers", tuple(range(start)))
    assert gpu0.kind == "gpu" and gpu0.layers[0] == start and gpu0.ordered[-1].name == "act_cpu"
    on_cpu = [j for j, a in enumerate(qwen.attn_layers) if a < start]
    assert not any(s.attn_layer in qwen.attn_layers[: len(on_cpu)] for s in g.splits if s.kind == "gpu" and s.attn_layer >= 0)
    assert sum(1 for s in g.splits if s.staged) == qwen.n_attn - len(on_cpu)
    windows = [sum(p.nbytes for s in decode_graph(reference_workload(8192), compute, step=0).splits
                   for i in s.staged if i.layer == a for p in i.pieces) for a in qwen.attn_layers[: len(on_cpu)]]
    assert first.compute_s == cpu_layers_seconds(compute, qwen.layer_weight_bytes, start, windows, 1)
    assert compute.host_weight_bytes_per_s == 0  # the preset does not know this host's rate: priced at an estimate
    rate = compute.host_attn_bytes_per_s or ESTIMATE_HOST_WEIGHT_GBPS * 1e9
    assert first.compute_s > start * qwen.layer_weight_bytes / rate > 0
    measured = replace(compute, host_weight_bytes_per_s=50e9)
    assert cpu_layers_seconds(measured, qwen.layer_weight_bytes, start, windows, 1) < first.compute_s or rate > 50e9
    r = row(run_point(Point(wl, REF, TransportConfig(depth=1))))
    assert r["n_gpu_layers"] == 41 and r["cpu_layers_cost"] == "estimate" and r["hazards"] == 0  # llama.cpp's -ngl: +1 output layer
    prof = replace(REF, devices=(replace(REF.devices[0], compute=measured),))
    assert row(run_point(Point(wl, prof, TransportConfig(depth=0))))["cpu_layers_cost"] == "profile"


def test_the_table_takes_each_placement_s_gain_over_its_own_ordered_row(capsys: pytest.CaptureFixture[str]) -> None:
    from sim.telemetry import gains, table

    assert main(["simulate", "-d", "8192", "-ngl", "999,48", "--kv-gpu-layers", "0", "--depth", "0,1", "--tokens", "2",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [g == 0.0 for g in gains(rows)] == [True, False, True, False]  # each -ngl's depth 1 over its own depth 0
    assert "-ngl 48 (CPU layers at an estimated host rate)" in table(rows)
