"""Plots of sweeps and timelines, headless (matplotlib's Agg canvas, no pyplot state).

Each plot takes result rows (the ``simulate --json`` schema, with ``gain``
added by :func:`kvpipe.sweep.gain_rows`) or a timeline, draws one figure and
writes it as PNG and/or SVG. The kinds answer the capacity questions:

* ``gain-vs-depth``: does a deeper look-ahead pay? (one line per context)
* ``gain-vs-context``: where does the pipeline pay most, and where does a
  budget cut it off? (one line per depth and budget; the point where a capped
  budget declines is marked)
* ``gain-per-mib``: what each MiB of ring buys, per context
* ``ring-vs-context``: the ring each depth needs against the budget lines
* ``tps-vs-context``: predicted t/s per arm and depth, with the calibration band
* ``timeline``: one token, ordered above pipelined, on the same time axis:
  host thread, consumer stream, transfer stream and each copy engine, so the
  overlap, and the small blocking copy queued FIFO behind the deliveries, show
* ``xy``: any row column against any other, grouped by a third.

Units: rows carry theirs in their field names; axes say theirs. The figure and its files are
``kvpipe.figures``'s; the timeline is ``kvpipe.timeline_plot``'s (both re-exported here for the commands).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from kvpipe.figures import FORMATS, new_figure, png_bytes, rendered, save
from kvpipe.timeline_plot import TRACK_LABELS, TRACKS, category, fifo_wait, timeline, token_window
from sim.errors import InputError
from sim.telemetry import flatten

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn, not when a command starts (0.3 s of every start)
    from matplotlib.figure import Figure

#: the figure files and the timeline are re-exported: commands and notebooks draw every kind through this module
__all__ = ["FORMATS", "KINDS", "TRACKS", "TRACK_LABELS", "category", "check_rows", "columns", "fifo_wait", "gain_per_mib",
           "gain_vs_context", "gain_vs_depth", "png_bytes", "rendered", "ring_vs_context", "save", "timeline",
           "token_window", "tps_vs_context", "xy"]

MAX_LINES = 8


# ------------------------------------------------------------------- rows


def columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Column names of flattened rows (``breakdown_ms.total`` style). Does not block."""
    out: list[str] = []
    for r in rows:
        out += [k for k in flatten(r) if k not in out]
    return out


def column(rows: Sequence[dict[str, Any]], name: str) -> list[Any]:
    """One column of the rows. Raises InputError naming the allowed columns if ``name`` is not one."""
    flat = [flatten(r) for r in rows]
    if not flat or name not in flat[0]:
        raise InputError(f"unknown column {name!r}; allowed: {', '.join(columns(rows))}")
    return [f[name] for f in flat]


def _title(rows: Sequence[dict[str, Any]], what: str) -> str:
    def one(k: str) -> str:
        vals = sorted({str(r[k]) for r in rows})
        return vals[0] if len(vals) == 1 else "/".join(vals)

    import textwrap

    # several hardware profiles make a long title: wrap it rather than let the figure crop it
    return "\n".join(textwrap.wrap(f"{one('model')} ({one('cache_type')} KV) on {one('hardware')}: {what}", 110))


def _budget_label(b: float) -> str:
    return "no budget cap" if not b else f"budget {b:g} MiB"


