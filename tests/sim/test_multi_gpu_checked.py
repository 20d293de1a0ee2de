"""Several GPUs on the simulated machine, under the race checker: a ring per device under layer and tensor split.

The CPU half of the two-GPU issue: the same scheduler drives two devices of the reference's RTX 4070 + RTX 3060
pair, each with its own transfer stream, ring and budget; the checker (``backends.checked``) finds no unordered
access at any depth. Under tensor split each device receives its heads' strided slice of every window (the
head-split delivery, docs/parallel-and-multi-gpu.md), one delivery per device per attention layer.
"""

from __future__ import annotations

import pytest

from backends.profile import load_profile
from sim.run.point import Point
from sim.run.run import check
from sim.transport.scheduler import TransportConfig
from sim.workload import Workload, cache_type, load_model

PAIR = "rtx4070-gen4x16+rtx3060-gen3x4"
Q8 = cache_type("q8_0")


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_layer_split_runs_a_ring_per_device_without_hazards(depth: int) -> None:
    wl = Workload(load_model("qwen3.8-27b-q5km"), Q8, Q8, (4096,), tokens=3, split_mode="layer")
    run = check(Point(wl, load_profile(PAIR), TransportConfig(depth=depth, budget_mib=0)))
    assert run.checker.hazard_count == 0
    g = run.result.graphs[-1]
    if depth:
        assert g.deliveries == wl.model.n_attn and not g.declined  # both devices' staged splits delivered
    else:
        assert g.deliveries == 0 and g.ordered_copies > 0


@pytest.mark.parametrize("depth", [0, 1])
def test_tensor_split_delivers_each_device_its_heads_without_hazards(depth: int) -> None:
    wl = Workload(load_model("qwen3.8-27b"), Q8, Q8, (4096,), tokens=2, split_mode="tensor")
    run = check(Point(wl, load_profile(PAIR), TransportConfig(depth=depth, budget_mib=0)))
    assert run.checker.hazard_count == 0
    assert all(g.deliveries == (2 * wl.model.n_attn if depth else 0) for g in run.result.graphs)
