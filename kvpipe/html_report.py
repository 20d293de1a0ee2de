"""One self-contained HTML page from kvpipe's outputs: sweeps, plans, validation reports, traces.

A report is read back from what the other commands wrote, never re-run: the
result rows of ``kvpipe sweep --out DIR`` (the folder or its ``rows.json``)
and of ``kvpipe simulate --json``, the contexts of ``kvpipe plan --json``, a
validation ``report.json`` (or its folder) and a Chrome trace
(``--trace``). :func:`load_inputs` tells which one a file is from its content
and raises :class:`sim.errors.InputError` (one line naming the file and the
kinds allowed) for anything else. :func:`page` draws each input with the
plotting functions the other commands use (``kvpipe.plots``,
``validate.report_tools.plots``) as inline SVG, lays out its tables -- every
numeric cell keeps the input's value in ``data-value`` -- and names the
command that produced it: as recorded in the file, else the grid its rows
span as kvpipe flags, said to be rebuilt.

The page needs nothing at view time: CSS inline, no script, text of the
figures drawn as paths (no fonts), and a Content-Security-Policy that forbids
every fetch. The same inputs give the same bytes (SVG ids salted per figure,
no dates in the SVG). Units: those of the inputs' field names.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from backends.files import shown
from kvpipe.html_inputs import ALLOWED, KINDS, Input, load_inputs
from kvpipe.html_parts import (
    CSP,
    MAX_GROUPS,
    TARGET_MAX_ERR,
    Col,
    Figures,
    _band,
    _commands,
    _drawn,
    _values,
    apct,
    f1,
    f2,
    grid_command,
    mib,
    pct,
    plan_command,
    table,
    thousands,
)
from sim.errors import InputError
from validate.report_md import driver_text

__all__ = ["ALLOWED", "CSP", "load_inputs", "page"]  # what the command and the tests read here


ROW_COLS = (
    Col("model", "model"), Col("hardware", "hardware"), Col("cache", "cache_type"), Col("context", "context", thousands),
    Col("window rows", "window_rows", thousands), Col("arm", lambda r: r.get("arm", "transport")), Col("depth", "depth"),
    Col("budget MiB", "budget_mib", mib), Col("t/s", "tokens_per_s", f2),
    Col("+-", lambda r: _band(r)), Col("ms/token", "ms_per_token", f2),
    Col("gain", "gain", pct), Col("ring MiB", "ring_mib", f1), Col("early MiB", "early_mib", f1), Col("late MiB", "late_mib", f2),
    Col("ordered MiB", "ordered_mib", f2), Col("blocked ms", "breakdown_ms.blocked_in_ordered_copies", f2),
    Col("consumer ms", "breakdown_ms.waiting_for_consumer", f2),
    Col("declined", lambda r: (r.get("decline_reason") or "declined") if r.get("declined") else ""),
)


def _rows_section(inp: Input, figs: Figures) -> str:
    from kvpipe import plots
    from kvpipe.sweep import gain_rows

    rows = gain_rows(inp.data)
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["hardware"], r["cache_type"], r.get("parallel", 1)), []).append(r)
    out = [f"<p>{len(rows)} rows; {len(groups)} model/hardware/cache type combinations; contexts "
           f"{html.escape(', '.join(f'{c:,}' for c in _values(rows, 'context')))}; depths "
           f"{html.escape(', '.join(map(str, _values(rows, 'depth'))))}.</p>"]
    verb, tail = ("sweep", ["--out", inp.path]) if inp.folder else ("simulate", ["--json"])
    out.append(_commands([], grid_command(rows, verb, inp.settings, tail), " (the grid its rows span, as flags)"))
    for (model, hw, cache, par), grp in list(groups.items())[:MAX_GROUPS]:
        what = f"{model} {cache} on {hw}" + (f" x{par}" if par != 1 else "")
        out.append(f"<h3>{html.escape(what)}</h3>")
        out.append(_drawn(figs, partial(plots.gain_vs_depth, grp), f"gain vs depth: {what}"))
        if len({r["context"] for r in grp}) > 1:
            out.append(_drawn(figs, partial(plots.gain_vs_context, grp), f"gain vs context: {what}"))
            out.append(_drawn(figs, partial(plots.ring_vs_context, grp), f"ring per context against the budgets: {what}"))
    if len(groups) > MAX_GROUPS:
        out.append(f'<p class="note">{len(groups) - MAX_GROUPS} more combinations are in the table, not drawn.</p>')
    return "".join(out) + "<h3>Rows</h3>" + table(rows, ROW_COLS, "rows")


PLAN_COLS = (
    Col("context", "context", thousands), Col("window rows", "window_rows", thousands), Col("best depth", "best_depth"),
    Col("uncapped gain", "uncapped_gain", pct), Col("budget for full gain MiB", "budget_mib_for_full_gain", f1),
    Col("default budget MiB", "default_budget_mib", mib), Col("gain at default budget", "gain_at_default_budget", pct),
    Col("declines at default", "default_declines", lambda v: "yes" if v else "no"),
    Col("gain per MiB", "gain_per_mib", lambda v: f"{100 * v:.3f} %/MiB"), Col("copy ms", "copy_ms", f2),
    Col("compute ms", "compute_ms", f2), Col("ordered t/s", "ordered_tokens_per_s", f2),
    Col("uncapped t/s", "uncapped_tokens_per_s", f2),
)


def plan_rows(plans: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A plan's uncapped gain and ring per (context, depth) as result rows ``kvpipe.plots`` draws."""
    out = []
    for p in plans:
        for d, gain in p["gain_by_depth"].items():
            out.append({"model": p.get("model", "model not recorded"), "hardware": p.get("hardware", "hardware not recorded"),
                        "cache_type": p.get("cache_type", "?"), "context": p["context"], "window_rows": p["window_rows"],
                        "depth": int(d), "budget_mib": 0.0, "gain": gain, "ring_mib": p["ring_mib_by_depth"][d],
                        "declined": False, "decline_reason": ""})
    return out


