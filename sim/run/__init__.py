"""Running a point: ``run_point`` (``sim.run.run``) and what it is built from.

``point`` (the point, its decode graphs and its result), ``decode`` (the host programs that hand the graphs to the
transport scheduler, on any machine: every token, or the fast path's steady tokens), ``run`` (``run_point``: warm-up,
scaling, exact or fast; and ``check``, one run on one SimPy machine under the race checker) and ``tasks`` (the point
planner's grouping of a grid into distinct runs). The row a run becomes is ``sim.rows.row``.
"""
