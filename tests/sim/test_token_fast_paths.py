"""Round 27's shortcuts in the evaluator give, bit for bit, what the computation they replace gives.

* The token program (``sim.evaluator.token``): without a full-duplex slowdown a D2H copy re-decides no H2D copy (not
  kept, nothing invalidated); each consumer copy keeps the lowest and highest of its placed-before markers, so a copy
  placed in every lane or in none is not reduced again. Held to ``tests/sim/token_reference.py`` (the program as it
  was at main 304f006, unchanged) over random programs of many lanes -- enough that the H2D engine's order differs
  between lanes, so that a consumer copy is placed in some lanes at one transfer copy and in the others at a later one
  -- with long D2H copies that H2D copies start under, with and without a slowdown; and one program built so that a
  transfer copy must start under a D2H copy (the slowdown then changes its answer).
* A family's steps as rows of its matrix (``family_costs.FamilyRows``) and each lane group's matrix gathered from those
  rows (``evaluate._Sources``): every lane's row equal to ``np.stack`` of each lane's own TokenCosts' vector, as
  ``_run_lanes`` read them before, over random lanes of family lines, lines of their own and several families' matrices
  in one group.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_token_program import DEVICE, HOST, assert_same_fields
from token_reference import Setup as RefSetup
from token_reference import run_token as ref_run_token

from backends.profile_types import HostCosts
from sim.evaluator.costs import TokenCosts, layout_of
from sim.evaluator.family_costs import FamilyRows
from sim.evaluator.token import Setup, run_token

evaluate = importlib.import_module("sim.evaluator.evaluate")  # (the package's ``evaluate`` is a function)

#: Seconds that make copies queue behind each other by different amounts in different lanes, and long D2H copies.
SECONDS = (0.0, 1e-6, 2e-6, 5e-6, 2e-5, 5e-5, 1e-4, 3e-4, 1e-3)


@st.composite
def _programs(draw: st.DrawFn) -> tuple[Any, ...]:
    shape: list[tuple[str, int, int, int]] = [("gpu", draw(st.integers(0, 2)), 0, 1)]
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            shape.append(("cpu", draw(st.integers(1, 2)), 0, 1))
        shape.append(("gpu", draw(st.integers(0, 1)), draw(st.integers(1, 2)), 1))
    layout = layout_of(tuple(shape))
    lanes = draw(st.integers(8, 48))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    X = rng.choice(SECONDS, size=(lanes, layout.width))
    byte_cols = [b for c in layout.splits for _, b in (*c.ordered, *c.windows, c.early, c.late) if b >= 0]
    X[:, byte_cols] = rng.choice([0, 4096, 1 << 20, 1 << 24], size=(lanes, len(byte_cols)))
    depth = draw(st.integers(1, layout.staged + 1))
    n_slots = draw(st.integers(1, depth + 3))
    used = rng.random(lanes) < 0.5
    boundary = rng.random(lanes) < 0.5
    host = HostCosts(*(draw(st.sampled_from(HOST)) for _ in range(5)))
    dev = replace(DEVICE, duplex_slowdown=draw(st.sampled_from([1.0, 1.0, 1.5, 2.0])),
                  dram_bytes_per_s=draw(st.sampled_from([0.0, 1e9, 5e11])))
    return layout, X, (depth, n_slots, (), False), host, dev, used, boundary


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prog=_programs())
def test_random_programs_of_many_lanes_give_the_reference_programs_fields(prog: tuple[Any, ...]) -> None:
    layout, X, flags, host, dev, used, boundary = prog
    want = ref_run_token(layout, X, RefSetup(*flags), host, dev, used, boundary)
    got = run_token(layout, X.copy(), Setup(*flags), host, dev, used.copy(), boundary.copy())
    assert_same_fields(got, want)


def test_a_transfer_copy_under_a_d2h_copy_is_slowed_as_the_reference_slows_it() -> None:
    """Depth 3 over three staged splits after a CPU split: deliveries queue on the H2D engine while the CPU split
    copies its rows down (0.01 ms) and the host stores them (0.1 ms), so one starts under the D2H copy (found by a
    random search: without the D2H copy's record the program misses the slowdown, and the token ends 1 ms early)."""
    layout = layout_of((("gpu", 0, 0, 1), ("cpu", 1, 0, 1), ("gpu", 0, 1, 1), ("gpu", 0, 1, 1), ("gpu", 0, 1, 1)))
    X = np.array([[1e-06, 0.0001, 1e-05, 1 << 20, 1e-05, 1e-05, 1 << 20, 0.0001, 1 << 20, 0.0001, 1 << 20, 1e-06, 0.001,
                   1 << 20, 0.001, 1 << 20, 1e-05, 1 << 20, 0.0002, 0.0002, 1 << 20, 5e-05, 1 << 20, 0.0002, 1 << 20]])
    host = HostCosts(1e-6, 1e-6, 1e-6, 1e-6, 0.0)
    answers = []
    for slowdown in (1.0, 2.0):
        dev = replace(DEVICE, duplex_slowdown=slowdown, dram_bytes_per_s=0.0)
        want = ref_run_token(layout, X, RefSetup(3, 5, (False,) * 5), host, dev)
        assert_same_fields(run_token(layout, X.copy(), Setup(3, 5, (False,) * 5), host, dev), want)
        answers.append(want["total_s"])
    assert not np.array_equal(answers[0], answers[1])  # the case is exercised: the slowdown changed the token


@st.composite
def _sources(draw: st.DrawFn) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """Lines of two layouts: family lines on two or three matrices (rows from any first row) and lines of their own
    TokenCosts; lanes drawn over them, each (line, token) possibly repeated, in key order (line, then token)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n_tok = draw(st.integers(1, 5))
    layouts = [layout_of((("gpu", 1, 0, 1), ("gpu", 0, 1, 1))), layout_of((("gpu", 2, 0, 1),))]
    mats = [(lo, rng.random((n_tok * draw(st.integers(1, 6)), lo.width))) for lo in layouts for _ in range(draw(st.integers(1, 2)))]
    lines: list[Any] = []
    for _ in range(draw(st.integers(1, 12))):
        if draw(st.booleans()):
            lo, m = mats[draw(st.integers(0, len(mats) - 1))]
            first = draw(st.integers(0, len(m) - n_tok))
            lines.append(FamilyRows(lo, m, first, list(rng.integers(1, 999, n_tok))))
        else:
            lo = layouts[draw(st.integers(0, 1))]
            lines.append([TokenCosts(lo, rng.random(lo.width), int(rng.integers(1, 999))) for _ in range(n_tok)])
    pairs = rng.integers(0, len(lines) * n_tok, draw(st.integers(1, 40)))
    pairs.sort()
    li, k = np.divmod(pairs, n_tok)
    return lines, li, k


@settings(max_examples=200, deadline=None)
@given(src=_sources())
def test_lane_groups_read_from_family_rows_are_each_lanes_own_vector_stacked(src: tuple[list[Any], np.ndarray, np.ndarray]) -> None:
    lines, li, k = src
    got = evaluate._Sources(lines, li, k)
    own = [lines[a][b] for a, b in zip(li.tolist(), k.tolist(), strict=True)]  # each lane's TokenCosts, as before
    assert [got.layout_of[n] for n in got.lay.tolist()] == [c.layout for c in own]
    for lo in {id(c.layout): c.layout for c in own}.values():
        idx = np.array([j for j, c in enumerate(own) if c.layout is lo], dtype=np.int64)
        for sub in (idx, idx[::2], idx[-1:]):  # a group is any ascending subset of the lanes of one layout
            want = np.stack([own[j].values for j in sub.tolist()])
            X = got.values(sub, lo.width)
            assert X.dtype == want.dtype and X.shape == want.shape and X.tobytes() == want.tobytes()
