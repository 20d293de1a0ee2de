"""The memory plan's candidates (``kvpipe.capacity_fit.placed``, ``candidates``) held to their pre-Round-21 code
(``capacity_fit_reference.py``): the same points, equal field by field, over random models, machines, cache types,
contexts, -ngl, memory caps, rings, depths and both builds; the configs shared across a plan's contexts are those made
anew; ``sim.memory.gpu_attention_layers`` as it was."""

from __future__ import annotations

from dataclasses import replace

import capacity_fit_reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpipe import capacity_fit
from kvpipe.capacity_fit import Limits
from kvpipe.plan_run import PlanRequest, points
from sim.memory import GIB, gpu_attention_layers
from sim.run.point import Point

MODELS = ("qwen3.8-27b", "llama-3.1-8b", "llama-3.1-70b", "qwen3.8-27b-q5km")
CARDS = ("rtx4070-gen4x16", "rtx3060-gen3x4", "h200-gen5x16")


def _point(model: str, card: str, cache: str, context: int, ngl: int) -> Point:
    req = PlanRequest(model=model, hardware=card, cache_type=cache, contexts=(context,))
    pt = points(req, [context], [0], 0.0)[0]
    n_layers = pt.workload.model.n_layers
    return replace(pt, workload=replace(pt.workload, n_gpu_layers=min(ngl, n_layers)))


def _limits(pt: Point, vram_frac: float, host_gib: float) -> Limits:
    total = pt.hardware.devices[0].memory_total_bytes
    return Limits(int(total * vram_frac), int(host_gib * GIB), "test", "test")


def _rings(depths: int, draw: st.DrawFn) -> dict[int, float]:
    out = {}
    for d in range(1, depths + 1):
        kind = draw(st.sampled_from(["missing", "zero", "small", "large", "whole"]))
        if kind != "missing":
            out[d] = {"zero": 0.0, "small": draw(st.floats(0.0, 4.0)), "large": draw(st.floats(0.0, 20_000.0)),
                      "whole": float(draw(st.integers(0, 3000)))}[kind]
    return out


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Point], Limits, int, list[dict[int, float]], str, bool]:
    model, card = draw(st.sampled_from(MODELS)), draw(st.sampled_from(CARDS))
    cache = draw(st.sampled_from(["q8_0", "f16", "q4_0"]))
    ngl = draw(st.sampled_from([999, 999, 1, 20, 40, 60]))
    contexts = draw(st.lists(st.integers(1, 600_000), min_size=1, max_size=4))
    pts = [_point(model, card, cache, c, ngl) for c in contexts]
    limits = _limits(pts[0], draw(st.sampled_from([1.0, 0.9, 0.5, 0.25])), draw(st.sampled_from([0.25, 1.0, 4.0, 16.0, 64.0, 512.0])))
    max_depth = draw(st.integers(1, 14))
    rings = [_rings(max_depth, draw) for _ in contexts]
    return pts, limits, max_depth, rings, draw(st.sampled_from(["fork", "upstream"])), draw(st.booleans())


@settings(max_examples=120, deadline=None)
@given(cases())
def test_candidates_are_the_reference_candidates(case: tuple[list[Point], Limits, int, list[dict[int, float]], str, bool]) -> None:
    pts, limits, max_depth, rings, build, auto_ngl = case
    configs: dict[object, object] = {}  # shared by the contexts, as ``kvpipe.capacity.choices_started`` shares it
    for pt, r in zip(pts, rings, strict=True):
        got = capacity_fit.placed(pt, limits, build, auto_ngl)
        assert got == ref.placed(pt, limits, build, auto_ngl)
        want = ref.candidates(pt, limits, max_depth, r, build, auto_ngl)
        assert capacity_fit.candidates(pt, limits, max_depth, r, build, auto_ngl) == want
        shared = capacity_fit.candidates(pt, limits, max_depth, r, build, auto_ngl, got, configs)  # type: ignore[arg-type]
        assert shared == want
        assert [repr(p) for p in shared] == [repr(p) for p in want]  # field by field, the floats' bits too
        assert [hash(p) for p in shared] == [hash(p) for p in want]
        for p in pts:
            assert gpu_attention_layers(p.workload) == ref.gpu_attention_layers(p.workload)
            assert capacity_fit.max_resident_layers(p.workload, limits.vram_bytes // 3) == \
                ref.max_resident_layers(p.workload, limits.vram_bytes // 3)


def test_a_plans_contexts_share_their_configs_and_answer_as_made_anew() -> None:
    """Two contexts whose rings round to the same budgets at some depths: their candidates there share one config object
    (equal to the one made anew); a depth whose budget differs gets its own; a config made from another source config
    (another plan's, equal by value but not the same object) is not taken from the shared ones."""
    a, b = _point("qwen3.8-27b", "rtx4070-gen4x16", "q8_0", 65_536, 999), _point("qwen3.8-27b", "rtx4070-gen4x16", "q8_0", 65_664, 999)
    b = replace(b, transport=a.transport)  # as ``_with_context`` makes them: one config object for every context
    limits = _limits(a, 1.0, 512.0)
    configs: dict[object, object] = {}
    ra, rb = {1: 10.2, 2: 20.5, 3: 30.0}, {1: 10.9, 2: 21.5, 3: 30.0}  # budgets 11, 21, 30 and 11, 22, 30
    ca = capacity_fit.candidates(a, limits, 3, ra, "fork", configs=configs)  # type: ignore[arg-type]
    cb = capacity_fit.candidates(b, limits, 3, rb, "fork", configs=configs)  # type: ignore[arg-type]
    assert ca == ref.candidates(a, limits, 3, ra, "fork") and cb == ref.candidates(b, limits, 3, rb, "fork")
    by_depth = {p.transport.depth: p.transport for p in ca}, {p.transport.depth: p.transport for p in cb}
    assert [d for d in range(4) if by_depth[0][d] is by_depth[1][d]] == [0, 1, 3]
    other = replace(a, transport=replace(a.transport, pack_streams=a.transport.pack_streams))  # equal, another object
    assert other.transport is not a.transport
    co = capacity_fit.candidates(other, limits, 3, ra, "fork", configs=configs)  # type: ignore[arg-type]
    assert co == ca and all(p.transport is not q.transport for p, q in zip(co, ca, strict=True))


def test_a_host_cache_the_host_cannot_hold_has_no_candidates_but_the_resident_arm() -> None:
    """The device holds the ordered run's buffers but the host memory cap not the cache: no host-cache candidate, as
    in the reference (and one when the host can hold it)."""
    pt = _point("llama-3.1-8b", "rtx4070-gen4x16", "q8_0", 131_072, 999)
    small, large = _limits(pt, 1.0, 1.0), _limits(pt, 1.0, 64.0)
    assert capacity_fit.placed(pt, small, "fork") == ref.placed(pt, small, "fork") and ref.placed(pt, small, "fork").wl is None
    assert capacity_fit.placed(pt, large, "fork") == ref.placed(pt, large, "fork") and ref.placed(pt, large, "fork").wl is not None
    assert capacity_fit.candidates(pt, small, 4, {}, "fork") == ref.candidates(pt, small, 4, {}, "fork")
