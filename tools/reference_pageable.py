"""The reference card's pageable host cache, fitted from the one published ordered row that has one.

The reference published, at context 13,128 on the ordered path (depth 0), the same run with the host cache pinned
(``--kv-cpu-pinned``) and pageable (``/work/shared/reference/seed-ordered-rows.json``, ``host_memory_13128``). Every
pinned number of ``rtx4070-gen4x16`` is derived elsewhere (``tools/reference_derivation.py``) from other published
rows; the pageable row adds one number to them: the host's staging rate, the flat ``h2d_pageable`` rate whose simulated
ordered token (``validate.link_fit.fit_h2d``, the driver's chunked staging of ``backends/simpy_machine.py``) takes the
published time. What one row cannot determine, and stays as it was: the fixed cost of a pageable copy apart from its
rate (its latency is the pinned link's; the driver's sync and wake-up are in the rate), the curve's shape over copy
sizes (the row's window copies are all one size, 13,312 rows of one layer's K or V), and the device-to-host pageable
curve (the H200 probe's, borrowed). The pinned row is not fitted: it checks the pinned preset.

A library for ``tools/reference_derivation.py``; units: the published t/s, GB/s and us in the record and preset.
Blocks for the fit's simulations (about a second).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.workload import Workload
from validate.link_fit import fit_h2d
from validate.token_sim import TokenRun, simulated_s

#: Published, depth 0 (the ordered path), context 13,128, the reference model with a q8_0 cache, t/s.
HOST_MEMORY_13128 = {"context": 13128, "pinned_ordered_tps": 21.582, "pageable_ordered_tps": 14.945}
SOURCE = "/work/shared/reference/seed-ordered-rows.json host_memory_13128 (published: ordered, depth 0, context 13,128)"


def fit_pageable(preset: dict[str, Any], workload_at: Callable[..., Workload]) -> dict[str, Any]:
    """The flat ``h2d_pageable`` rate of ``preset`` (its pinned numbers derived) that the published pageable ordered row
    takes, as a record: ``GBps``, ``latency_us`` (kept), the simulated pinned and pageable rows beside the published
    ones. ``workload_at(context, tokens=...)`` is the reference workload. Blocks (simulations)."""
    ctx = HOST_MEMORY_13128["context"]
    wl = workload_at(ctx)
    run = TokenRun(ctx, 1.0 / HOST_MEMORY_13128["pageable_ordered_tps"], "ordered", "published pageable ordered 13,128",
                   pinned=False)
    rate = round(fit_h2d(preset, wl.model, wl.cache_k, wl.cache_v, [run]), 3)
    link = {"latency_us": preset["devices"][0]["links"]["h2d_pinned"]["latency_us"], "points": [[1.0, rate]]}
    fitted = {**preset, "devices": [{**d, "links": {**d["links"], "h2d_pageable": link}} for d in preset["devices"]]}
    pinned_wl = Workload(wl.model, wl.cache_k, wl.cache_v, wl.contexts, tokens=wl.tokens, pinned=True)
    pageable_wl = Workload(wl.model, wl.cache_k, wl.cache_v, wl.contexts, tokens=wl.tokens, pinned=False)
    return {
        "GBps": rate, "latency_us": link["latency_us"], "link": link, "inputs_source": SOURCE,
        "published_pageable_tps": HOST_MEMORY_13128["pageable_ordered_tps"],
        "sim_pageable_tps": 1.0 / simulated_s(fitted, pageable_wl, "ordered"),
        "published_pinned_tps": HOST_MEMORY_13128["pinned_ordered_tps"],
        "sim_pinned_tps_check": 1.0 / simulated_s(fitted, pinned_wl, "ordered"),
    }


PROVENANCE = {
    "devices.links.h2d_pageable": (
        "fitted from published numbers: the one pageable ordered row (13,128, depth 0) gives the host's staging rate, a "
        "flat curve; not determined by it: a pageable copy's fixed cost apart from the rate (the latency is the pinned "
        "link's), the curve's shape over copy sizes (the row's window copies are one size), the pinned row is a check"),
    "devices.links.d2h_pageable": "borrowed from the H200 probe (measured on another device): an estimate",
}
