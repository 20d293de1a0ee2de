"""Error bars and provenance: a prediction's band comes from its profile's calibration residuals, or it says uncalibrated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.profile import preset_names, read_profile_dict
from kvpipe.cli import main

KINDS = ("measured on a device", "fitted from published numbers", "fitted from llama-bench", "a specification estimate")


def _rows(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict]:  # type: ignore[type-arg]
    assert main(["simulate", "--context", "4096", "--depth", "0,1", "--tokens", "2", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_reference_preset_band_is_its_held_out_error_on_its_own_model(capsys: pytest.CaptureFixture[str]) -> None:
    band = read_profile_dict("rtx4070-gen4x16")[0]["calibration"]["band"]
    assert 0 < band < 0.05
    for r in _rows(capsys):
        lo, hi = r["tokens_per_s_interval"]
        assert lo == pytest.approx(r["tokens_per_s"] * (1 - band)) and hi == pytest.approx(r["tokens_per_s"] * (1 + band))
        assert r["interval"].startswith(f"+-{band:.1%}") and "held-out" in r["interval"]


def test_other_models_and_probe_presets_are_uncalibrated(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (("-m", "llama-3.1-8b"), ("-ctk", "f16"), ("--hardware", "h200-gen5x16")):
        for r in _rows(capsys, *argv):
            assert r["tokens_per_s_interval"] is None and r["interval"].startswith("uncalibrated"), argv
    assert main(["simulate", "--context", "4096", "--tokens", "2", "--hardware", "h200-gen5x16"]) == 0
    assert "uncal." in capsys.readouterr().out


def test_a_llama_bench_fit_carries_its_band_into_rows_and_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = Path(__file__).parents[1] / "validate" / "fixtures" / "reference-both-arms.llama-bench.jsonl"
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-llama-bench", str(src), "-m", "qwen3.8-27b", "--out", str(out)]) == 0
    capsys.readouterr()
    band = json.loads(out.read_text())["workloads"]["qwen3.8-27b@q8_0"]["band"]
    rows = _rows(capsys, "--hardware", str(out), "-nkvo", "0,1")
    assert len(rows) == 3 and all(r["tokens_per_s_interval"][1] == pytest.approx(r["tokens_per_s"] * (1 + band)) for r in rows)
    assert main(["simulate", "--context", "4096", "--tokens", "2", "--hardware", str(out)]) == 0
    assert f"{band:.1%}" in capsys.readouterr().out


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_says_where_its_numbers_come_from(name: str) -> None:
    data = read_profile_dict(name)[0]
    prov = data["provenance"]
    assert data["schema"] == "kvpipe.profile/1" or data.get("estimate")
    assert any(prov["kind"].startswith(k) for k in KINDS), prov["kind"]
    assert data.get("estimate") == (prov["kind"] == "a specification estimate")