def _plan_section(inp: Input, figs: Figures) -> str:
    from kvpipe import plots

    plans, rows = inp.data, plan_rows(inp.data)
    budgets = sorted({p["default_budget_mib"] for p in plans if p.get("default_budget_mib")})
    out = [_commands([], plan_command(plans), "" if plans[0].get("model") else
                     " (kvpipe plan --json keeps neither the model nor the hardware: add the --model and --hardware used)")]
    out.append(_drawn(figs, lambda: plots.gain_vs_depth(rows), "gain vs depth per context (uncapped ring)",
                      "plan: gain vs look-ahead depth per context (no budget cap)"))
    if len(plans) > 1:
        out.append(_drawn(figs, lambda: plots.gain_vs_context(rows), "gain vs context per depth (uncapped ring)",
                          "plan: gain vs context per depth (no budget cap)"))
        out.append(_drawn(figs, lambda: plots.ring_vs_context(rows, budgets), "budget per context: the ring each depth needs",
                          "plan: the budget each context needs (ring MiB per depth) against the default budget"))
    notes = "".join(f"<p>{html.escape(n)}</p>" for n in dict.fromkeys(p.get("peak_note", "") for p in plans) if n)
    return "".join(out) + "<h3>Contexts</h3>" + table(plans, PLAN_COLS, "plan") + notes


def point_label(p: dict[str, Any]) -> str:
    from validate.report_tools import label

    return label(p)


def arm_name(p: dict[str, Any]) -> str:
    """``N=2 b=128`` / ``resident`` / ``copy-only N=1``: a validate point's arm."""
    if p.get("arm") == "resident":
        return "resident"
    name = ("copy-only " if p.get("arm") == "copy-only" else "") + f"N={p['depth']}"
    return name + (f" b={p['budget_mib']:g}" if p["budget_mib"] else "") + "".join(f" {m}" for m in p.get("mutations") or ())


def _held(p: dict[str, Any], key: str) -> Any:
    """A transport arm's share of the ceiling; a reference arm (resident, copy-only) is part of the ceiling: None."""
    return p.get(key) if p.get("arm", "transport") == "transport" else None


