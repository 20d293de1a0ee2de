"""The batched decode's per-sequence terms: in the graph, and calibrated back from runs at several batch sizes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from backends.profile import compute_model_of, read_profile_dict
from sim.cli import main
from sim.graph import decode_graph
from sim.workload import Workload, cache_type, load_model

TERMS = {"layer_seq_us": 3.0, "attn_seq_us": 20.0, "cpu_row_us": 2.0}


def test_each_sequence_past_the_first_adds_its_terms_to_its_splits() -> None:
    base = read_profile_dict("h200-gen5x16")[0]["devices"][0]["compute"]
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
    d = copy.deepcopy(read_profile_dict("h200-gen5x16")[0])
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
