"""kvpipe plot: every kind renders headless to PNG and SVG with units; the timeline shows the FIFO wait."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpipe import plots
from kvpipe.cli import main
from kvpipe.commands.plot import read_rows
from kvpipe.plan import PlanRequest, points
from kvpipe.sweep import gain_rows
from sim.run.run import run_point

GRID = ["--context", "4096..24576/4096", "--depth", "0,1", "--budget", "0,128", "--tokens", "2", "--jobs", "1"]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sweep")
    assert main(["sweep", *GRID, "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.parametrize("kind, unit", [
    ("gain-vs-depth", "gain over the ordered path (%)"),
    ("gain-vs-context", "context (tokens already cached)"),
    ("gain-per-mib", "gain per MiB of ring (% / MiB)"),
    ("ring-vs-context", "ring the graph needs (MiB)"),
])
def test_row_kinds_write_png_and_svg_with_title_and_units(sweep_dir: Path, tmp_path: Path, kind: str, unit: str) -> None:
    assert main(["plot", kind, "--rows", str(sweep_dir / "rows.json"), "--out", str(tmp_path / kind)]) == 0
    png, svg = tmp_path / f"{kind}.png", tmp_path / f"{kind}.svg"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = svg.read_text()
    assert "qwen3.8-27b (q8_0 KV) on rtx4070-gen4x16" in text and unit in text.replace("&amp;", "&")


def test_gain_vs_context_marks_where_the_budget_declines(sweep_dir: Path) -> None:
    rows = gain_rows(read_rows(str(sweep_dir / "rows.json")))
    capped = sorted((r for r in rows if r["depth"] == 1 and r["budget_mib"] == 128), key=lambda r: r["context"])
    first = next(r for r in capped if r["declined"])
    last_kept = max((r for r in capped if not r["declined"]), key=lambda r: r["context"])
    ax = plots.gain_vs_context(rows).axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert f"depth 1, budget 128 MiB: declines from window {first['window_rows']:,} (ring {first['ring_mib']:.0f} MiB)" in labels
    markers = [line for line in ax.get_lines() if line.get_marker() == "v"]
    assert len(markers) == 1 and list(markers[0].get_xdata()) == [last_kept["context"]]


def test_peak_mark_is_the_closed_form(sweep_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvpipe.commands.plot import _peak_marks
    from kvpipe.plan import closed_form

    rows = gain_rows(read_rows(str(sweep_dir / "rows.json")))
    (label, x), = _peak_marks(rows)
    cf = closed_form(points(PlanRequest(), [4096], [1], 0, tokens=1)[0], 3)
    assert x == pytest.approx(cf.rows - 1) and f"{cf.rows:,.0f} rows" in label
    ax = plots.gain_vs_context(rows, [(label, x)]).axes[0]
    assert any(list(line.get_xdata()) == [x, x] for line in ax.get_lines())
    assert main(["plot", "gain-vs-context", "--peak", "--rows", str(sweep_dir / "rows.json"), "--out", str(tmp_path / "g")]) == 0


def test_csv_rows_read_back_like_json(sweep_dir: Path) -> None:
    j = read_rows(str(sweep_dir / "rows.json"))
    c = read_rows(str(sweep_dir / "rows.csv"))
    for a, b in zip(j, c, strict=True):
        for k in ("context", "depth", "budget_mib", "declined", "ring_mib", "window_rows"):
            assert a[k] == b[k], k
        assert a["tokens_per_s"] == pytest.approx(b["tokens_per_s"], rel=1e-12)


def test_timeline_shows_deliveries_ahead_of_the_small_blocking_copy() -> None:
    req = PlanRequest(tokens=2)
    panels = {}
    for depth in (0, 1):
        res = run_point(points(req, [16384], [depth], 0)[0], trace=True, checked=False, warmup=0)
        window = plots.token_window([g.total_s for g in res.graphs], -1)
        panels[depth] = (res.spans, window, res.graphs[-1])
    spans, (t0, t1), g = panels[1]
    hit = plots.fifo_wait(spans, t0, t1)
    assert hit is not None and hit.deliveries_ahead >= 2  # depth 1 primes two deliveries before split 0's inputs
    assert 1e-3 < hit.queued_s <= g.blocked_ordered_s
    spans0, (s0, e0), _ = panels[0]
    hit0 = plots.fifo_wait(spans0, s0, e0)
    assert hit0 is not None and hit0.deliveries_ahead == 0 and hit0.queued_s < 1e-6
    assert not any(s.track.startswith("transfer") for s in spans0)  # depth 0 creates no transfer stream
    fig = plots.timeline([("ordered", spans0, (s0, e0)), ("pipelined", spans, (t0, t1))], "t")
    ordered_ax, piped_ax = fig.axes[:2]
    assert [t.get_text() for t in piped_ax.get_yticklabels()] == [plots.TRACK_LABELS[t] for t in plots.TRACKS]
    assert "transfer stream" not in [t.get_text() for t in ordered_ax.get_yticklabels()]
    assert any(f"behind {hit.deliveries_ahead} deliveries" in t.get_text() for t in piped_ax.texts)


def test_timeline_command_writes_both_formats(tmp_path: Path) -> None:
    assert main(["plot", "timeline", "--context", "4096", "--depth", "1", "--tokens", "2", "--out", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t.png").stat().st_size > 10_000
    assert "host thread" in (tmp_path / "t.svg").read_text()


def test_xy_plots_any_column(sweep_dir: Path, tmp_path: Path) -> None:
    assert main(["plot", "xy", "--rows", str(sweep_dir / "rows.csv"), "--x", "context", "--y", "breakdown_ms.total",
                 "--group", "depth", "--out", str(tmp_path / "xy"), "--format", "png"]) == 0
    assert (tmp_path / "xy.png").exists() and not (tmp_path / "xy.svg").exists()


@pytest.mark.parametrize("args, message", [
    (["pie"], "unknown plot kind 'pie'"),
    (["xy", "--x", "context", "--y", "nope"], "unknown column 'nope'"),
    (["xy", "--x", "context"], "--y"),
    (["gain-vs-depth", "--format", "gif"], "--format"),
    (["timeline", "--depth", "0"], "--depth >= 1"),
    (["ring-vs-context", "--budget-lines", "abc"], "--budget-lines"),
])
def test_bad_input_one_line_exit_2(sweep_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                   message: str) -> None:
    rows = [] if args[0] == "timeline" else ["--rows", str(sweep_dir / "rows.json")]
    assert main(["plot", *args, *rows, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_rows_without_an_ordered_baseline_are_refused(sweep_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [r for r in json.loads((sweep_dir / "rows.json").read_text()) if r["depth"] == 1]
    (tmp_path / "piped.json").write_text(json.dumps(rows))
    assert main(["plot", "gain-vs-depth", "--rows", str(tmp_path / "piped.json"), "--out", str(tmp_path / "x")]) == 2
    assert "depth-0" in capsys.readouterr().err


def test_rows_missing_a_field_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.json").write_text(json.dumps([{"model": "m", "context": 4096}]))
    assert main(["plot", "gain-vs-context", "--rows", str(tmp_path / "bad.json"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "lacks hardware" in err
