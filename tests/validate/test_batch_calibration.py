"""The batched decode's per-sequence terms: in the graph, and calibrated back from runs at several batch sizes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from backends.profile import compute_model_of, read_profile_dict
from kvpipe.cli import main
from sim.graph import decode_graph
from sim.workload import Workload, cache_type, load_model

TERMS = {"layer_seq_us": 3.0, "attn_seq_us": 20.0, "cpu_row_us": 2.0}


def test_each_sequence_past_the_first_adds_its_terms_to_its_splits() -> None:
    base = read_profile_dict("h200-gen5x16-kvpipe")[0]["devices"][0]["compute"]
    comp = compute_model_of({**base, **TERMS})
    one = compute_model_of(base)
    m, q = load_model("qwen3.8-27b"), cache_type("q8_0")  # hybrid: 3 recurrent layers beside each attention layer
    for b in (1, 4):
        wl = Workload(m, q, q, (4096,) * b, tokens=1, n_parallel=b)
        g, g1 = decode_graph(wl, comp, step=0), decode_graph(wl, one, step=0)
        for s, s1 in zip(g.splits, g1.splits, strict=True):
            if s.kind == "cpu":
                assert s.compute_s - s1.compute_s == pytest.approx((b - 1) * 2e-6)
            else:
                want = (b - 1) * (len(s.layers) * 3e-6 + (20e-6 if s.attn_layer >= 0 else 0.0))
                assert s.compute_s - s1.compute_s == pytest.approx(want, abs=1e-12)


def test_calibrate_batch_recovers_the_terms_on_the_simulated_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = copy.deepcopy(read_profile_dict("h200-gen5x16-kvpipe")[0])
    d["workloads"] = {"llama-3.1-8b@q8_0": {"cache_type": "q8_0", "compute": {**d["devices"][0]["compute"], **TERMS}}}
    truth, out = tmp_path / "truth.json", tmp_path / "fit.json"
    truth.write_text(json.dumps(d))
    assert main(["calibrate", "--batch", "1,2,4", "--machine", "simpy", "--hardware", str(truth), "-m", "llama-3.1-8b",
                 "-ctk", "q8_0", "--windows", "512", "--scale", "0.05", "--out", str(out)]) == 0
    got = json.loads(out.read_text())["workloads"]["llama-3.1-8b@q8_0"]["compute"]
    assert got["cpu_row_us"] == pytest.approx(2.0, rel=1e-3)
    # a dense model's attention splits hold one layer each: only the sum per attention split is determined
    assert got["layer_seq_us"] + got["attn_seq_us"] == pytest.approx(23.0, rel=1e-3)
    assert main(["calibrate", "--batch", "4", "--hardware", str(truth), "--out", str(out)]) == 2
    assert "at least two distinct batch sizes" in capsys.readouterr().err


def test_simulate_json_shows_the_terms_as_their_own_breakdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = copy.deepcopy(read_profile_dict("h200-gen5x16-kvpipe")[0])
    d["devices"][0]["compute"].update(TERMS)
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(d))
    rows = {}
    for b in (1, 4):
        assert main(["simulate", "--hardware", str(prof), "-m", "llama-3.1-8b", "--context", "2048", "--parallel", str(b),
                     "--depth", "0", "--tokens", "2", "--json"]) == 0
        rows[b] = json.loads(capsys.readouterr().out)[0]["batch_ms"]
    n_attn = load_model("llama-3.1-8b").n_attn
    assert rows[1]["per_sequence_gpu"] == 0 and rows[1]["per_sequence_cpu"] == 0 and rows[4]["sequences"] == 4
    assert rows[4]["per_sequence_gpu"] == pytest.approx(3 * n_attn * (3.0 + 20.0) * 1e-3)  # 3 more sequences, per split
    assert rows[4]["per_sequence_cpu"] == pytest.approx(3 * n_attn * 2.0 * 1e-3)
    assert rows[4]["weights"] == pytest.approx(rows[1]["weights"])  # the weights are read once for the batch
