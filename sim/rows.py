"""One row schema: which fields of a result row identify its point, and the one rule for a row's gain.

A row (``sim.run.row.row``) carries its grid coordinates (``KEY_FIELDS``) beside its figures. Rows written before
a coordinate existed lack it; ``KEY_DEFAULTS`` says what they meant. ``key_of_row`` turns a row into the hashable key
the sweep's journal, resume and de-duplication use.

The gain of a row is its tokens/s over the *ordered path* of the same point: the depth-0 row of the ``transport``
arm with the same coordinates but depth, budget and arm (the ordered path does not depend on the budget). Every arm is
measured against that one baseline, so a resident (``-nkvo 0``) row says what keeping the cache on the device buys,
and a pipelined row's gain does not depend on which arm a grid listed first. Rows of a grid without an ordered
transport row take the depth-0 row of their own arm (upstream llama.cpp's ``host-attention`` grids); none: ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

#: Row fields that identify a point (its grid coordinates).
KEY_FIELDS = ("model", "hardware", "cache_type", "context", "contexts", "parallel", "unified", "split_mode", "depth",
              "budget_mib", "tokens", "arm", "cache_type_v", "kv_gpu_layers", "n_gpu_layers")
#: Key fields rows written before they existed lack, and the value those rows meant (rows of the default placement
#: still lack the last two: ``sim.run.row.placement_fields``).
KEY_DEFAULTS = {"arm": "transport", "kv_gpu_layers": 0, "n_gpu_layers": "all"}
#: The coordinates a gain's baseline may differ in.
BASELINE_FREE = ("depth", "budget_mib", "arm")

Key = tuple[Any, ...]


def key_of_row(r: dict[str, Any]) -> Key:
    """The grid coordinates of a result row (lists as tuples, budget as float). Raises KeyError for a row without them."""
    return tuple(_norm(k, r[k] if k in r else _default(r, k)) for k in KEY_FIELDS)


def _default(r: dict[str, Any], field: str) -> Any:
    """A key field that rows written before it existed lack: the value they meant. KeyError for any other."""
    if field == "cache_type_v":
        return r["cache_type"]  # the V cache was the K cache's type
    return KEY_DEFAULTS[field]


def _norm(field: str, value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(int(v) for v in value)
    if field == "budget_mib":
        return float(value)
    if field in ("context", "parallel", "depth", "tokens", "kv_gpu_layers"):
        return int(value)
    if field == "unified":
        return bool(value)
    return str(value)


def _base_key(r: dict[str, Any]) -> Key:
    return tuple(_norm(k, r[k] if k in r else _default(r, k)) for k in KEY_FIELDS if k not in BASELINE_FREE)


def gains(rows: Sequence[dict[str, Any]]) -> list[float | None]:
    """Each row's gain over its ordered path (see the module), in the rows' order. Pure."""
    ordered: dict[Key, float] = {}
    own: dict[tuple[Key, str], float] = {}
    for r in rows:
        if r["depth"] == 0 and r.get("tokens_per_s"):
            arm = r.get("arm", "transport")
            own.setdefault((_base_key(r), arm), r["tokens_per_s"])
            if arm == "transport":
                ordered.setdefault(_base_key(r), r["tokens_per_s"])
    out: list[float | None] = []
    for r in rows:
        k = _base_key(r)
        b = ordered.get(k) or own.get((k, r.get("arm", "transport")))
        out.append(r["tokens_per_s"] / b - 1.0 if b else None)
    return out


def with_gains(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with ``gain`` added (:func:`gains`). Pure."""
    rows = list(rows)
    return [{**r, "gain": g} for r, g in zip(rows, gains(rows), strict=True)]
