"""The two reference arms: ``resident`` (windows already on the device) and ``copy-only`` (deliveries, no kernels).

Resident decodes the same bytes without transport, so its output equals the
ordered path's; copy-only moves the same window bytes and runs no kernel. On
the simulated machine both bound the transport arms from below, which is what
makes 1 / max(t_resident, t_copy_only) a ceiling.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.profile import load_profile
from sim.functional import functional_graphs, functional_point
from sim.run.point import Point
from sim.run.run import check, run_point
from sim.transport.scheduler import TransportConfig
from tests.conftest import reference_workload


def _functional(arm: str, depth: int, parallel: int = 1, unified: bool = True) -> str:
    wl = reference_workload(16384, tokens=2)
    if parallel > 1:
        wl = replace(wl, context=(16384, 12288, 8192)[:parallel], n_parallel=parallel, unified=unified)
    p = functional_point(Point(wl, load_profile("rtx4070-gen4x16"), TransportConfig(depth=depth, arm=arm)))
    run = check(p, functional=True, graphs=functional_graphs)
    assert run.result.extra["hazards"] == 0
    return run.result.extra["output_hash"]


@pytest.mark.parametrize("parallel,unified", [(1, True), (3, True), (3, False)])
def test_resident_decodes_what_the_ordered_path_decodes(parallel: int, unified: bool) -> None:
    # the functional schedule includes a context shift and a sequence reset: the resident cache takes those rows too
    assert _functional("resident", 0, parallel, unified) == _functional("transport", 0, parallel, unified)


def test_resident_moves_no_window_and_copy_only_runs_no_kernel() -> None:
    hw = load_profile("rtx4070-gen4x16")
    wl = reference_workload(16384, tokens=3)
    res = run_point(Point(wl, hw, TransportConfig(depth=0, arm="resident")), trace=True, checked=False, warmup=0)
    later = res.graphs[1:]
    assert all(g.early_bytes == g.late_bytes == 0 and g.ordered_copies == len(wl.model.small_inputs_bytes) + 1 for g in later)
    piped = run_point(Point(wl, hw, TransportConfig(depth=2)), checked=False, warmup=0)
    copy = run_point(Point(wl, hw, TransportConfig(depth=2, arm="copy-only")), trace=True, checked=False, warmup=0)
    assert [g.early_bytes + g.late_bytes for g in copy.graphs] == [g.early_bytes + g.late_bytes for g in piped.graphs]
    assert not [s for s in copy.spans if s.track.startswith("consumer") and s.name.startswith("gpu")]
    assert [s for s in res.spans if s.track.startswith("consumer") and s.name.startswith("gpu")]


@pytest.mark.parametrize("context", [4096, 16384, 32768])  # 65,536 resident does not fit the 12 GB card
def test_the_reference_arms_bound_every_transport_arm(context: int) -> None:
    hw = load_profile("rtx4070-gen4x16")
    wl = reference_workload(context, tokens=3)

    def ms(**kw: object) -> float:
        g = run_point(Point(wl, hw, TransportConfig(budget_mib=0.0, **kw)), checked=False, warmup=0).graphs[1:]  # type: ignore[arg-type]
        return sum(x.total_s for x in g) / len(g)

    floor = max(ms(depth=0, arm="resident"), ms(depth=4, arm="copy-only"))
    for depth in (0, 1, 2, 4):
        assert ms(depth=depth) >= floor * 0.999, depth


def test_an_unknown_arm_is_refused() -> None:
    with pytest.raises(ValueError, match="arm 'hot' unknown; allowed: transport, resident, copy-only"):
        TransportConfig(arm="hot")


def test_the_release_wait_keeps_every_delivery_behind_its_slot_s_reader() -> None:
    from validate.race import release_margins

    hw = load_profile("rtx4070-gen4x16")
    wl = reference_workload(16384, tokens=3)
    for mutations in (frozenset(), frozenset({"no-release-wait"}), frozenset({"margin0", "no-release-wait"})):
        t = TransportConfig(depth=1, mutations=mutations)
        m = release_margins(run_point(Point(wl, hw, t), trace=True, checked=False, warmup=0).spans, wl, t)
        # 16 staged splits a graph, the first n_slots deliveries of each ordered by the boundary wait
        assert m["pairs"] == 3 * (wl.model.n_attn - t.n_slots)
        if "margin0" in mutations:
            # N + 1 slots: delivery o is issued right after split o - 2 -- its slot's reader -- was enqueued, and runs
            # while that split waits or reads: the window the release wait closes is open
            assert m["negative"] > 0 and m["min_margin_us"] < 0
        else:
            # the host syncs at every CPU split, so even without the wait the slot's reader (split o - 3) has ended
            assert m["negative"] == 0 and m["min_margin_us"] >= 0, mutations
