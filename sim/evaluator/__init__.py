"""The compiled token evaluator: a decode token of the transport scheduler as vectorised NumPy, held to the simulator.

A steady decode token is a fixed program once its ring decision is known: the host thread's calls
(``sim.transport.scheduler``), two streams and one FIFO copy engine per direction on the SimPy machine's rules.
Its timing is then a max-plus recurrence that needs no event queue. This package evaluates that recurrence for
many points at once: every (point, token) is a lane; lanes whose graphs have the same shape and whose rings made the
same decision run as one NumPy matrix, the copy engine's serving order decided per lane with ``np.where``. The ring
decisions are not made here: ``sim.replay.plan_points`` runs the scheduler's own planning rules
(``sim.transport.planning``) for the whole batch at once, and the points of a line (the same but for depth and budget)
whose decision at a token is the same share that token's lane.

API (what a caller such as the planner or ``kvpipe sweep`` uses)::

    from sim.evaluator import in_envelope, evaluate, check_sample, EvaluatorDisagreement

    inside = [p for p in points if in_envelope(p) is None]   # None: the evaluator answers it; else a reason
    rows = evaluate(inside)                                  # one row per point, in order
    worst = check_sample(inside, rows)                       # re-simulates >= 32 points and every boundary

* ``in_envelope(point) -> str | None``: it answers one device, pinned host memory, any number of sequences, any
  ``--kv-gpu-layers`` and ``-ngl``, the ``transport`` arm at depth 0 (ordered) or 1..14 (pipelined) and any budget,
  the ``resident`` arm (pinned or pageable; its first graph, the cache's load, a warm-up left out of the row as
  ``sim.run.run.run_point`` leaves it out), no mutation (functional runs and traces are the simulator's); anything
  else gets a one-line reason, and the caller simulates it (``sim.run.run.run_point``).
* ``evaluate(points) -> list[dict]``: the row ``sim.rows.row`` makes for a simulated point -- every field of
  it, each token evaluated (none extrapolated) -- plus ``engine: "evaluator"``, ``tokens_simulated: 0``,
  ``simulated_as`` (the point's own depth and budget) and ``shared_with_n: 1``; no ``hazards`` (no race checker
  ran). Raises ValueError for a point outside the envelope and ``backends.base.OutOfDeviceMemory`` for one whose
  graph does not fit (as the simulator does). Pure and deterministic; CPU only.
* ``evaluate_stats(points) -> list[list[GraphStats]]``: the per-token stats behind the rows.
* ``summarize(points) -> Summary``: every point's figures as arrays (t/s, ms, declined, ring, ...), no rows: what a
  plan of half a million points reads.
* ``check_sample(points, rows, n=32, seed=0) -> float``: re-simulates ``n`` rows drawn with ``seed`` plus every row
  where the best depth or the decline changes between neighbouring contexts, on the simulator's default path (the
  steady tokens extrapolated, no race checker; a row that differs by more than 1e-9 again exact, which decides),
  returns the largest relative disagreement, raises ``EvaluatorDisagreement`` above 1e-9. Blocks for the
  simulations (a few to tens of ms each).
* ``row_disagreement(a, b) -> float``: the comparison both use (relative, over every numeric field; ``inf`` where a
  flag or a string differs).

Held to the simulator by ``tests/sim/test_evaluator.py``: the 1,020-point figures grid (and its contexts on the resident
arm, four machines) against ``kvpipe sweep --exact`` rows, and random points of the envelope against
``run_checked(point, exact=True)``, within 1e-9.

Modules: ``envelope`` (in_envelope), ``costs`` (a token's numbers, read off the graph), ``token`` (the program over
lanes), ``evaluate`` (grouping, stats, rows), ``check`` (comparison, sample check). Units: seconds and bytes.
"""

from __future__ import annotations

from sim.evaluator.check import EvaluatorDisagreement, check_sample, row_disagreement
from sim.evaluator.envelope import in_envelope
from sim.evaluator.evaluate import Summary, evaluate, evaluate_stats, summarize


def clear_caches() -> None:
    """Forget every kept number, shape and envelope verdict (a timing that must build them, as ``kvpipe bench`` does)."""
    from sim.evaluator import costs, envelope
    from sim.replay import clear_shapes

    costs.clear_costs()
    envelope.clear_reasons()
    clear_shapes()


__all__ = ["EvaluatorDisagreement", "Summary", "check_sample", "clear_caches", "evaluate", "evaluate_stats", "in_envelope",
           "row_disagreement", "summarize"]
