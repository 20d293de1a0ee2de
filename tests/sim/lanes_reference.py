"""The evaluator's grouping of lanes into token programs as it was before Round 20 (``sim.evaluator.evaluate._run_lanes``
and ``_setup`` at main 304f006), over the reference token program (``token_reference``): the reference that
``test_token_program`` holds the evaluator's lanes to. Kept unchanged."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from token_reference import Setup, run_token

from sim.evaluator.costs import TokenCosts
from sim.evaluator.evaluate import BYTE_FIELDS, COUNT_FIELDS, TIME_FIELDS
from sim.replay import Plans


def _run_lanes(plans: Plans, costs_of: list[list[TokenCosts]], keys: np.ndarray, n_tok: int) -> dict[str, np.ndarray]:
    """Each lane's GraphStats fields: the lanes of one graph shape, depth (slots) and machine run as one matrix, each
    lane with its own slots-used and boundary flags (``run_token``'s ``used``/``boundary``: a line's first token and
    its later ones together); its rows in lane order, the groups in order of their first lane. The lanes are grouped
    as arrays: each lane's layout and machine numbered, one key per lane, one stable sort. Pure."""
    out = {f: np.zeros(len(keys), dtype=np.float64 if f in TIME_FIELDS else np.int64)
           for f in (*TIME_FIELDS, *BYTE_FIELDS, *COUNT_FIELDS)}
    if not len(keys):
        return out
    code, rest = keys % (1 << 24), keys >> 24
    li, k = np.divmod(rest, n_tok)
    lanes = [costs_of[a][b] for a, b in zip(li.tolist(), k.tolist(), strict=True)]
    layouts: dict[int, Any] = {}
    lay = np.fromiter((layouts.setdefault(id(c.layout), len(layouts)) for c in lanes), dtype=np.int64, count=len(lanes))
    layout_of = list({id(c.layout): c.layout for c in lanes}.values())  # numbered as ``layouts``
    machines: dict[int, int] = {}
    hw_of_line = np.array([machines.setdefault(id(p.hardware), len(machines)) for p in plans.lines], dtype=np.int64)
    hardware = list({id(p.hardware): p.hardware for p in plans.lines}.values())
    # a code (``_setup``): 0/1 ordered without/with the boundary wait; else 2 + ((depth * 64 + n_slots) * 2 + used) * 2
    # + before. Its frame: the depth and slots alone (fresh slots, no wait); the flags per lane.
    piped = code >= 2
    frame = np.where(piped, (code - 2) // 4 * 4 + 2, 0)
    used = piped & ((code - 2) // 2 % 2 == 1)
    boundary = np.where(piped, (code - 2) % 2 == 1, code == 1)
    group = (lay * (1 << 24) + frame) * len(hardware) + hw_of_line[li]
    order = np.argsort(group, kind="stable")
    bounds = np.flatnonzero(np.diff(group[order])) + 1
    parts = sorted(np.split(order, bounds), key=lambda idx: int(idx[0]))  # groups by their first lane
    for idx in parts:
        j0 = int(idx[0])
        hw, layout = hardware[int(hw_of_line[li[j0]])], layout_of[int(lay[j0])]
        st = run_token(layout, np.stack([lanes[j].values for j in idx.tolist()]), _setup(int(frame[j0]), layout.staged),
                       hw.host, hw.devices[0], used[idx], boundary[idx])
        for f in TIME_FIELDS:
            out[f][idx] = st[f]
        for f in (*BYTE_FIELDS, *COUNT_FIELDS):
            out[f][idx] = np.asarray(st[f]).astype(np.int64)
    return out


@functools.lru_cache(maxsize=4096)
def _setup(code: int, staged: int) -> Setup:
    """The ring decision a lane key's code names (see ``evaluate_batch``): ordered, or depth N over ``n_slots`` slots,
    fresh or already used by ``staged`` deliveries, with or without the boundary wait."""
    if code < 2:
        return Setup(boundary=bool(code))
    code -= 2
    before, code = code % 2, code // 2
    used, code = code % 2, code // 2
    depth, n_slots = divmod(code, 64)
    return Setup(depth, n_slots, tuple(bool(used) and o < min(staged, n_slots) for o in range(n_slots)), bool(before))


