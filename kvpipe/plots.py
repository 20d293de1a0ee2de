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

Units: rows carry theirs in their field names; axes say theirs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.base import Span
from sim.errors import InputError
from sim.telemetry import flatten

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn, not when a command starts (0.3 s of every start)
    from matplotlib.figure import Figure

FORMATS = ("png", "svg")
MAX_LINES = 8
TRACKS = ("host", "consumer0", "transfer0", "h2d0", "d2h0")
TRACK_LABELS = {"host": "host thread", "consumer0": "consumer stream", "transfer0": "transfer stream",
                "h2d0": "H2D copy engine", "d2h0": "D2H copy engine"}
COLORS = {"kernel": "#2ca02c", "window": "#8c564b", "delivery": "#1f77b4", "late": "#17becf", "small": "#d62728", "rows": "#ff7f0e",
          "cpu": "#9467bd", "blocked": "#c7c7c7", "issue": "#444444", "wait": "#e8e8e8"}
LEGEND = {"kernel": "GPU kernels (split)", "window": "KV window, blocking (ordered path)",
          "delivery": "delivery (stable prefix, early)", "late": "late rows",
          "small": "small blocking H2D input", "rows": "new K/V rows D2H", "cpu": "CPU split (row write)",
          "blocked": "host blocked (sync/wait)", "issue": "host issuing calls", "wait": "stream waits on event"}


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


def _figure(size: tuple[float, float] = (9, 5.5)) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (for notebooks: ``IPython.display.Image(png_bytes(fig))``). Does not block on I/O."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def rendered(fig: Figure, prefix: str | Path, formats: Sequence[str] = FORMATS) -> list[tuple[Path, bytes]]:
    """``prefix.png`` / ``prefix.svg`` as (path, bytes), nothing written yet. Raises InputError on an unknown format."""
    import io

    prefix = Path(prefix)
    out = []
    for fmt in formats:
        if fmt not in FORMATS:
            raise InputError(f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt)
        out.append((prefix.with_name(f"{prefix.name}.{fmt}"), buf.getvalue()))
    return out


