"""The token program (``sim.evaluator.token.run_token``) gives every field the program it replaced gives, bit for bit.

``tests/sim/token_reference.py`` is the token program as it was before Round 20 (main at 304f006), kept unchanged as
the reference. Random programs over lanes (hypothesis): layouts of ordered inputs, CPU splits' D2H copies, staged
splits of one or two windows and GPU splits without any; costs drawn from a few values so that ties are common (two
copies asking for the engine at the same time, a kernel ending as a copy starts), zero seconds and zero bytes among
them; depths 0 to past the staged splits, slots from one to depth + 3, each lane's slots used and boundary wait its
own or the setup's; host costs with zeros; a full-duplex slowdown or none, device memory bandwidth low, high or none.
Every field must be equal in value, dtype and type (a count a number or an array as before), and the evaluator's lanes
over random lines of the envelope (``test_replay_family``'s lines) must be those of the reference program.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lanes_reference import _run_lanes as ref_run_lanes
from token_reference import Setup as RefSetup
from token_reference import run_token as ref_run_token

from backends.profile import load_profile
from backends.profile_types import HostCosts
from sim.evaluator import clear_caches
from sim.evaluator.costs import layout_of
from sim.evaluator.token import Setup, run_token
from sim.points import GridSpec, points
from sim.run.point import clear_graph_cache

evaluate = importlib.import_module("sim.evaluator.evaluate")  # (the package's ``evaluate`` is a function)

DEVICE = load_profile("h200-gen5x16").devices[0]
SECONDS = (0.0, 1e-6, 2e-6, 3e-6, 5e-6, 1e-5, 2.5e-5, 1e-4, 3e-4)
HOST = (0.0, 1e-6, 2e-6, 3e-6, 5e-6)


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if not isinstance(a, np.ndarray):
        return bool(a == b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_same_fields(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for k in want:
        assert _same(got[k], want[k]), k


@st.composite
def _programs(draw: st.DrawFn) -> tuple[Any, ...]:
    shape: list[tuple[str, int, int, int]] = [("gpu", draw(st.integers(0, 4)), 0, draw(st.integers(0, 2)))]
    for _ in range(draw(st.integers(0, 7))):
        kind = draw(st.sampled_from(["cpu+staged", "staged", "cpu", "gpu"]))
        if kind.startswith("cpu"):
            shape.append(("cpu", draw(st.integers(0, 2)), 0, 1))
        if kind.endswith("staged"):
            shape.append(("gpu", draw(st.integers(0, 1)), draw(st.integers(1, 2)), draw(st.integers(1, 2))))
        if kind == "gpu":
            shape.append(("gpu", draw(st.integers(0, 2)), 0, 1))
    layout = layout_of(tuple(shape))
    lanes = draw(st.integers(1, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    X = rng.choice(SECONDS, size=(lanes, layout.width))
    byte_cols = [b for c in layout.splits for _, b in (*c.ordered, *c.windows, c.early, c.late) if b >= 0]
    X[:, byte_cols] = rng.choice([0, 4096, 1 << 20, 3 << 20, 1 << 24], size=(lanes, len(byte_cols)))
    depth = draw(st.integers(0, layout.staged + 1))
    near = st.sampled_from([max(1, layout.staged - 1), max(1, layout.staged)])  # (the slots that decide a shared matrix)
    n_slots = draw(st.one_of(st.integers(1, depth + 3), near)) if depth else 0
    per_lane = draw(st.booleans())
    used = rng.random(lanes) < 0.5 if per_lane else None
    boundary = rng.random(lanes) < 0.5 if per_lane else None
    setup_used = tuple(draw(st.booleans()) for _ in range(n_slots))
    flags = (depth, n_slots, setup_used, draw(st.booleans()))
    host = HostCosts(*(draw(st.sampled_from(HOST)) for _ in range(5)))
    dev = replace(DEVICE, duplex_slowdown=draw(st.sampled_from([1.0, 1.1608, 2.0])),
                  dram_bytes_per_s=draw(st.sampled_from([0.0, 1e9, 5e11, 4.8e12])))
    return layout, X, flags, host, dev, used, boundary


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prog=_programs())
def test_random_programs_give_the_reference_programs_fields(prog: tuple[Any, ...]) -> None:
    layout, X, flags, host, dev, used, boundary = prog
    want = ref_run_token(layout, X, RefSetup(*flags), host, dev, used, boundary)
    got = run_token(layout, X.copy(), Setup(*flags), host, dev, None if used is None else used.copy(),
                    None if boundary is None else boundary.copy())
    assert_same_fields(got, want)
    depth, n_slots, _, _ = flags
    S = layout.staged
    if used is not None and depth >= max(S - 1, 1) and n_slots >= S:  # what lets ``_run_lanes`` share one matrix
        shared = run_token(layout, X, Setup(max(S - 1, 1), max(S, 1)), host, dev, used, boundary)
        assert_same_fields(shared, want)


def _lanes(pts: list[Any], run_lanes: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, np.ndarray]:
    clear_caches()
    clear_graph_cache()
    with monkeypatch.context() as m:
        m.setattr(evaluate, "_run_lanes", run_lanes)
        ev = evaluate.evaluate_batch(pts)
    return {**ev.fields, "lane": ev.lane}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(pts=st.deferred(lambda: _family_lines()))
def test_random_lines_give_the_reference_programs_lanes(pts: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The evaluator's lanes (grouped as now: every depth that issues all its deliveries at the start in one matrix)
    against the reference grouping and program, bit for bit."""
    want = _lanes(pts, ref_run_lanes, monkeypatch)
    got = _lanes(pts, evaluate._run_lanes, monkeypatch)
    assert_same_fields(got, want)


@pytest.mark.parametrize("kv_gpu_layers", [0, 5, 14])
def test_the_memory_plans_depths_give_the_reference_programs_lanes(kv_gpu_layers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A BIG-shaped family (every 128 rows, 4 tokens, depths 0-14, two budgets): its depths past the staged splits
    share a matrix; every lane the reference's."""
    pts = points(GridSpec(contexts=tuple((c,) for c in range(128, 6_000, 128)), depths=tuple(range(15)),
                          budgets_mib=(0.0, 128.0), tokens=4, kv_gpu_layers=(kv_gpu_layers,)))
    want = _lanes(pts, ref_run_lanes, monkeypatch)
    got = _lanes(pts, evaluate._run_lanes, monkeypatch)
    assert_same_fields(got, want)


def _family_lines() -> Any:
    from test_replay_family import _lines

    return _lines()
