"""kvpipe report: the kind is read from the content, the page needs no network, and its tables hold the inputs' numbers.

The ``browser`` test renders the committed H200 validation report in headless
Chromium: no console message, every figure has a box, the tables hold the
report's numbers. It skips, with the reason, where Chromium is missing
(``.ci/run`` installs it from the distribution's packages).
"""

from __future__ import annotations

import gzip
import html
import json
import re
import shlex
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from kvpipe import html_report
from kvpipe.cli import main
from sim.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "validate/results/h200/run13/report/report.json"  # the committed H200 validation (docs/validation.md)
SIM = ["--context", "4096,16384", "--depth", "0,1,2", "--budget", "0,128", "--tokens", "2"]
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)


class Tables(HTMLParser):
    """The page's tables: name -> rows, each row field -> (data-value, the cell's text)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tables: dict[str, list[dict[str, tuple[str | None, str]]]] = {}
        self._table: list[dict[str, tuple[str | None, str]]] | None = None
        self._row: dict[str, tuple[str | None, str]] | None = None
        self._cell: list[Any] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self._table = self.tables.setdefault(a.get("data-table") or "", [])
        elif tag == "tr" and self._table is not None and "data-index" in a:
            self._row = {}
            self._table.append(self._row)
        elif tag == "td" and self._row is not None:
            self._cell = [a.get("data-field"), a.get("data-value"), ""]

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell[2] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None and self._row is not None:
            if self._cell[0]:
                self._row[self._cell[0]] = (self._cell[1], self._cell[2])
            self._cell = None
        elif tag == "tr":
            self._row = None
        elif tag == "table":
            self._table = None


def assert_validate_tables(text: str, doc: dict[str, Any]) -> None:
    """Every point's measured, predicted and error cells, and every regime's errors, are the report's numbers."""
    tables = Tables(text).tables
    assert len(tables["points"]) == len(doc["points"]) == 72
    for row, p in zip(tables["points"], doc["points"], strict=True):
        for f, fmt in (("context", "{:,}"), ("measured_tps", "{:.2f}"), ("measured_tps_min", "{:.2f}"),
                       ("measured_tps_max", "{:.2f}"), ("predicted_tps", "{:.2f}"), ("error", "{:+.1%}")):
            value, cell = row[f]
            assert value is not None and float(value) == p[f] and cell == fmt.format(p[f]), (f, p[f], row[f])
    s = doc["summary"]
    expect = [s, *s["per_regime"].values(), s["reference_arms"]]
    assert len(tables["errors"]) == len(expect) == 5
    for row, e in zip(tables["errors"], expect, strict=True):
        assert int(row["points"][0] or 0) == e["points"]
        assert float(row["median_abs_error"][0] or "nan") == e["median_abs_error"]
        assert row["max_abs_error"][1] == f"{e['max_abs_error']:.1%}"
    assert len(tables["exactness"]) == len(doc["exactness"]["groups"])


