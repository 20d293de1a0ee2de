"""Upstream llama.cpp's -nkvo (attention on the CPU): the host-attention arm, and its fit from llama-bench runs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from backends.profile import read_profile_dict
from kvpipe.cli import main
from sim.graph import decode_graph
from sim.workload import cache_type, load_model
from validate.token_fit import simulated_s, workload_at

SAMPLE = Path(__file__).parent / "fixtures" / "llama-bench-sample.json"  # real llama-bench -o json (CPU build)
TRUTH = {"weight_GBps": 3200.0, "attn_GBps": 1500.0, "host_attn_us": 25.0, "host_attn_GBps": 60.0}


def _truth() -> dict[str, Any]:
    d, _ = read_profile_dict("h200-gen5x16-kvpipe")
    d = copy.deepcopy(d)
    d["nkvo_attention"] = "host"
    for dev in d["devices"]:
        dev["compute"].update({**TRUTH, "layer_us": 0.0, "attn_us": 0.0, "head_us": 0.0})
    return d


def test_the_host_attention_graph_moves_no_window_and_charges_the_cpu() -> None:
    m, q = load_model("llama-3.1-8b"), cache_type("q8_0")
    wl = workload_at(m, q, q, 8192)
    comp = __import__("backends.profile", fromlist=["compute_model_of"]).compute_model_of(_truth()["devices"][0]["compute"])
    fork, upstream = decode_graph(wl, comp, position=8192), decode_graph(wl, comp, position=8192, host_attention=True)
    assert sum(len(s.staged) for s in upstream.splits) == 0 < sum(len(s.staged) for s in fork.splits)
    window = upstream.window_rows * wl.row_bytes  # one attention layer's K+V window
    cpu = [s for s in upstream.splits if s.kind == "cpu"]
    assert len(cpu) == m.n_attn
    assert cpu[0].compute_s == pytest.approx(comp.cpu_split_s + 25e-6 + window / 60e9)
    assert [i.name.split("_l")[0] for i in cpu[0].ordered] == ["q_cur", "k_cur", "v_cur"]  # Q comes down too
    gpu_fork = sum(s.compute_s for s in fork.splits if s.kind == "gpu")
    gpu_up = sum(s.compute_s for s in upstream.splits if s.kind == "gpu")
    assert gpu_fork - gpu_up == pytest.approx(m.n_attn * window / 1500e9)  # no attention left on the GPU


def test_a_fit_to_upstream_runs_recovers_the_terms_that_made_them(tmp_path: Path, capsys: Any) -> None:
    truth, m, q = _truth(), load_model("llama-3.1-8b"), cache_type("q8_0")
    sample = json.loads(SAMPLE.read_text())[0]
    recs = []
    for nkvo in (False, True):
        for depth in (1024, 2048, 4096, 8192):
            s = simulated_s(truth, workload_at(m, q, q, depth + 32), "ordered" if nkvo else "resident")
            recs.append(dict(sample, build_commit="synthetic", gpu_info="NVIDIA H200", model_size=m.weight_bytes, n_gpu_layers=99,
                             no_kv_offload=nkvo, n_gen=64, n_depth=depth, avg_ns=int(s * 64e9), avg_ts=1 / s))
    src, out = tmp_path / "bench.json", tmp_path / "fit.json"
    src.write_text(json.dumps(recs))
    assert main(["calibrate", "--from-llama-bench", str(src), "-m", "llama-3.1-8b", "--nkvo-attention", "host",
                 "--out", str(out)]) == 0
    fitted = json.loads(out.read_text())
    got = fitted["devices"][0]["compute"]
    for key, want in TRUTH.items():
        assert got[key] == pytest.approx(want, rel=0.01), key
    assert fitted["nkvo_attention"] == "host"
    capsys.readouterr()
    # the fitted profile predicts -nkvo 1 as upstream runs it, and refuses a pipelined depth there
    assert main(["simulate", "--hardware", str(out), "-m", "llama-3.1-8b", "--context", "16384", "--depth", "0",
                 "--tokens", "2", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["arm"] == "host-attention"
    want = 1 / simulated_s(truth, workload_at(m, q, q, 16384), "ordered")
    assert row["tokens_per_s"] == pytest.approx(want, rel=0.01)
    assert main(["simulate", "--hardware", str(out), "-m", "llama-3.1-8b", "--context", "4096", "--depth", "1"]) == 2
    assert "no pipelined path" in capsys.readouterr().err
    # ordered compute cannot come from runs whose attention ran on the CPU
    assert main(["calibrate", "--from-llama-bench", str(src), "-m", "llama-3.1-8b", "--nkvo-attention", "host",
                 "--compute-from", "ordered", "--out", str(tmp_path / "x.json")]) == 2
