"""The HTML report's building blocks: inline SVG figures, tables with ``data-value`` cells, commands.

Pure string building; nothing here reads a file or blocks. Units: those of the inputs' field names.
"""

from __future__ import annotations

import html
import io
import re
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sim.errors import InputError
from sim.telemetry import flatten

MAX_GROUPS = 6  # figures per (model, hardware, cache type) of a sweep; more are listed, not drawn
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
TARGET_MAX_ERR = 0.08  # validate.report's per-point target: cells above it are marked


class _Files:
    """A folder of in-memory files: ``validate.report_tools.plots`` saves into ``folder / name``; these keep the bytes."""

    def __init__(self) -> None:
        self.files: dict[str, io.BytesIO] = {}

    def __truediv__(self, name: str) -> io.BytesIO:
        return self.files.setdefault(name, io.BytesIO())


def _inline(svg: str) -> str:
    """An SVG document as an element for HTML: no XML prologue, no metadata (its date)."""
    svg = svg[svg.index("<svg"):]
    return re.sub(r"<metadata>.*?</metadata>\s*", "", svg, count=1, flags=re.S)


class Figures:
    """Numbered inline SVG figures of one page. SVG ids are content hashes salted per drawing, so figures never share
    an id with different definitions."""

    def __init__(self) -> None:
        self.count = 0

    def _next(self) -> str:
        self.count += 1
        return f"fig-{self.count}"

    def figure(self, fig: Any, caption: str) -> str:
        """``fig`` (a matplotlib Figure) as a <figure> of inline SVG with ``caption``. Does not block on I/O."""
        import matplotlib

        name = self._next()
        buf = io.StringIO()
        with matplotlib.rc_context({"svg.hashsalt": f"kvpipe-{name}"}):
            fig.savefig(buf, format="svg", metadata={"Date": None})
        return self._wrap(name, buf.getvalue(), caption)

    def validate_plots(self, pts: Sequence[dict[str, Any]]) -> list[str]:
        """validate.report_tools.plots' two figures (measured vs predicted t/s, gain vs depth) as inline SVG."""
        import matplotlib

        from validate.report_tools import plots

        out = []
        names = {"measured_vs_predicted.png": "measured (median, min-max bars) and predicted tokens/s per depth",
                 "gain_vs_depth.png": "gain over depth 0, measured and predicted"}
        files = _Files()
        with matplotlib.rc_context({"savefig.format": "svg", "svg.hashsalt": f"kvpipe-fig-{self.count + 1}"}):
            plots(pts, files)  # type: ignore[arg-type]  # a folder that keeps the files in memory
        for fname, buf in files.files.items():
            out.append(self._wrap(self._next(), buf.getvalue().decode(), names.get(fname, fname)))
        return out

    def _wrap(self, name: str, svg: str, caption: str) -> str:
        return f'<figure id="{name}">{_inline(svg)}<figcaption>{html.escape(caption)}</figcaption></figure>'


def _drawn(figs: Figures, draw: Callable[[], Any], caption: str, title: str | None = None) -> str:
    """A figure, or a line saying why it is not drawn (the plot's own InputError message)."""
    try:
        fig = draw()
    except InputError as exc:
        return f'<p class="note">{html.escape(caption)}: not drawn ({html.escape(str(exc))})</p>'
    if title:
        fig.axes[0].set_title(title, fontsize=10)
    return figs.figure(fig, caption)


# ------------------------------------------------------------------- tables


@dataclass(frozen=True)
class Col:
    """A table column: header, the record's field (flattened name) or a function of the record, the cell's format."""

    head: str
    key: str | Callable[[dict[str, Any]], Any]
    fmt: Callable[[Any], str] = str
    warn: Callable[[Any], bool] | None = None  # marks the cell when true