POINT_COLS = (
    Col("point", point_label), Col("context", "context", thousands), Col("arm", arm_name),
    Col("measured t/s", "measured_tps", f2), Col("min", "measured_tps_min", f2), Col("max", "measured_tps_max", f2),
    Col("spread", "spread", lambda v: f"{v:.3f}"), Col("predicted t/s", "predicted_tps", f2),
    Col("error", "error", pct, lambda v: abs(v) > TARGET_MAX_ERR), Col("regime", "regime"),
    Col("copy/compute", "copy_over_compute", f2), Col("ceiling share", lambda p: _held(p, "ceiling_share"), apct),
    Col("predicted ceiling share", lambda p: _held(p, "predicted_ceiling_share"), apct), Col("delivery GB/s", "delivery_GBps", f1),
    Col("host µs/split", "host_split_launch_us", f1), Col("hash", lambda p: p["output_hash"][:12]),
)
ERROR_COLS = (
    Col("arms", "what"), Col("points", "points"), Col("median |error|", "median_abs_error", apct),
    Col("max |error|", "max_abs_error", apct, lambda v: v > TARGET_MAX_ERR),
)
EXACT_COLS = (
    Col("group", point_label), Col("context", "context", thousands), Col("depths", lambda g: ", ".join(map(str, g["depths"]))),
    Col("resident checked", lambda g: "yes" if g.get("resident_checked") else "no"),
    Col("output hash", lambda g: g["output_hash"][:16]),
    Col("result", lambda g: "identical" if not g["mismatches"] else f"DIFFER: {g['mismatches']}"),
)


def _facts(pairs: Iterable[tuple[str, Any]]) -> str:
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in pairs if v not in (None, ""))
    return f'<dl class="facts">{items}</dl>'


def _validate_section(inp: Input, figs: Figures) -> str:
    doc, s = inp.data, inp.data["summary"]
    gate = "PASS" if s.get("exactness_gate") else "FAIL"
    out = [_facts([("device", doc.get("device")), ("driver", driver_text(doc.get("driver_version"))), ("CuPy", doc.get("cupy_version")),
                   ("date", doc.get("date")), ("profile", doc.get("profile")), ("machine", doc.get("machine")),
                   ("repetitions", doc.get("repetitions")), ("warm-up graphs", doc.get("warmup_graphs")),
                   ("complete", doc.get("complete")), ("exactness gate", gate)])]
    cmds = [c.strip() for c in str(doc.get("command") or "").split(" ; ") if c.strip() and c.strip() != "None"]
    out.append(_commands(cmds))
    out.append(f"<p>Transport arms: median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%} over "
               f"{s['points']} points (targets: median ≤ 3%, every point ≤ 8%: "
               f"{'met' if s.get('error_targets_met') else 'not met'}). Gain sign right at {s.get('gain_signs_right')} of "
               f"{s.get('gain_signs')} pipelined points. Repetitions' max/min t/s at most {s.get('max_spread', 0):.3f}. "
               f"Exactness gate: <b>{gate}</b>.</p>")
    errs = [{"what": "transport arms, pooled", **{k: s[k] for k in ("points", "median_abs_error", "max_abs_error")}}]
    errs += [{"what": f"regime: {r}", **e} for r, e in s.get("per_regime", {}).items()]
    if s.get("reference_arms"):
        errs.append({"what": "reference arms (resident, copy-only)", **s["reference_arms"]})
    out.append("<h3>Errors per regime</h3>" + table(errs, ERROR_COLS, "errors"))
    out += figs.validate_plots(doc["points"])
    out.append("<h3>Predicted vs measured, per point</h3>"
               f'<p class="note">error = (predicted − measured) / measured; marked above {TARGET_MAX_ERR:.0%}.</p>'
               + table(doc["points"], POINT_COLS, "points"))
    out.append("<h3>Exactness</h3>" + table(doc.get("exactness", {}).get("groups", []), EXACT_COLS, "exactness"))
    return "".join(out)


def trace_timelines(doc: dict[str, Any]) -> dict[str, list[Any]]:
    """A Chrome trace's timelines: process label -> spans (``backends.base.Span``, seconds). Does not block."""
    from backends.base import Span, SpanKind

    KINDS_OF_SPANS = {k.value for k in SpanKind}  # noqa: N806

    events = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    out: dict[str, list[Any]] = {}
    for e in events:
        if e.get("ph") == "X":
            track = threads.get((e["pid"], e.get("tid")), str(e.get("tid")))
            out.setdefault(procs.get(e["pid"], str(e["pid"])), []).append(
                Span(track, e["name"], e["ts"] / 1e6, (e["ts"] + e.get("dur", 0)) / 1e6, e.get("args") or {},
                     SpanKind(e["cat"]) if e.get("cat") in KINDS_OF_SPANS else SpanKind.OTHER))
    return out


def last_token(spans: Sequence[Any]) -> tuple[float, float, int]:
    """(start_s, end_s, tokens) of a timeline's last token: tokens start where the first device span's name recurs."""
    device = sorted((s for s in spans if s.track != "host"), key=lambda s: s.start_s)
    if not device:
        return min(s.start_s for s in spans), max(s.end_s for s in spans), 1
    starts = [s.start_s for s in device if (s.track, s.name) == (device[0].track, device[0].name)]
    return starts[-1], max(s.end_s for s in spans), len(starts)