def _need_gain(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [r for r in rows if r.get("gain") is not None and r["depth"] > 0]
    if not out:
        raise InputError("no row has a gain: the rows need depth-0 (ordered) rows beside the pipelined ones")
    return out


def _groups(rows: Iterable[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> dict[Any, list[dict[str, Any]]]:
    out: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


def _thousands(ax: Any) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def _context_axis(ax: Any, rows: Sequence[dict[str, Any]], ylabel: str, what: str, legend: dict[str, Any] | None = None) -> None:
    """Finish a plot whose x axis is the context: labels, thousands separators, grid, legend and title."""
    ax.set_xlabel("context (tokens already cached)")
    _thousands(ax)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, **(legend or {}))
    ax.set_title(_title(rows, what), fontsize=10)


#: Row fields a plot or the report reads as numbers (where present), and as text.
ROW_NUMBERS = ("context", "depth", "budget_mib", "tokens_per_s", "tokens", "window_rows", "ring_mib", "ms_per_token", "parallel",
               "early_mib", "late_mib", "ordered_mib")
ROW_TEXT = ("model", "hardware", "cache_type")


def check_rows(rows: Sequence[dict[str, Any]], where: str) -> None:
    """Each row's numeric fields finite numbers and its names text. Raises InputError ``where row i: key = value``."""
    for i, r in enumerate(rows):
        for k in ROW_NUMBERS:
            v = r.get(k, 0)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise InputError(f"{where} row {i}: {k} = {v!r}; allowed: a finite number (rows of kvpipe sweep or simulate --json)")
        for k in ROW_TEXT:
            if not isinstance(r.get(k, ""), str):
                raise InputError(f"{where} row {i}: {k} = {r[k]!r}; allowed: text (rows of kvpipe sweep or simulate --json)")


# ------------------------------------------------------------------ kinds


def gain_vs_depth(rows: Sequence[dict[str, Any]]) -> Figure:
    """Gain (%) against look-ahead depth, one line per context (and budget, if several)."""
    rows = _need_gain(rows)
    contexts = sorted({r["context"] for r in rows})
    if len(contexts) > MAX_LINES:  # a legend of hundreds of lines is unreadable: an even spread of them
        pick = {contexts[round(i * (len(contexts) - 1) / (MAX_LINES - 1))] for i in range(MAX_LINES)}
        rows = [r for r in rows if r["context"] in pick]
    budgets = sorted({r["budget_mib"] for r in rows})
    fig = new_figure()
    ax = fig.add_subplot()
    colors = {c: f"C{i % 10}" for i, c in enumerate(sorted({r["context"] for r in rows}))}
    for (ctx, b), grp in sorted(_groups(rows, lambda r: (r["context"], r["budget_mib"])).items()):
        grp.sort(key=lambda r: r["depth"])
        label = f"context {ctx:,}" + (f", {_budget_label(b)}" if len(budgets) > 1 else "")
        ax.plot([r["depth"] for r in grp], [100 * r["gain"] for r in grp], marker="o", label=label, color=colors[ctx],
                linestyle=["-", "--", ":", "-."][budgets.index(b) % 4])
    declined = [r for r in rows if r["declined"]]
    if declined:
        reasons = sorted({"over budget" if "budget" in r["decline_reason"] else "no room on the device" for r in declined})
        ax.plot([r["depth"] for r in declined], [100 * r["gain"] for r in declined], marker="x", color="black",
                linestyle="none", markersize=9, label=f"ring declined, ran ordered ({', '.join(reasons)})")
    ax.set_xlabel("look-ahead depth N (ring of N + 2 slots)")
    ax.set_ylabel("gain over the ordered path (%)")
    ax.set_xticks(sorted({r["depth"] for r in rows}))
    ax.axhline(0, color="black", linewidth=0.6)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    note = "" if len(budgets) > 1 else f" ({_budget_label(budgets[0])})"
    ax.set_title(_title(rows, "gain vs look-ahead depth" + note), fontsize=10)
    return fig


def gain_vs_context(rows: Sequence[dict[str, Any]], marks: Sequence[tuple[str, float]] = ()) -> Figure:
    """Gain (%) against context, one line per depth and budget; each capped budget's first decline marked.

    ``marks`` are (label, context) pairs drawn as vertical dotted lines (e.g. the closed-form peak).
    """
    rows = _need_gain(rows)
    fig = new_figure()
    ax = fig.add_subplot()
    budgets = sorted({r["budget_mib"] for r in rows})
    styles = ["-", "--", ":", "-."]
    colors = {d: f"C{i}" for i, d in enumerate(sorted({r["depth"] for r in rows}))}
    for (d, b), grp in sorted(_groups(rows, lambda r: (r["depth"], r["budget_mib"])).items()):
        grp.sort(key=lambda r: r["context"])
        label = f"depth {d}, {_budget_label(b)}"
        kept = [r for r in grp if not r["declined"]]
        first = next((r for r in grp if r["declined"] and kept and r["context"] > kept[0]["context"]), None)
        if b and first is not None:
            last = max((r for r in kept if r["context"] < first["context"]), key=lambda r: r["context"])
            ax.plot([last["context"]], [100 * last["gain"]], marker="v", color=colors[d], markersize=9, linestyle="none")
            label += f": declines from window {first['window_rows']:,} (ring {first['ring_mib']:.0f} MiB)"
        ax.plot([r["context"] for r in grp], [100 * r["gain"] for r in grp], color=colors[d],
                linestyle=styles[budgets.index(b) % len(styles)], label=label)
    for i, (text, x) in enumerate(marks):
        ax.axvline(x, color="grey", linestyle=":", linewidth=1.2)
        ax.annotate(text, (x, 0.1 + 0.06 * i), xycoords=("data", "axes fraction"), textcoords="offset points",
                    xytext=(4, 0), fontsize=8, color="dimgrey", bbox={"boxstyle": "round", "fc": "white", "ec": "none"})
    ax.axhline(0, color="black", linewidth=0.6)
    _context_axis(ax, rows, "gain over the ordered path (%)", "gain vs context")
    return fig


def tps_vs_context(rows: Sequence[dict[str, Any]]) -> Figure:
    """Predicted t/s against context, one line per arm, depth and budget, with each row's error band shaded.

    The band is ``tokens_per_s_interval`` (the profile's calibration residuals);
    lines of an uncalibrated profile carry none and say so in the legend.
    """
    fig = new_figure()
    ax = fig.add_subplot()
    key = lambda r: (r.get("arm", "transport"), r["depth"], r["budget_mib"])  # noqa: E731
    for i, (k, grp) in enumerate(sorted(_groups(rows, key).items())):
        grp.sort(key=lambda r: r["context"])
        arm, d, b = k
        what = "resident (-nkvo 0)" if arm == "resident" else ("ordered" if d == 0 else f"depth {d}, {_budget_label(b)}")
        xs = [r["context"] for r in grp]
        bands: list[list[float]] = [r.get("tokens_per_s_interval") or [] for r in grp]
        color = f"C{i % 10}"
        if all(bands):
            ax.fill_between(xs, [bd[0] for bd in bands], [bd[1] for bd in bands], color=color, alpha=0.2, linewidth=0)
            rel = max((bd[1] - r["tokens_per_s"]) / r["tokens_per_s"] for bd, r in zip(bands, grp, strict=True) if r["tokens_per_s"])
            what += f" (band +-{rel:.1%})"
        else:
            what += " (uncalibrated: no band)"
        ax.plot(xs, [r["tokens_per_s"] for r in grp], color=color, marker="o", markersize=3, label=what)
    ax.set_ylim(bottom=0)
    _context_axis(ax, rows, "predicted tokens/s", "predicted t/s vs context, with the calibration band")
    return fig


def gain_per_mib(rows: Sequence[dict[str, Any]]) -> Figure:
    """Gain (% points) per MiB of ring against context, one line per depth (rows whose ring engaged)."""
    rows = [r for r in _need_gain(rows) if not r["declined"] and r["ring_mib"] > 0]
    if not rows:
        raise InputError("no row kept its ring: nothing to divide the gain by (raise --budget or use 0 = no cap)")
    fig = new_figure()
    ax = fig.add_subplot()
    for d, grp in sorted(_groups(rows, lambda r: r["depth"]).items()):
        grp = sorted({r["context"]: r for r in grp}.values(), key=lambda r: r["context"])
        ax.plot([r["context"] for r in grp], [100 * r["gain"] / r["ring_mib"] for r in grp], marker=".", label=f"depth {d}")
    ax.set_ylim(bottom=0)
    _context_axis(ax, rows, "gain per MiB of ring (% / MiB)", "what each MiB of ring buys")
    return fig


def ring_vs_context(rows: Sequence[dict[str, Any]], budgets_mib: Sequence[float] = ()) -> Figure:
    """Ring MiB each depth needs against context, with horizontal budget lines."""
    rows = [r for r in rows if r["depth"] > 0]
    if not rows:
        raise InputError("no pipelined (depth > 0) row: the ring is only planned at depth >= 1")
    fig = new_figure()
    ax = fig.add_subplot()
    for d, grp in sorted(_groups(rows, lambda r: r["depth"]).items()):
        grp = sorted({r["context"]: r for r in grp}.values(), key=lambda r: r["context"])
        ax.plot([r["context"] for r in grp], [r["ring_mib"] for r in grp], label=f"depth {d} ({d + 2} slots)")
    lines = sorted({b for b in [*budgets_mib, *(r["budget_mib"] for r in rows)] if b})
    for i, b in enumerate(lines):
        ax.axhline(b, color="black", linestyle=["--", ":", "-."][i % 3], linewidth=1)
        ax.annotate(f"budget {b:g} MiB", (0.01, b), xycoords=("axes fraction", "data"), textcoords="offset points",
                    xytext=(0, 3), fontsize=8)
    _context_axis(ax, rows, "ring the graph needs (MiB)", "ring size vs context (above a budget line the ring is declined)",
                  legend={"loc": "upper left", "bbox_to_anchor": (0.0, 0.93)})
    return fig


def xy(rows: Sequence[dict[str, Any]], x: str, y: str, group: str | None = None) -> Figure:
    """Any column against any other, one line per value of ``group``. Raises InputError on an unknown column."""
    xs, ys = column(rows, x), column(rows, y)
    gs = column(rows, group) if group else [""] * len(rows)
    fig = new_figure()
    ax = fig.add_subplot()
    for g in sorted(set(gs), key=str):
        pts = sorted((a, b) for a, b, c in zip(xs, ys, gs, strict=True) if c == g)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"{group} = {g}" if group else None)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.grid(alpha=0.3)
    if group:
        ax.legend(fontsize=8)
    ax.set_title(_title(rows, f"{y} vs {x}"), fontsize=10)
    return fig


KINDS: dict[str, Callable[..., Figure]] = {
    "gain-vs-depth": gain_vs_depth,
    "gain-vs-context": gain_vs_context,
    "gain-per-mib": gain_per_mib,
    "ring-vs-context": ring_vs_context,
    "tps-vs-context": tps_vs_context,
    "xy": xy,
    "timeline": timeline,
}
