"""llama-bench runs with -ngl below the layer count: the CPU layer's host cost fitted from them (validate.cpu_layers)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from backends.profile import read_profile_dict
from kvpipe.cli import main
from sim.errors import InputError
from sim.workload import ALL_LAYERS, cache_type, load_model
from validate.cpu_layers import closed_form_s, sim_runs_cpu_layers, workload_gpu_layers
from validate.token_fit import TokenRun, simulated_s, workload_at

SAMPLE = Path(__file__).parent / "fixtures" / "llama-bench-sample.json"  # real llama-bench -o json (CPU build)
GPU = {"weight_GBps": 2000.0, "attn_GBps": 500.0}
HOST = {"host_weight_GBps": 80.0, "host_attn_GBps": 5.0}


def _truth() -> dict[str, Any]:
    d = copy.deepcopy(read_profile_dict("h200-gen5x16-kvpipe")[0])
    for dev in d["devices"]:
        dev["compute"].update({**GPU, **HOST, "layer_us": 0.0, "attn_us": 0.0, "head_us": 0.0, "host_layer_us": 0.0,
                               "host_attn_us": 0.0})
    return d


def _bench(tmp_path: Path, ngls: tuple[int, ...], depths: tuple[int, ...] = (1024, 4096)) -> Path:
    """A llama-bench file of -nkvo 0 runs at each -ngl and depth, timed by the truth (the closed form below -ngl 33)."""
    truth, m, q = _truth(), load_model("llama-3.1-8b"), cache_type("q8_0")
    sample = json.loads(SAMPLE.read_text())[0]
    recs = []
    for ngl in ngls:
        for depth in depths:
            run = TokenRun(depth + 32, 1.0, "resident", n_gpu_layers=workload_gpu_layers(ngl, m))
            s = (simulated_s(truth, workload_at(m, q, q, depth + 32), "resident") if ngl > m.n_layers
                 else closed_form_s(truth, m, q, q, run))
            recs.append(dict(sample, build_commit="synthetic", gpu_info="NVIDIA H200", model_size=m.weight_bytes,
                             n_gpu_layers=ngl, no_kv_offload=False, n_gen=64, n_depth=depth, avg_ns=int(s * 64e9), avg_ts=1 / s))
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(recs))
    return src


def test_llama_cpp_counts_the_output_layer_as_its_last() -> None:
    m = load_model("llama-3.1-8b")  # 32 layers: -ngl 33 is every layer, -ngl 32 leaves layer 0 on the CPU
    assert [workload_gpu_layers(n, m) for n in (99, 33, 32, 25, 1)] == [ALL_LAYERS, ALL_LAYERS, 31, 24, 0]
    with pytest.raises(InputError, match="n_gpu_layers 0 of 32 layers: the output layer on the CPU"):
        workload_gpu_layers(0, m)


def test_a_fit_to_runs_below_every_layer_recovers_the_host_terms(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-llama-bench", str(_bench(tmp_path, (99, 25, 9))), "-m", "llama-3.1-8b",
                 "--hardware", "h200-gen5x16-kvpipe", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "CPU layers (q8_0): host_weight_GBps 80.00" in text and "CPU attention 5.00 GB/s" in text
    fitted = json.loads(out.read_text())
    got = fitted["devices"][0]["compute"]
    for key, want in {**GPU, **HOST}.items():
        assert got[key] == pytest.approx(want, rel=0.01), key
    assert got["host_layer_us"] == 0.0
    assert "-ngl 25 -nkvo 0 -d 1024" in fitted["calibration"]["runs"]
    assert fitted["provenance"]["devices.compute.host_layer"].startswith("fitted from llama-bench")
    residuals = fitted["workloads"]["llama-3.1-8b@q8_0"]["residuals"]
    assert len(residuals) == 6 and all(abs(r["error"]) < 0.01 for r in residuals)


def test_a_file_without_runs_below_every_layer_leaves_the_cpu_layer_uncalibrated(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-llama-bench", str(_bench(tmp_path, (99,))), "-m", "llama-3.1-8b",
                 "--hardware", "h200-gen5x16-kvpipe", "--out", str(out)]) == 0
    assert "CPU layers: not calibrated" in capsys.readouterr().out
    fitted = json.loads(out.read_text())
    assert "host_weight_GBps" not in fitted["devices"][0]["compute"]
    assert fitted["provenance"]["devices.compute.host_layer"].startswith("not calibrated")


def test_runs_at_one_depth_fold_the_attention_into_the_weights_rate(tmp_path: Path) -> None:
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-llama-bench", str(_bench(tmp_path, (99, 17), (1024, 4096))), "-m", "llama-3.1-8b",
                 "--hardware", "h200-gen5x16-kvpipe", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["devices"][0]["compute"]["host_attn_GBps"] == pytest.approx(5.0, rel=0.01)
    src = _bench(tmp_path, (99, 17, 9), (1024, 4096))
    recs = [r for r in json.loads(src.read_text()) if r["n_gpu_layers"] == 99 or r["n_depth"] == 1024]
    src.write_text(json.dumps(recs))
    assert main(["calibrate", "--from-llama-bench", str(src), "-m", "llama-3.1-8b", "--hardware", "h200-gen5x16-kvpipe",
                 "--out", str(out)]) == 0
    fitted = json.loads(out.read_text())
    assert "host_attn_GBps" not in fitted["devices"][0]["compute"]
    assert "folded into host_weight_GBps" in fitted["provenance"]["devices.compute.host_layer"]


def test_a_file_of_runs_all_below_every_layer_is_refused(tmp_path: Path, capsys: Any) -> None:
    assert main(["calibrate", "--from-llama-bench", str(_bench(tmp_path, (25, 9))), "-m", "llama-3.1-8b",
                 "--hardware", "h200-gen5x16-kvpipe", "--out", str(tmp_path / "fit.json")]) == 2
    assert "n_gpu_layers 25 of 32 layers (and the output layer) at most" in capsys.readouterr().err


def test_the_simulated_cpu_layers_agree_with_the_closed_form() -> None:
    """Once sim.graph runs layers below -ngl on the CPU, its token is the closed form's (within the split effects)."""
    truth, m, q = _truth(), load_model("llama-3.1-8b"), cache_type("q8_0")
    if not sim_runs_cpu_layers(truth, m, q, q):
        pytest.skip("awaits the graph's CPU layers (sim.graph reading Workload.n_gpu_layers)")
    for ngl, arm in ((28, "resident"), (16, "resident"), (28, "ordered"), (16, "ordered")):
        run = TokenRun(4128, 1.0, arm, pinned=arm == "resident", n_gpu_layers=ngl)
        wl = workload_at(m, q, q, run.context, pinned=run.pinned, n_gpu_layers=ngl)
        assert simulated_s(truth, wl, arm) == pytest.approx(closed_form_s(truth, m, q, q, run), rel=0.05), (ngl, arm)
