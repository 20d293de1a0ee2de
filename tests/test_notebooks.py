"""The notebooks: committed without outputs, and executed end to end on small grids (a broken notebook fails here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the 'notebooks' extra is part of dev: CI installs it")
nbclient = pytest.importorskip("nbclient", reason="the 'notebooks' extra is part of dev: CI installs it")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SMALL = {  # CI-sized grids: a few seconds of simulation each
    "KVPIPE_CONTEXTS": "4096,16384",
    "KVPIPE_SCAN": "4096..24576/4096",
    "KVPIPE_BUDGETS": "0,128",
    "KVPIPE_DEPTHS": "0..2/1",
    "KVPIPE_TOKENS": "2",
    "KVPIPE_DEEP": "2",
}


def _run(name: str, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> object:
    for k, v in {**SMALL, **env}.items():
        monkeypatch.setenv(k, v)
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    return nb


def _synthetic_report(folder: Path, drop: str = "") -> Path:
    """A small report in the schema ``kvpipe validate`` writes (the fields the notebook reads)."""
    points = []
    for ctx, base in ((4096, 31.6), (16384, 19.7)):
        for depth, gain in ((0, 0.0), (1, 0.4), (2, 0.3)):
            tps = base * (1 + gain)
            p = {"model": "qwen3.8-27b", "context": ctx, "depth": depth, "budget_mib": 0.0, "measured_tps": tps,
                 "measured_tps_min": tps * 0.99, "measured_tps_max": tps * 1.01, "predicted_tps": tps * 1.03,
                 "ceiling_share": 0.95, "output_hash": f"hash-{ctx}"}
            p.pop(drop, None)
            points.append(p)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps({"device": "synthetic", "points": points}))
    return folder


def test_there_are_three_notebooks_committed_without_outputs() -> None:
    assert [p.name for p in NOTEBOOKS] == ["capacity-planning.ipynb", "gain-vs-depth.ipynb", "validation-report.ipynb"]
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs committed"


def _images(nb: object) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)  # type: ignore[attr-defined]


def test_capacity_planning_executes(monkeypatch: pytest.MonkeyPatch) -> None:
    nb = _run("capacity-planning.ipynb", monkeypatch, {})
    assert _images(nb) == 3
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)  # type: ignore[attr-defined]
    assert "closed-form peak" in text and "declines past" in text


def test_gain_vs_depth_executes(monkeypatch: pytest.MonkeyPatch) -> None:
    nb = _run("gain-vs-depth.ipynb", monkeypatch, {})
    assert _images(nb) == 2


def test_validation_report_executes_on_a_report_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nb = _run("validation-report.ipynb", monkeypatch, {"KVPIPE_REPORT": str(_synthetic_report(tmp_path / "r"))})
    assert _images(nb) == 2
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)  # type: ignore[attr-defined]
    assert "6 points" in text and "every depth identical" in text and "median |error| 3.0%" in text


def test_validation_report_fails_on_a_report_missing_a_field(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="predicted_tps"):
        _run("validation-report.ipynb", monkeypatch, {"KVPIPE_REPORT": str(_synthetic_report(tmp_path / "r", drop="predicted_tps"))})
