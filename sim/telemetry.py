"""Telemetry out: readable tables, CSV/JSON rows and Chrome traces.

Rows are plain dicts (see ``sim.rows.row``); a timeline is a list of
``backends.base.Span``. Both machines produce the same shapes, so a GPU trace
opens beside a simulated one in Perfetto (ui.perfetto.dev) or
chrome://tracing. Files are written atomically: a temporary file renamed into
place, so a failed run leaves nothing half-written.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from backends.base import Span
from sim.rows import gains
from sim.safe_write import write_output

TRACK_ORDER = ("host", "consumer", "transfer", "h2d", "d2h")


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` safely (``sim.safe_write.write_output``). Raises InputError. Blocks on the write."""
    write_output(path, text)


def flatten(row: dict[str, Any]) -> dict[str, Any]:
    """One level of nesting flattened: ``breakdown_ms.total`` and friends."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                out[f"{k}.{k2}"] = v2
        elif isinstance(v, list | tuple):
            out[k] = json.dumps(v)
        else:
            out[k] = v
    return out


def rows_to_csv(rows: Sequence[dict[str, Any]]) -> str:
    flat = [flatten(r) for r in rows]
    fields: dict[str, None] = {}  # every row's keys, in first-seen order
    for r in flat:
        fields.update(dict.fromkeys(r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(fields), extrasaction="ignore")  # every key is a field: skip its per-row check
    w.writeheader()
    w.writerows(flat)
    return buf.getvalue()


def _track_key(track: str) -> tuple[int, str]:
    for i, prefix in enumerate(TRACK_ORDER):
        if track.startswith(prefix):
            return i, track
    return len(TRACK_ORDER), track


def chrome_trace(timelines: Iterable[tuple[str, Sequence[Span]]]) -> dict[str, Any]:
    """A Chrome trace (JSON object format): one process per labelled timeline, one thread per track; each span's
    kind (``backends.base.SpanKind``) is its event's category (``cat``)."""
    events: list[dict[str, Any]] = []
    for pid, (label, spans) in enumerate(timelines):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        tracks = sorted({s.track for s in spans}, key=_track_key)
        tid_of = {t: i for i, t in enumerate(tracks)}
        for t, tid in tid_of.items():
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": t}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        for s in spans:
            events.append(
                {
                    "ph": "X",
                    "name": s.name,
                    "cat": s.kind.value,
                    "pid": pid,
                    "tid": tid_of[s.track],
                    "ts": s.start_s * 1e6,
                    "dur": max(0.0, (s.end_s - s.start_s) * 1e6),
                    "args": dict(s.args),
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _band_cell(r: dict[str, Any]) -> str:
    """The +- column: the relative half-width of the row's interval, or ``uncal.`` where the profile has none."""
    iv = r.get("tokens_per_s_interval")
    if not iv or not r.get("tokens_per_s"):
        return "uncal."
    return f"{(iv[1] - r['tokens_per_s']) / r['tokens_per_s']:.1%}"


def table(rows: Sequence[dict[str, Any]]) -> str:
    """A readable fixed-width table of result rows, with the gain over depth 0."""
    head = ["model", "hw", "cache", "context", "window", "depth", "budget", "t/s", "+-", "ms/tok", "gain", "ring MiB",
            "early", "late", "ordered", "blocked ms", "consumer ms", "note"]
    lines = [head]
    for r, g in zip(rows, gains(rows), strict=True):
        b = r["breakdown_ms"]
        note = ("declined: " + r["decline_reason"]) if r["declined"] else ""
        if r.get("weights_fit") is False:  # first: nothing else about the point matters (kvpipe plan gives the -ngl that fits)
            note = f"weights {r['weights_gib']:.1f} GiB do not fit the devices' {r['devices_gib']:.1f} GiB: lower -ngl (kvpipe plan)"
        elif r.get("fits") is False:
            note = f"does not fit: {r['fit_reason']}"
        if r.get("arm", "transport") != "transport":
            note = (note + "; " if note else "") + {"resident": "resident: the cache on the device (-nkvo 0)",
                                                    "host-attention": "host attention: upstream llama.cpp's -nkvo, attention on the CPU",
                                                    }.get(r["arm"], "copy-only: deliveries, no kernels")
        if r.get("kv_gpu_layers"):
            note = (note + "; " if note else "") + f"kv-gpu-layers {r['kv_gpu_layers']}"
        if r.get("n_gpu_layers") is not None:
            cost = " (CPU layers at an estimated host rate)" if r.get("cpu_layers_cost") == "estimate" else ""
            note = (note + "; " if note else "") + f"-ngl {r['n_gpu_layers']}{cost}"
        if r.get("cache_type_v", r["cache_type"]) != r["cache_type"]:
            note = (note + "; " if note else "") + f"V cache {r['cache_type_v']}"
        if r.get("calibrated_entry", "").startswith("none"):
            note = (note + "; " if note else "") + "no calibrated entry for this model and cache type: the device's compute"
        if r.get("scaled_from"):
            src = r["scaled_from"]
            where = ", ".join(f"{c:,}" for c in src["contexts"])
            note = (note + "; " if note else "") + f"functional: scaled from {src['model']} at {where}"
        if r.get("mutation_note"):
            note = (note + "; " if note else "") + r["mutation_note"]
        if r.get("hazards"):
            note = (note + "; " if note else "") + f"{r['hazards']} hazards"
        lines.append([
            r["model"], r["hardware"], r["cache_type"], f"{r['context']:,}", f"{r['window_rows']:,}", str(r["depth"]),
            "none" if not r["budget_mib"] else f"{r['budget_mib']:g}",
            f"{r['tokens_per_s']:.2f}", _band_cell(r), f"{r['ms_per_token']:.2f}", "" if g is None else f"{g:+.1%}",
            f"{r['ring_mib']:.1f}", f"{r['early_mib']:.1f}", f"{r['late_mib']:.2f}", f"{r['ordered_mib']:.2f}",
            f"{b['blocked_in_ordered_copies']:.2f}", f"{b['waiting_for_consumer']:.2f}", note,
        ])
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    out = []
    for n, line in enumerate(lines):
        cells = enumerate(zip(line, widths, strict=True))
        out.append("  ".join(str(c).rjust(w) if 3 <= i < 17 else str(c).ljust(w) for i, (c, w) in cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