def _trace_section(inp: Input, figs: Figures) -> str:
    from kvpipe import plots

    lines = trace_timelines(inp.data)
    if not lines:
        return '<p class="note">The trace holds no span.</p>'
    rows = [{"timeline": k, "spans": len(v), "tokens": last_token(v)[2],
             "last_token_ms": (last_token(v)[1] - last_token(v)[0]) * 1e3} for k, v in lines.items()]
    group = {k: v for k, v in lines.items() if re.sub(r"depth=\d+", "", k) == re.sub(r"depth=\d+", "", next(iter(lines)))}
    depth = {k: int(m.group(1)) if (m := re.search(r"depth=(\d+)", k)) else 0 for k in group}
    shown = sorted(group, key=lambda k: depth[k])
    shown = [k for k in shown if depth[k] == 0][:1] + [k for k in shown if depth[k] > 0][:1] or shown[:2]
    panels = [(k, group[k], last_token(group[k])[:2]) for k in shown]
    out = [_commands([], why=" (a trace keeps no command)"),
           _drawn(figs, lambda: plots.timeline(panels, "one decode token (the last of the timeline), from its first device span"),
                  f"timeline: {', '.join(shown)}")]
    cols = (Col("timeline", "timeline"), Col("spans", "spans"), Col("tokens found", "tokens"),
            Col("last token ms", "last_token_ms", f2))
    return "".join(out) + "<h3>Timelines in the trace</h3>" + table(rows, cols, "timelines")


SECTIONS: dict[str, Callable[[Input, Figures], str]] = {
    "rows": _rows_section, "plan": _plan_section, "validate": _validate_section, "trace": _trace_section}

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1320px;padding:16px 24px;color:#1b1b1b}
h1{font-size:22px;margin:8px 0}h2{font-size:18px;border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:32px}
h3{font-size:15px;margin:20px 0 6px}pre.cmd{background:#f4f4f4;padding:8px 10px;overflow-x:auto;white-space:pre-wrap;
word-break:break-all;font:12px/1.4 ui-monospace,Menlo,Consolas,monospace}.note{color:#555;font-size:13px}
figure{margin:12px 0}figure svg{max-width:100%;height:auto;display:block;margin:0 auto}
figcaption{color:#555;font-size:13px;text-align:center}
table{border-collapse:collapse;font-size:12px;margin:6px 0 12px;display:block;overflow-x:auto;max-width:100%}
th,td{border:1px solid #ddd;padding:2px 6px;white-space:nowrap}th{background:#f0f0f0;position:sticky;top:0}
td.num{text-align:right;font-variant-numeric:tabular-nums}td.none{text-align:center;color:#888}
td.warn{background:#fde2e1}tbody tr:nth-child(even){background:#fafafa}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:8px 0}dt{color:#555}dd{margin:0}
nav li{margin:2px 0}
"""


def _section(inp: Input, figs: Figures) -> str:
    """One input's section. A field the load-time checks (:func:`_check`) do not cover that is missing or of the
    wrong type is the input's fault, not a bug: one line naming the file. Blocks for the drawing."""
    try:
        return SECTIONS[inp.kind](inp, figs)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{shown(inp.path)} ({inp.kind}): a field the report draws is missing or of the wrong type "
                         f"({type(exc).__name__}: {exc}); allowed: {KINDS[inp.kind]}, as kvpipe wrote it") from None


def page(inputs: Sequence[Input], command: str, title: str = "kvpipe report") -> str:
    """The HTML page of ``inputs``; ``command`` is the one that builds it (shown at the top). Blocks for the drawing."""
    figs = Figures()
    sections, toc = [], []
    for i, inp in enumerate(inputs, 1):
        head = f"{KINDS[inp.kind].split(' (')[0].capitalize()}: {inp.path}"
        toc.append(f'<li><a href="#input-{i}">{html.escape(head)}</a></li>')
        sections.append(f'<section id="input-{i}" data-kind="{inp.kind}"><h2>{html.escape(head)}</h2>'
                        f"{_section(inp, figs)}</section>")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f'<p class="note">Built by</p><pre class="cmd">{html.escape(command)}</pre>'
            f"<nav><ol>{''.join(toc)}</ol></nav>{''.join(sections)}</body></html>\n")
