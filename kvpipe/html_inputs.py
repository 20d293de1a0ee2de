"""The inputs of an HTML report: which kvpipe output a file is, read from its content and checked.

A file is a sweep's rows, a plan, a validation report or a Chrome trace; anything else raises
:class:`sim.errors.InputError` (one line naming the file and the kinds allowed). Reading blocks on the file only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.files import LARGE_LIMIT, parse_json, read_bytes, shown
from kvpipe.plots import check_rows
from sim.errors import InputError

KINDS = {
    "rows": "result rows (kvpipe sweep --out DIR, its rows.json, kvpipe simulate --json)",
    "plan": "a capacity plan (kvpipe plan --json)",
    "validate": "a validation report (kvpipe validate's report.json, or its folder)",
    "trace": "a Chrome trace (kvpipe simulate/validate --trace, .json or .json.gz)",
}
ALLOWED = "; ".join(KINDS.values())
ROW_FIELDS = ("model", "hardware", "cache_type", "context", "depth", "budget_mib", "tokens_per_s")
PLAN_FIELDS = ("context", "best_depth", "gain_by_depth", "ring_mib_by_depth")


@dataclass(frozen=True)
class Input:
    """One loaded input: where it came from, its kind (a key of KINDS), its content and what it recorded of its making."""

    path: str
    kind: str
    data: Any
    settings: dict[str, Any] = field(default_factory=dict)  # a sweep folder's sweep.json settings
    folder: bool = False  # a sweep written with --out (the folder was given)


# ------------------------------------------------------------------ loading


def _read_json(path: Path) -> Any:
    """A JSON (or gzipped JSON) input: read and inflated to at most LARGE_LIMIT bytes, nesting bounded. Raises InputError."""
    raw = read_bytes(path, "report input", LARGE_LIMIT, gz=True)
    try:
        return parse_json(raw, shown(path), allow_nan=True)
    except InputError as exc:
        why = str(exc).removeprefix(shown(path)).strip()
        raise InputError(f"{shown(path)} is not an output kvpipe report reads (not JSON: {why}); allowed: {ALLOWED}") from None


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _check(obj: Any, kind: str, where: str) -> None:
    """The fields each kind's section reads, typed: a string where a number belongs, a trace event without its
    ``pid``, a report without its summary's errors are one line naming the file, the item and the key."""
    if kind == "rows":
        check_rows(obj, where)
    elif kind == "plan":
        for i, p in enumerate(obj):
            if not _is_number(p["context"]) or not isinstance(p["gain_by_depth"], dict) or not isinstance(p["ring_mib_by_depth"], dict):
                raise InputError(f"{where} plan row {i}: context must be a number, gain_by_depth and ring_mib_by_depth "
                                 "objects; allowed: kvpipe plan --json")
    elif kind == "validate":
        s = obj["summary"]
        for key in ("points", "median_abs_error", "max_abs_error"):
            if not _is_number(s.get(key)):
                raise InputError(f"{where}: summary.{key} = {s.get(key)!r}; allowed: a number (kvpipe validate's report.json)")
        if not all(isinstance(p, dict) for p in obj["points"]):
            raise InputError(f"{where}: points must be objects; allowed: kvpipe validate's report.json")
    elif kind == "trace":
        for i, e in enumerate(obj["traceEvents"]):
            if not isinstance(e, dict) or e.get("ph") not in ("X", "M"):
                continue  # other events (counters, instants) are not drawn
            need = ("pid", "name", "ts") if e["ph"] == "X" else ("pid", "name")
            missing = [k for k in need if k not in e]
            if missing:
                raise InputError(f"{where} traceEvents[{i}] has no {missing[0]!r}; allowed: Chrome trace events with "
                                 f"{', '.join(need)}")
            bad = [k for k in ("ts", "dur") if k in e and not (_is_number(e[k]) and math.isfinite(e[k]))]
            if e["ph"] == "X" and bad:
                raise InputError(f"{where} traceEvents[{i}].{bad[0]} = {e[bad[0]]!r}; allowed: a finite number (µs)")
            if e["ph"] == "M" and e["name"] in ("process_name", "thread_name") and not isinstance((e.get("args") or {}).get("name"), str):
                raise InputError(f"{where} traceEvents[{i}] ({e['name']}) has no args.name; allowed: a Chrome trace's metadata")


def kind_of(obj: Any) -> str | None:
    """Which kind of kvpipe output ``obj`` (parsed JSON) is, from its fields; None if none. Does not block."""
    if isinstance(obj, dict):
        if isinstance(obj.get("traceEvents"), list):  # the JSON object format; the array format is a list of events
            return "trace"
        if isinstance(obj.get("points"), list) and isinstance(obj.get("summary"), dict) and "exactness" in obj:
            return "validate"
        return None
    if not isinstance(obj, list) or not obj or not all(isinstance(r, dict) for r in obj):
        return None
    if all(all(k in r for k in ROW_FIELDS) for r in obj):
        return "rows"
    if all(all(k in r for k in PLAN_FIELDS) for r in obj):
        return "plan"
    if all("ph" in r for r in obj):
        return "trace"
    return None


def load_inputs(path: str | Path) -> list[Input]:
    """The inputs in ``path``: a file, a sweep folder (rows.json) or a validate folder (report.json, and its trace
    if one lies beside it). Raises InputError naming the file and the kinds allowed. Blocks on the reads."""
    p = Path(path)
    if p.is_dir():
        if (p / "rows.json").is_file():
            manifest = _read_json(p / "sweep.json") if (p / "sweep.json").is_file() else {}
            (one,) = load_inputs(p / "rows.json")
            return [Input(str(p), "rows", one.data, manifest.get("settings", {}) if isinstance(manifest, dict) else {}, True)]
        if (p / "report.json").is_file():
            traces = [t for t in ("trace.json.gz", "trace.json") if (p / t).is_file()][:1]
            return [x for f in ["report.json", *traces] for x in load_inputs(p / f)]
        raise InputError(f"folder {str(p)!r} holds neither rows.json (a sweep) nor report.json (a validate report); allowed: {ALLOWED}")
    obj = _read_json(p)
    kind = kind_of(obj)
    if kind is None:
        what = "an empty list" if obj == [] else f"a JSON {'object' if isinstance(obj, dict) else 'value'} of none of these shapes"
        raise InputError(f"{str(p)!r} is not an output kvpipe report reads ({what}); allowed: {ALLOWED}")
    if kind == "trace" and isinstance(obj, list):
        obj = {"traceEvents": obj}
    _check(obj, kind, shown(p))
    return [Input(str(p), kind, obj)]


# ------------------------------------------------------------------ figures

