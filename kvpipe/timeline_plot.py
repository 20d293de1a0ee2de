"""One token's timeline as a Gantt chart: host thread, streams and copy engines, ordered above pipelined.

:func:`timeline` stacks panels (label, spans, one token's window) on one time axis; :func:`category` colours a span
by what it is; :func:`fifo_wait` finds the small blocking H2D copies queued behind deliveries on the one engine and
the chart annotates them. Units: spans in seconds, the axis in ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.base import Span
from kvpipe.figures import new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TRACKS = ("host", "consumer0", "transfer0", "h2d0", "d2h0")
TRACK_LABELS = {"host": "host thread", "consumer0": "consumer stream", "transfer0": "transfer stream",
                "h2d0": "H2D copy engine", "d2h0": "D2H copy engine"}
COLORS = {"kernel": "#2ca02c", "window": "#8c564b", "delivery": "#1f77b4", "late": "#17becf", "small": "#d62728", "rows": "#ff7f0e",
          "cpu": "#9467bd", "blocked": "#c7c7c7", "issue": "#444444", "wait": "#e8e8e8"}
LEGEND = {"kernel": "GPU kernels (split)", "window": "KV window, blocking (ordered path)",
          "delivery": "delivery (stable prefix, early)", "late": "late rows",
          "small": "small blocking H2D input", "rows": "new K/V rows D2H", "cpu": "CPU split (row write)",
          "blocked": "host blocked (sync/wait)", "issue": "host issuing calls", "wait": "stream waits on event"}


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
    fig = new_figure((13, 2.3 + 2.6 * len(panels)))
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
