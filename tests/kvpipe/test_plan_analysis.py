"""The plan's analysis over arrays gives the per-context Python's answers: best depths, and the runs it takes from the
grid (held to the paths they replace)."""

from __future__ import annotations

import numpy as np

from kvpipe.plan import TIE_GAIN, _best_depth, _best_depths


def test_best_depths_as_arrays_are_the_best_depth_of_each_row() -> None:
    """``_best_depths`` over (budget, context, depth) equals ``_best_depth`` of each row's dict, bit for bit: ties within
    TIE_GAIN (just inside and just outside) to the shallower, rows with no positive gain (0, 0.0), a NaN row."""
    rng = np.random.default_rng(7)
    gains = rng.uniform(-0.5, 0.8, size=(4, 60, 9))
    gains[0, :10] = -rng.uniform(0.0, 1.0, size=(10, 9))  # none positive
    gains[1, :10, 3] = gains[1, :10].max(axis=1) + 0.25  # a clear best at depth 4
    gains[1, 10:20, 6] = gains[1, 10:20, 3] = gains[1, 10:20].max(axis=1) + 0.1  # an exact tie: the shallower
    gains[1, 20:30, 7] = gains[1, 20:30].max(axis=1) + 0.1
    gains[1, 20:30, 2] = gains[1, 20:30, 7] - TIE_GAIN * 0.5  # within the tie: depth 3 though lower
    gains[1, 30:40, 7] = gains[1, 30:40].max(axis=1) + 0.1
    gains[1, 30:40, 2] = gains[1, 30:40, 7] - TIE_GAIN * 4  # outside it: depth 8
    gains[2, :5] = 0.0

    def by_dict(g: np.ndarray) -> tuple[list, list]:  # type: ignore[type-arg]
        got = [[_best_depth(dict(zip(range(1, g.shape[-1] + 1), row, strict=True))) for row in plane] for plane in g.tolist()]
        return [[d for d, _ in plane] for plane in got], [[x for _, x in plane] for plane in got]

    d, g = _best_depths(gains)
    assert (d.tolist(), g.tolist()) == by_dict(gains)
    assert {x for plane in d.tolist() for x in plane} >= {0, 3, 4, 8}
    gains[3, 5, 4] = np.nan  # a NaN after the first depth: the dict path's max passes it over
    d, g = _best_depths(gains)
    assert (d.tolist(), g.tolist()) == by_dict(gains)