@pytest.fixture(scope="module")
def h200_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["report", str(H200), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def small_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The H200 report's llama-3.1-8b f16 groups alone (a quicker page)."""
    doc = json.loads(H200.read_text())
    keep = lambda p: (p["model"], p["cache_type"]) == ("llama-3.1-8b", "f16")  # noqa: E731
    doc["points"] = [p for p in doc["points"] if keep(p)]
    doc["exactness"]["groups"] = [g for g in doc["exactness"]["groups"] if keep(g)]
    out = tmp_path_factory.mktemp("small") / "report.json"
    out.write_text(json.dumps(doc))
    return out


def _json_out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


# -------------------------------------------------------------- the inputs


def test_the_kind_is_read_from_the_content_not_the_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json_out(capsys, ["simulate", *SIM, "--json"])
    plan = _json_out(capsys, ["plan", "--context", "4096,16384", "--max-depth", "2", "--tokens", "1", "--jobs", "1", "--json"])
    (tmp_path / "plan.json").write_text(json.dumps(rows))
    (tmp_path / "rows.json").write_text(json.dumps(plan))
    (tmp_path / "x.bin").write_bytes(gzip.compress(H200.read_bytes()))
    assert main(["simulate", *SIM, "--trace", str(tmp_path / "report.json")]) == 0
    kinds = [i.kind for f in ("plan.json", "rows.json", "x.bin", "report.json") for i in html_report.load_inputs(tmp_path / f)]
    assert kinds == ["rows", "plan", "validate", "trace"]


@pytest.mark.parametrize("content, why", [
    ("not json at all", "not JSON"),
    ('{"traceEvent": []}', "a JSON object of none of these shapes"),
    ("[]", "an empty list"),
    ('[{"context": 4096, "depth": 1}]', "a JSON value of none of these shapes"),
])
def test_an_unknown_file_is_one_line_naming_it_and_the_kinds_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   content: str, why: str) -> None:
    bad = tmp_path / "odd.json"
    bad.write_text(content)
    assert main(["report", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and repr(str(bad)) in err and why in err
    assert all(k in err for k in ("kvpipe sweep --out DIR", "kvpipe simulate --json", "kvpipe plan --json", "report.json"))
    assert not (tmp_path / "r.html").exists()
    with pytest.raises(InputError, match="holds neither rows.json"):
        html_report.load_inputs(tmp_path)
    with pytest.raises(InputError, match="cannot read .*missing.json"):
        html_report.load_inputs(tmp_path / "missing.json")


def test_out_is_written_whole_through_write_output(tmp_path: Path, small_report: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(small_report), "--out", str(tmp_path)]) == 2
    assert "it is a folder" in capsys.readouterr().err
    old = tmp_path / "r.html"
    old.write_text("old")
    assert main(["report", str(small_report), "--out", str(old)]) == 0
    capsys.readouterr()
    assert main(["report", str(small_report), "--out", "-"]) == 0
    assert capsys.readouterr().out == old.read_text().replace(str(old), "-")  # the same input gives the same bytes
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left


# ---------------------------------------------------------------- the page


def test_the_page_needs_no_network_and_names_the_commands(h200_page: Path) -> None:
    text = h200_page.read_text()
    doc = json.loads(H200.read_text())
    assert "<script" not in text and "<link" not in text and "@import" not in text and "<?xml" not in text
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#|data:)""", text)  # only in-page anchors and data: images
    assert not re.search(r"url\((?!#)", text)
    assert f'content="{html_report.CSP}"' in text and "default-src 'none'" in html_report.CSP
    assert text.count("<figure") == text.count("<svg") == 2
    cmds = re.findall(r'<pre class="cmd">(.*?)</pre>', text, re.S)
    assert cmds[0] == f"kvpipe report {H200} --out {h200_page}"
    assert html.unescape(cmds[1]).split("\n") == doc["command"].split(" ; ")
    assert_validate_tables(text, doc)


def test_a_sweep_folder_names_its_grid_and_draws_depth_context_and_budget(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    assert main(["sweep", *SIM, "--jobs", "1", "--out", str(out), "--quiet"]) == 0
    (inp,) = html_report.load_inputs(out)
    assert inp.kind == "rows" and inp.folder and inp.settings["pinned"] == [True]
    text = html_report.page([inp], "kvpipe report DIR")
    rebuilt = ("kvpipe sweep --model qwen3.8-27b --hardware rtx4070-gen4x16 --cache-type q8_0 --context 4096,16384 "
               f"--depth 0,1,2 --budget 0,128 --tokens 2 --out {out}")
    assert f'<pre class="cmd">{rebuilt}</pre>' in text
    captions = re.findall(r"<figcaption>(.*?):", text)
    assert captions == ["gain vs depth", "gain vs context", "ring per context against the budgets"]
    rows = Tables(text).tables["rows"]
    data = json.loads((out / "rows.json").read_text())
    assert [float(r["tokens_per_s"][0] or 0) for r in rows] == [r["tokens_per_s"] for r in data]


def test_the_rebuilt_simulate_command_gives_the_same_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json_out(capsys, ["simulate", *SIM, "--json"])
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    text = html_report.page(html_report.load_inputs(tmp_path / "rows.json"), "kvpipe report rows.json")
    rebuilt = re.findall(r'<pre class="cmd">(.*?)</pre>', text, re.S)[1]
    argv = shlex.split(rebuilt)
    assert argv[:2] == ["kvpipe", "simulate"] and argv[-1] == "--json"
    assert _json_out(capsys, argv[1:]) == rows


def test_a_plan_draws_gain_and_the_budget_per_context(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _json_out(capsys, ["plan", "--context", "4096,16384", "--max-depth", "2", "--tokens", "1", "--jobs", "1", "--json"])
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    text = html_report.page(html_report.load_inputs(tmp_path / "plan.json"), "kvpipe report plan.json")
    assert "kvpipe plan --context 4096,16384 --max-depth 2 --default-budget 128 --json" in text
    assert "neither the model nor the hardware" in text
    assert re.findall(r"<figcaption>(.*?)</figcaption>", text) == [
        "gain vs depth per context (uncapped ring)", "gain vs context per depth (uncapped ring)",
        "budget per context: the ring each depth needs"]
    rows = Tables(text).tables["plan"]
    assert [(float(r["uncapped_gain"][0] or 0), r["budget_mib_for_full_gain"][1]) for r in rows] == [
        (p["uncapped_gain"], f"{p['budget_mib_for_full_gain']:.1f}") for p in plan]


def test_a_trace_beside_a_validate_report_draws_its_timeline(tmp_path: Path, small_report: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "validate-report"
    folder.mkdir()
    shutil.copy(small_report, folder / "report.json")
    grid = ["--context", "4096", "--depth", "0,1", "--tokens", "3"]
    assert main(["simulate", *grid, "--trace", str(folder / "trace.json")]) == 0
    inputs = html_report.load_inputs(folder)
    assert [i.kind for i in inputs] == ["validate", "trace"]
    text = html_report.page(inputs, "kvpipe report validate-report")
    assert text.count("<svg") == 3 and "timeline: qwen3.8-27b rtx4070-gen4x16 ctx=4096 depth=0" in text
    timelines = Tables(text).tables["timelines"]
    assert [r["tokens"][0] for r in timelines] == ["3", "3"]
    totals = _json_out(capsys, ["simulate", *grid, "--json"])
    for row, r in zip(timelines, totals, strict=True):
        assert float(row["last_token_ms"][0] or 0) == pytest.approx(r["ms_per_token"], rel=0.02)


# ------------------------------------------------------------- the browser

PROBE = """<script>
window.__errors = [];
const __err = console.error;
console.error = (...a) => { __errors.push(a.join(" ")); __err.apply(console, a); };
window.addEventListener("error", e => __errors.push("error: " + (e.message || (e.target && (e.target.src || e.target.href)) || "?")), true);
document.addEventListener("securitypolicyviolation", e => __errors.push("csp: " + e.violatedDirective + " " + e.blockedURI));
window.addEventListener("load", () => {
  const boxes = [...document.querySelectorAll("figure > svg")].map(s => {
    const r = s.getBoundingClientRect(); return {id: s.parentElement.id, width: r.width, height: r.height}; });
  const out = document.createElement("pre");
  out.id = "kvpipe-probe";
  out.textContent = JSON.stringify({errors: __errors, boxes, svgs: document.querySelectorAll("svg").length});
  document.body.appendChild(out);
});
</script>"""


def _chromium(url: str, profile: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           f"--user-data-dir={profile}", "--window-size=1400,3000", "--enable-logging=stderr", "--v=0",
                           "--dump-dom", url], capture_output=True, text=True, timeout=180)


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium; .ci/run installs it)")
def test_the_h200_validation_report_renders_in_chromium(h200_page: Path, tmp_path: Path) -> None:
    text = h200_page.read_text()
    # The page itself: Chromium logs every console message (errors, CSP refusals) to stderr; there is none.
    real = _chromium(h200_page.as_uri(), tmp_path / "profile-page")
    assert real.returncode == 0, real.stderr[-2000:]
    assert [line for line in real.stderr.splitlines() if ":CONSOLE" in line] == []
    assert_validate_tables(real.stdout, json.loads(H200.read_text()))
    # A test-only copy with a probe (the page has no script; the copy's policy lets the probe run) measures the figures.
    copy = tmp_path / "probed.html"
    probed = text.replace(html_report.CSP, html_report.CSP + "; script-src 'unsafe-inline'", 1).replace("<head>", "<head>" + PROBE, 1)
    assert probed != text
    copy.write_text(probed)
    run = _chromium(copy.as_uri(), tmp_path / "profile-probe")
    assert run.returncode == 0, run.stderr[-2000:]
    found = re.search(r'<pre id="kvpipe-probe">(.*?)</pre>', run.stdout, re.S)
    assert found, run.stdout[-2000:]
    probe = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert probe["errors"] == []
    assert [b["id"] for b in probe["boxes"]] == ["fig-1", "fig-2"] and probe["svgs"] == 2
    assert all(b["width"] > 300 and b["height"] > 200 for b in probe["boxes"]), probe["boxes"]
    assert [line for line in run.stderr.splitlines() if ":CONSOLE" in line] == []


def test_the_command_line_names_the_kinds_the_report_reads() -> None:
    from kvpipe.commands import report

    assert report.ALLOWED == html_report.ALLOWED  # kept apart so that building the parser imports no report code