def save(fig: Figure, prefix: str | Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write ``prefix.png`` / ``prefix.svg`` (all or none: ``sim.safe_write.write_outputs``); returns the paths.
    Blocks on the writes."""
    from sim.safe_write import write_outputs

    files = rendered(fig, prefix, formats)
    write_outputs(list(files))
    return [path for path, _ in files]


# ------------------------------------------------------------------ kinds


def gain_vs_depth(rows: Sequence[dict[str, Any]]) -> Figure:
    """Gain (%) against look-ahead depth, one line per context (and budget, if several)."""
    rows = _need_gain(rows)
    contexts = sorted({r["context"] for r in rows})
    if len(contexts) > MAX_LINES:  # a legend of hundreds of lines is unreadable: an even spread of them
        pick = {contexts[round(i * (len(contexts) - 1) / (MAX_LINES - 1))] for i in range(MAX_LINES)}
        rows = [r for r in rows if r["context"] in pick]
    budgets = sorted({r["budget_mib"] for r in rows})
    fig = _figure()
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
    fig = _figure()
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
    fig = _figure()
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
    fig = _figure()
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
    fig = _figure()
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
    fig = _figure()
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


# --------------------------------------------------------------- timeline


def category(span: Span) -> str:
    """What a span is, for its colour: kernel, window, delivery, late, small, rows, cpu, blocked, issue or wait."""
    n = span.name
    if span.track == "host":
        if n.startswith("cpu"):
            return "cpu"
        if n.startswith(("sync", "wait", "wake", "pageable")):
            return "blocked"
        return "issue"
    if n.startswith("wait"):
        return "wait"
    if n.startswith("delivery"):
        return "delivery"
    if n == "late":
        return "late"
    if n.startswith("cache_"):
        return "window"
    if span.track.startswith("d2h") or n.startswith(("k_cur", "v_cur")):
        return "rows"
    if span.track.startswith(("h2d", "transfer")) or span.args.get("bytes") is not None:
        return "small"
    return "kernel"


def token_window(totals_s: Sequence[float], index: int = -1) -> tuple[float, float]:
    """Start and end (s) of graph ``index`` on the host clock: graphs run back to back from 0."""
    i = index % len(totals_s)
    start = sum(totals_s[:i])
    return start, start + totals_s[i]


@dataclass(frozen=True)
class FifoWait:
    """The small blocking H2D copies of one token: the first one, their bytes, how long they queued, what ran ahead."""

    first: Span
    nbytes: int
    queued_s: float
    deliveries_ahead: int


def fifo_wait(spans: Sequence[Span], start_s: float, end_s: float) -> FifoWait | None:
    """How long the token's small blocking H2D copies queued on the engine (issue to start), and behind how many deliveries."""
    h2d = [s for s in spans if s.track == "h2d0" and start_s <= s.start_s < end_s]
    small = [s for s in h2d if category(s) == "small"]
    if not small:
        return None
    issues = [s for s in spans if s.track == "host" and s.name.startswith("issue ") and start_s <= s.end_s < end_s]
    queued, ahead = 0.0, 0
    for c in small:
        t_issue = max((s.end_s for s in issues if s.name == f"issue {c.name}" and s.end_s <= c.start_s), default=c.start_s)
        queued += c.start_s - t_issue
        ahead += sum(1 for s in h2d if category(s) == "delivery" and t_issue < s.end_s <= c.start_s + 1e-12)
    return FifoWait(small[0], sum(int(s.args.get("bytes", 0)) for s in small), queued, ahead)


def timeline(panels: Sequence[tuple[str, Sequence[Span], tuple[float, float]]], title: str) -> Figure:
    """A Gantt chart per panel (label, spans, (start_s, end_s) of one token), stacked on one time axis (ms)."""
    fig = _figure((13, 2.3 + 2.6 * len(panels)))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    span_ms = max(e - s for _, _, (s, e) in panels) * 1e3
    used: set[str] = set()
    for ax, (label, spans, (t0, t1)) in zip(axes, panels, strict=True):
        tracks = [t for t in TRACKS if any(s.track == t for s in spans)]
        for y, track in enumerate(tracks):
            for s in spans:
                if s.track != track or s.end_s <= t0 or s.start_s >= t1:
                    continue
                cat = category(s)
                used.add(cat)
                a, b = (max(s.start_s, t0) - t0) * 1e3, (min(s.end_s, t1) - t0) * 1e3
                ax.broken_barh([(a, max(b - a, span_ms * 1.2e-3))], (y - 0.38, 0.76), facecolors=COLORS[cat],
                               edgecolors="white" if cat in ("delivery", "kernel") else "none", linewidth=0.3,
                               rasterized=True)  # thousands of bars: pixels in the SVG, text stays vector
        ax.set_yticks(range(len(tracks)), [TRACK_LABELS[t] for t in tracks])
        ax.invert_yaxis()
        ax.set_xlim(0, span_ms * 1.01)
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(f"{label}: {(t1 - t0) * 1e3:.2f} ms per token", fontsize=10, loc="left")
        hit = fifo_wait(spans, t0, t1)
        if hit is not None and "h2d0" in tracks:
            x, y = (hit.first.start_s - t0) * 1e3, tracks.index("h2d0")
            text = (f"small blocking inputs ({hit.nbytes / 1024:.0f} KiB) queued {hit.queued_s * 1e3:.2f} ms"
                    + (f" behind {hit.deliveries_ahead} deliveries on the one H2D engine" if hit.deliveries_ahead else " (engine idle)"))
            ax.annotate(text, (x, y), xytext=(max(x, span_ms * 0.05) + span_ms * 0.04, y + 0.95), fontsize=8,
                        color=COLORS["small"], arrowprops={"arrowstyle": "->", "color": COLORS["small"]},
                        annotation_clip=False, bbox={"boxstyle": "round", "fc": "white", "ec": "none", "alpha": 0.8})
    axes[-1].set_xlabel("time since the token started (ms)")
    handles = [_patch(c) for c in LEGEND if c in used]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(5, len(handles)), fontsize=8)
    fig.suptitle(title, fontsize=11)
    return fig


def _patch(cat: str) -> Any:
    from matplotlib.patches import Patch

    return Patch(facecolor=COLORS[cat], label=LEGEND[cat])


KINDS: dict[str, Callable[..., Figure]] = {
    "gain-vs-depth": gain_vs_depth,
    "gain-vs-context": gain_vs_context,
    "gain-per-mib": gain_per_mib,
    "ring-vs-context": ring_vs_context,
    "tps-vs-context": tps_vs_context,
    "xy": xy,
    "timeline": timeline,
}
