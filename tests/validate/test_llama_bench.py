"""``kvpipe calibrate --from-llama-bench``: llama-bench files in, a fitted profile out, bad files refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backends.profile import load_profile, read_profile_dict
from kvpipe.cli import main
from sim.workload import cache_type, load_model
from tests.conftest import tool
from validate import llama_bench
from validate.token_fit import simulated_s, workload_at

FIXTURES = Path(__file__).parent / "fixtures"
ORDERED = FIXTURES / "reference-ordered.llama-bench.json"
BOTH = FIXTURES / "reference-both-arms.llama-bench.jsonl"


def _fit(tmp_path: Path, src: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-llama-bench", str(src), "-m", "qwen3.8-27b", "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_the_reference_ordered_table_as_llama_bench_reproduces_calibrate_reference(tmp_path: Path) -> None:
    fitted = _fit(tmp_path, ORDERED)
    preset, _ = read_profile_dict("rtx4070-gen4x16")
    want, got = preset["devices"][0]["compute"], fitted["devices"][0]["compute"]
    for key in ("weight_GBps", "attn_GBps"):
        assert got[key] == pytest.approx(want[key], rel=0.01), key
    # and the fitted profile predicts the preset's ordered and pipelined t/s within 1% where it was not fitted
    q = cache_type("q8_0")
    m = load_model("qwen3.8-27b")
    for ctx in (8192, 24576):
        wl = workload_at(m, q, q, ctx)
        assert simulated_s(fitted, wl, "ordered") == pytest.approx(simulated_s(preset, wl, "ordered"), rel=0.01)
    entry = fitted["workloads"]["qwen3.8-27b@q8_0"]
    assert entry["compute_from"] == "ordered" and entry["h2d_GBps"] is None
    assert len(entry["held_out"]) == 3 and entry["band"] == pytest.approx(max(abs(h["error"]) for h in entry["held_out"]), abs=1e-5)
    assert entry["band"] > 0
    assert fitted["provenance"]["devices.compute"].startswith("fitted from llama-bench")
    assert "published" in fitted["provenance"]["host"]
    load_profile(str(tmp_path / "fit.json"))  # a profile like any other


def test_with_resident_runs_the_compute_comes_from_them_and_the_link_from_the_ordered_runs(tmp_path: Path) -> None:
    fitted = _fit(tmp_path, BOTH)
    device = tool("reference_derivation").derive("device")["devices"][0]["compute"]
    got = fitted["devices"][0]["compute"]
    for key in ("weight_GBps", "attn_GBps"):
        assert got[key] == pytest.approx(device[key], rel=0.01), key
    entry = fitted["workloads"]["qwen3.8-27b@q8_0"]
    assert entry["compute_from"] == "resident"
    h2d = fitted["devices"][0]["links"]["h2d_pinned"]["points"]
    assert h2d == [[1.0, entry["h2d_GBps"]]] and 15 < entry["h2d_GBps"] < 31.5  # under the gen4 x16 line rate
    assert all(abs(r["error"]) < 0.02 for r in entry["residuals"])
    assert {h["arm"] for h in entry["held_out"]} == {"ordered", "resident"}
    assert "ordered runs" in fitted["provenance"]["devices.links.h2d_pinned"]


def test_compute_from_ordered_can_be_forced_and_json_equals_jsonl(tmp_path: Path) -> None:
    forced = _fit(tmp_path, BOTH, "--compute-from", "ordered")
    plain = _fit(tmp_path, ORDERED)
    assert forced["devices"][0]["compute"] == plain["devices"][0]["compute"]
    a, b = llama_bench.load(ORDERED), llama_bench.load(BOTH)
    assert [r for r in b.runs if r.kv_offload_host] == list(a.runs)


def test_seconds_per_token_is_the_mean_time_when_the_file_has_it() -> None:
    run = llama_bench.load(ORDERED).runs[0]
    assert run.seconds_per_token == pytest.approx(31.6e-3)  # avg_ns / n_gen, not 1 / avg_ts (31.65 ms)
    bare = llama_bench.BenchRun(4096, 128, True, "q8_0", "q8_0", 20.0, 0.0, ())
    assert bare.seconds_per_token == pytest.approx(0.05)


def _records() -> list[dict[str, Any]]:
    return [json.loads(line) for line in BOTH.read_text().splitlines()]


def _write(tmp_path: Path, records: Any, name: str = "bad.json") -> Path:
    p = tmp_path / name
    p.write_text(records if isinstance(records, str) else json.dumps(records))
    return p


BAD_CASES = {
    "not json": ("this is not llama-bench output\n", "not valid JSON"),
    "empty": ("", "empty"),
    "no fields": ([{"n_gen": 64}], "has no 'build_commit'"),
    "a number": ("[3]", "not a test record"),
    "prompt tests only": (lambda rs: [dict(r, n_gen=0, n_prompt=512) for r in rs], "no decode test"),
    "mixed builds": (lambda rs: [dict(r, build_commit=f"b{i % 2}") for i, r in enumerate(rs)], "mixes builds"),
    "mixed models": (lambda rs: [dict(r, model_size=r["model_size"] + i) for i, r in enumerate(rs)], "mixes models"),
    "mixed GPUs": (lambda rs: [dict(r, gpu_info=f"GPU {i}") for i, r in enumerate(rs)], "mixes GPUs"),
    "cache type": (lambda rs: [dict(r, type_k="q5_k") for r in rs], "type_k 'q5_k' unsupported"),
    "ngl": (lambda rs: [dict(r, n_gpu_layers=20) for r in rs], "n_gpu_layers 20 of 64"),
    "one depth": (lambda rs: [dict(r, n_depth=4096) for r in rs], "two depths"),
    "nan": (lambda rs: [dict(r, avg_ts="fast") for r in rs], "avg_ts 'fast' is not a finite number"),
    "wrong model": (lambda rs: [dict(r, model_size=r["model_size"] // 3) for r in rs], "the model llama-bench ran"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_files_are_one_line_and_exit_2_and_write_nothing(case: str, tmp_path: Path, capsys: Any) -> None:
    content, message = BAD_CASES[case]
    src = _write(tmp_path, content(_records()) if callable(content) else content)
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-llama-bench", str(src), "-m", "qwen3.8-27b", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("kvpipe: error:") and message in err, err
    assert not out.exists()


def test_the_model_and_the_card_are_found_or_asked_for(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-llama-bench", str(ORDERED), "--out", str(out)]) == 2  # model_filename is not here
    assert "give --model" in capsys.readouterr().err
    unknown = _write(tmp_path, [dict(r, gpu_info="Some Card 9000") for r in json.loads(ORDERED.read_text())])
    assert main(["calibrate", "--from-llama-bench", str(unknown), "-m", "qwen3.8-27b", "--out", str(out)]) == 2
    assert "names no preset" in capsys.readouterr().err and not out.exists()
    assert main(["calibrate", "--from-llama-bench", str(unknown), "-m", "qwen3.8-27b", "--hardware", "rtx4070-gen4x16",
                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["calibration"]["gpu_info"] == "Some Card 9000"


def test_real_llama_bench_output_is_read() -> None:
    bench = llama_bench.load(FIXTURES / "llama-bench-sample.json")  # a CPU build's -o json, as llama-bench wrote it
    assert bench.build_commit == "0c1e570" and bench.model_type == "llama ?B F16"
    assert sorted((r.arm, r.depth) for r in bench.runs) == [("ordered", 0), ("ordered", 2048), ("resident", 0), ("resident", 2048)]
    assert all(r.samples_tps and r.seconds_per_token > 0 for r in bench.runs)


def test_a_profile_fitted_on_a_preset_records_no_local_path(tmp_path: Path) -> None:
    """The base preset is named by its place in the package, the same on every machine and checkout."""
    presets = str(Path(__file__).resolve().parents[2] / "backends" / "presets")
    for hardware in ((), ("--hardware", "rtx4070-gen4x16")):
        fitted = _fit(tmp_path, ORDERED, *hardware)
        text = json.dumps(fitted)
        assert "backends/presets/rtx4070-gen4x16.json" in fitted["source"], fitted["source"]
        assert presets not in text and "backends/presets/rtx4070-gen4x16.json" in fitted["provenance"]["host"]
    own = tmp_path / "mine.json"
    own.write_text(json.dumps(read_profile_dict("rtx4070-gen4x16")[0]))
    assert read_profile_dict(str(own))[1] == str(own)  # a user's own file: as given