def _band(r: dict[str, Any]) -> str:
    """The row's error band as +-%, or ``uncalibrated`` (rows written before bands existed: blank)."""
    iv, tps = r.get("tokens_per_s_interval"), r.get("tokens_per_s")
    if iv and tps:
        return f"{(iv[1] - tps) / tps:.1%}"
    return "uncalibrated" if "interval" in r else ""


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def table(records: Iterable[dict[str, Any]], cols: Sequence[Col], name: str) -> str:
    """An HTML table, one row per record (``data-index``); a field's cell keeps its value in ``data-value``."""
    head = "".join(f"<th>{html.escape(c.head)}</th>" for c in cols)
    body = []
    for i, rec in enumerate(records):
        flat = flatten(rec)
        cells = []
        for c in cols:
            v = flat.get(c.key) if isinstance(c.key, str) else c.key(rec)
            attrs = f' data-field="{html.escape(c.key)}"' if isinstance(c.key, str) else ""
            if _num(v):
                attrs += f' data-value="{v!r}"'
            classes = ["num"] if _num(v) else ["none"] if v is None else []
            if v is not None and c.warn is not None and c.warn(v):
                classes.append("warn")
            attrs += f' class="{" ".join(classes)}"' if classes else ""
            cells.append(f"<td{attrs}>{html.escape('—' if v is None else c.fmt(v))}</td>")
        body.append(f'<tr data-index="{i}">{"".join(cells)}</tr>')
    return f'<table data-table="{html.escape(name)}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


# cell formats
f1, f2, pct, apct, thousands = "{:.1f}".format, "{:.2f}".format, "{:+.1%}".format, "{:.1%}".format, "{:,}".format


def mib(v: Any) -> str:
    return "no cap" if not v else f"{v:g}"


# ----------------------------------------------------------------- commands


def _values(rows: Sequence[dict[str, Any]], key: str, default: Any = None) -> list[Any]:
    return sorted({r.get(key, default) for r in rows}, key=lambda v: (str(type(v)), v))


def grid_command(rows: Sequence[dict[str, Any]], verb: str, settings: dict[str, Any], tail: Sequence[str] = ()) -> str:
    """The kvpipe flags of the grid the rows span (names as the rows record them: a profile's name, not its path)."""
    def joined(vals: Iterable[Any]) -> str:
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in vals)

    parts = ["kvpipe", verb, "--model", joined(_values(rows, "model")), "--hardware", joined(_values(rows, "hardware")),
             "--cache-type", joined(_values(rows, "cache_type"))]
    if any(r.get("cache_type_v", r["cache_type"]) != r["cache_type"] for r in rows):
        parts += ["--cache-type-v", joined(_values(rows, "cache_type_v"))]
    arms = _values(rows, "arm", "transport")
    if "resident" in arms:
        parts += ["-nkvo", "0" if arms == ["resident"] else "0,1"]
    parts += ["--context", joined(_values(rows, "context")), "--depth", joined(_values(rows, "depth")),
              "--budget", joined(_values(rows, "budget_mib")), "--tokens", joined(_values(rows, "tokens", 8))]
    if _values(rows, "parallel", 1) != [1]:
        parts += ["--parallel", joined(_values(rows, "parallel", 1))]
    if False in _values(rows, "unified", True):
        parts += ["--no-kv-unified"]
    if _values(rows, "split_mode", "none") != ["none"]:
        parts += ["--split-mode", joined(_values(rows, "split_mode", "none"))]
    if settings.get("pinned") == [False]:
        parts += ["--pageable"]
    if settings.get("mutations"):
        parts += ["--mutate", ",".join(settings["mutations"])]
    return shlex.join([*parts, *tail])


def plan_command(plans: Sequence[dict[str, Any]]) -> str:
    """The kvpipe plan flags the plan records (its contexts, depths and budgets; model and hardware where recorded)."""
    first = plans[0]
    parts = ["kvpipe", "plan"]
    for flag, key in (("--model", "model"), ("--hardware", "hardware"), ("--cache-type", "cache_type")):
        if first.get(key):
            parts += [flag, str(first[key])]
    parts += ["--context", ",".join(str(p["context"]) for p in plans),
              "--max-depth", str(max(int(d) for d in first["gain_by_depth"]))]
    if first.get("default_budget_mib") is not None:
        parts += ["--default-budget", f"{first['default_budget_mib']:g}"]
    if first.get("budget_for_gain") is not None:
        parts += ["--budget-for-gain", f"{first['budget_for_gain']:g}"]
    return shlex.join([*parts, "--json"])


def _commands(recorded: Sequence[str], rebuilt: str = "", why: str = "") -> str:
    if recorded:
        lines = "\n".join(html.escape(c) for c in recorded)
        return f'<h3>Commands</h3><p class="note">As recorded in the input.</p><pre class="cmd">{lines}</pre>'
    out = f'<h3>Command</h3><p class="note">Not recorded in the input{html.escape(why)}.'
    if rebuilt:
        out += f' Rebuilt from its content:</p><pre class="cmd">{html.escape(rebuilt)}</pre>'
    return out if rebuilt else out + "</p>"


# ---------------------------------------------------------------- sections


