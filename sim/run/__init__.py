"""Running a point: ``run_point`` (``run``) and what it is built from.

``point`` (the point and its result), ``graphs`` (its decode graphs, kept for the last few points), ``decode`` (the
host program that hands them to the transport scheduler, on any machine), ``steady`` (the fast path's host program),
``checked`` (one run on one SimPy machine, under the race checker), ``run`` (``run_point``: warm-up, scaling, exact or
fast), ``tasks`` (the point planner's grouping of a grid into distinct runs) and ``row`` (a run as a result row).
"""
