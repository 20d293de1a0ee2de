"""A family's lines read at once (``sim.replay_family``, ``sim.evaluator.family_costs``) give every field the lines
read one at a time give, bit for bit.

Each case runs the points twice with the caches cleared before each: once with every line read alone (``family_key``
answering None: the per-line path, ``sim.replay._Line`` and ``costs.point_costs``), once as families. The first run
confirms the families' templates, so the second reads whole families at once (each test asserts it did); then the
lines' arrays (memory, alignment, io, window rows, each token's shape), every point's plan, the evaluator's lanes and
their fields, every point's stats and summary, and each line's step numbers (layout, window rows, values) must be equal
bit for bit. Random lines of the envelope (hypothesis): models, machines, cache types, contexts (near a window's edge,
a cache size set), tokens, depths and budgets, ``--kv-gpu-layers``, the resident arm, packed and unpacked slots.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.evaluator.family_costs as family_costs
import sim.replay_family as replay_family
from sim import replay
from sim.evaluator import clear_caches
from sim.evaluator.costs import point_costs
from sim.evaluator.evaluate import evaluate_batch
from sim.points import GridSpec, points
from sim.run.point import Point, clear_graph_cache
from sim.workload import model_preset_names

HARDWARE = ("rtx4070-gen4x16", "rtx3060-gen3x4", "h200-gen5x16", "gh200-c2c")
LINE_FIELDS = ("total", "used", "align", "io", "tokens", "rows", *replay_family.SHAPE_FIELDS)


def _run(pts: list[Point]) -> tuple[Any, Any, list[list[Any]]]:
    clear_caches()
    clear_graph_cache()
    ev = evaluate_batch(pts)
    la = replay_family.line_arrays(ev.plans.lines, replay._one_line)
    return ev, la, [point_costs(p) for p in ev.plans.lines]


def _both(pts: list[Point], monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """The points through the per-line path and as families, compared; (lines read as families, steps computed as a
    family's matrix) in the second run's evaluation."""
    with monkeypatch.context() as m:
        m.setattr(replay_family, "family_key", lambda p: None)
        alone, alone_la, _ = _run(pts)
    counts = [0, 0]
    real_family, real_values = replay_family._family, family_costs._values

    def family(firsts: Any, lis: list[int], *rest: Any) -> Any:
        counts[0] += len(lis)
        return real_family(firsts, lis, *rest)

    def values(t: Any, ref: Any, rows: np.ndarray, row: np.ndarray) -> np.ndarray:
        counts[1] += len(rows)
        return real_values(t, ref, rows, row)

    with monkeypatch.context() as m:
        m.setattr(replay_family, "_family", family)
        m.setattr(family_costs, "_values", values)
        clear_caches()
        clear_graph_cache()
        for p in pts:  # the templates confirmed, as the first run left them
            point_costs(p)
            replay._one_line(p)
        ev = evaluate_batch(pts)
        counted = tuple(counts)
        la = replay_family.line_arrays(ev.plans.lines, replay._one_line)
        got_costs = family_costs.family_costs(ev.plans.lines) if _one_family(ev.plans.lines) else None
    for f in LINE_FIELDS:
        a, b = getattr(alone_la, f), getattr(la, f)
        assert a.dtype == b.dtype and np.array_equal(a, b), f
    assert np.array_equal(alone.lane, ev.lane)
    assert alone.fields.keys() == ev.fields.keys()
    for f, v in alone.fields.items():
        assert v.dtype == ev.fields[f].dtype and np.array_equal(v, ev.fields[f]), f
    for i in range(len(pts)):
        assert alone.plans.point_plan(i) == ev.plans.point_plan(i)
        if ev.plans.fits[i]:
            assert repr(alone.stats(i)) == repr(ev.stats(i))
    a_sum, b_sum = alone.summary(), ev.summary()
    for f in a_sum.__dataclass_fields__:
        assert np.array_equal(getattr(a_sum, f), getattr(b_sum, f)), f
    if got_costs is not None:
        clear_caches()
        want = [point_costs(p) for p in ev.plans.lines]
        for mine, theirs in zip(got_costs, want, strict=True):
            for x, y in zip(mine, theirs, strict=True):
                assert x.layout is y.layout and x.window_rows == y.window_rows and np.array_equal(x.values, y.values)
    return counted


def _one_family(lines: list[Point]) -> bool:
    return len({replay_family.family_key(p) for p in lines}) == 1 and replay_family.family_key(lines[0]) is not None


@st.composite
def _lines(draw: st.DrawFn) -> list[Point]:
    start = draw(st.sampled_from([1, 255, 256, 4000, 65_280, 400_000])) + draw(st.integers(0, 600))
    step = draw(st.sampled_from([1, 127, 128, 256, 1000, 4096]))
    n = draw(st.integers(3, 14))
    spec = GridSpec(models=(draw(st.sampled_from(model_preset_names())),), hardware=(draw(st.sampled_from(HARDWARE)),),
                    cache_types=(draw(st.sampled_from(["f16", "q8_0", "q4_0"])),),
                    cache_types_v=(draw(st.sampled_from(["f16", "q8_0", "q4_0"])),),
                    kv_offload=(draw(st.sampled_from([True, True, False])),),
                    contexts=tuple((start + i * step,) for i in range(n)),
                    depths=tuple(draw(st.sets(st.integers(0, 14), min_size=1, max_size=3))),
                    budgets_mib=tuple(draw(st.sets(st.sampled_from([0.0, 16.0, 128.0, 1024.0]), min_size=1, max_size=2))),
                    tokens=draw(st.integers(1, 6)), kv_gpu_layers=(draw(st.integers(0, 6)),), pack_streams=draw(st.booleans()))
    pts = points(spec)
    if draw(st.booleans()):  # a cache size set (the window reaches it near the top)
        extra = draw(st.sampled_from([0, 1, 300])) + (not spec.kv_offload[0])  # the resident arm runs a token more
        wls = {id(p.workload): replace(p.workload, ctx_size=p.workload.contexts[0] + p.workload.tokens + extra) for p in pts}
        pts = [replace(p, workload=wls[id(p.workload)]) for p in pts]
    return pts


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(pts=_lines())
def test_random_lines_read_as_families_are_the_lines_read_alone(pts: list[Point], monkeypatch: pytest.MonkeyPatch) -> None:
    _both(pts, monkeypatch)


@pytest.mark.parametrize("arm", [True, False])
def test_a_family_of_the_memory_plans_shape_is_read_at_once(arm: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A BIG-shaped family (every 128 rows, 4 tokens, depths 0-14, two budgets, --kv-gpu-layers 2): every line read at
    once, every step of the transport arm from the family's matrix (the resident arm's from ``point_costs``)."""
    contexts = range(128, 20_000, 128)
    pts = points(GridSpec(contexts=tuple((c,) for c in contexts), depths=tuple(range(15)), budgets_mib=(0.0, 128.0), tokens=4,
                          kv_gpu_layers=(2,), kv_offload=(arm,)))
    lines, steps = _both(pts, monkeypatch)
    assert lines == len(contexts)  # (the resident arm: one point a line, depth 0)
    assert steps == (4 * lines if arm else 0)


def test_several_families_and_lines_alone_in_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Families interleaved with lines outside any family (two sequences, two devices' split, -ngl) in one batch: the
    same fields, and the envelope's error names the same first point."""
    base = GridSpec(contexts=tuple((c,) for c in range(4096, 30_000, 1024)), depths=(0, 1, 3), budgets_mib=(128.0,), tokens=3)
    pts = points(base) + points(replace(base, parallels=(2,))) + points(replace(base, kv_gpu_layers=(1,)))
    pts += points(replace(base, n_gpu_layers=(40,)))
    rng = np.random.default_rng(3)
    pts = [pts[i] for i in rng.permutation(len(pts))]
    lines, _ = _both(pts, monkeypatch)
    assert lines > 0
    outside = points(replace(base, pinned=False))
    mixed = pts[:7] + outside[:2] + pts[7:]
    clear_caches()
    with pytest.raises(ValueError, match="point 7 is outside the evaluator's envelope: pageable host cache"):
        evaluate_batch(mixed)


def test_families_that_share_cache_sizes_are_their_lines_read_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Families alike but for ``--kv-gpu-layers`` over the same contexts, beside one of another model and the same
    families on another machine, share each cache size's memory, io buffer and layout (``replay_family.sizes_key``):
    read as families in one batch, every line is the line read alone."""
    contexts = tuple((c,) for c in range(4000, 4000 + 24 * 700, 700))
    pts = points(GridSpec(contexts=contexts, kv_gpu_layers=(0, 1, 3), depths=(0, 2), tokens=2,
                          hardware=("rtx4070-gen4x16", "h200-gen5x16")))
    pts += points(GridSpec(models=("llama-3.1-8b",), contexts=contexts, kv_gpu_layers=(0, 2), depths=(2,), tokens=2))
    random.Random(7).shuffle(pts)
    lines, _ = _both(pts, monkeypatch)
    assert lines > len(pts) // 4
