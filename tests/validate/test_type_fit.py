"""Several KV cache types from one resident run each (validate/type_fit.py, issue 30), and the link they share.

Runs are made by the simulator under known terms, then fitted: the fit must give those terms back, compose a K/V pair
it never saw from its two sides, call a type it never saw uncalibrated (with a band, not another type's rate), and
tell a pageable copy's fixed cost from its rate when the copies span sizes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backends.profile import for_workload, load_profile, prediction_band, read_profile_dict
from kvpipe.cli import main
from sim.workload import cache_type, load_model
from validate.from_llama_bench import machine_differs
from validate.link_fit import OrderedRun, fit_pageable, with_curve, with_link
from validate.token_sim import TokenRun, simulated_s, workload_of
from validate.type_fit import CONVERT_KERNELS, SMALL_KERNEL_US, TypeTerms, converted, fit_types, rotation_us, with_terms

MODEL = load_model("qwen3.8-27b")
WEIGHT_GBPS = 430.0
TRUTH = {"q8_0": 230.0, "f16": 700.0, "q4_0": 150.0}  # attention GB/s per cache type, made up


def _base() -> dict[str, Any]:
    return read_profile_dict("rtx4070-gen4x16")[0]


def _truth(t: str) -> dict[str, Any]:
    ct = cache_type(t)
    return with_terms(_base(), WEIGHT_GBPS, TypeTerms(rotation_us(ct, ct), TRUTH[t], "truth"))


def _run(t: str, context: int, arm: str, pinned: bool = True) -> TokenRun:
    ct = cache_type(t)
    probe = TokenRun(context, 1.0, arm, f"-nkvo {int(arm == 'ordered')} -d {context}", pinned)
    return TokenRun(context, simulated_s(_truth(t), workload_of(MODEL, ct, ct, probe), arm), arm, probe.label, pinned)


@pytest.fixture(scope="module")
def fitted() -> Any:
    groups = {("q8_0", "q8_0"): [_run("q8_0", 2048, "resident"), _run("q8_0", 16384, "resident"), _run("q8_0", 8192, "ordered")],
              ("f16", "f16"): [_run("f16", 4096, "resident")], ("q4_0", "q4_0"): [_run("q4_0", 4096, "resident")]}
    return fit_types(_base(), MODEL, groups)


def test_one_resident_run_per_type_gives_back_each_types_attention(fitted: Any) -> None:
    assert fitted.reference == ("q8_0", "q8_0")
    assert fitted.weight_GBps == pytest.approx(WEIGHT_GBPS, rel=0.01)
    for t, gbps in TRUTH.items():
        terms = fitted.terms[(t, t)]
        assert terms.attn_GBps == pytest.approx(gbps, rel=0.02), t
        assert terms.attn_us == rotation_us(cache_type(t), cache_type(t))  # the rule: 0 for f16, the same for q8_0 and q4_0
    assert fitted.terms[("f16", "f16")].attn_us == 0 < fitted.terms[("q4_0", "q4_0")].attn_us
    # the link the pinned ordered run used: the preset's own (24.44 GB/s), found again
    assert fitted.link["GBps"] == pytest.approx(24.44, rel=0.02)


def test_a_mixed_pair_without_a_run_is_f16_plus_a_conversion_and_uncalibrated(fitted: Any) -> None:
    """Upstream's default build has no kernel for a mixed pair: it converts K and V to f16 and runs f16's kernel."""
    mixed = fitted.terms[("q8_0", "q4_0")]
    assert mixed.how.startswith("uncalibrated") and fitted.residuals[("q8_0", "q4_0")] == []  # no run of the pair
    assert mixed.convert_GBps == pytest.approx(fitted.weight_GBps)  # the stand-in: the weights' streaming rate
    q8, q4, probe = cache_type("q8_0"), cache_type("q4_0"), TokenRun(12288, 1.0, "resident")
    wl = workload_of(MODEL, q8, q4, probe)
    f16 = fitted.terms[("f16", "f16")]

    def token_s(convert_GBps: float) -> float:
        return simulated_s(with_terms(_base(), fitted.weight_GBps, converted(MODEL, q8, q4, f16, convert_GBps, "")), wl, "resident")

    assert simulated_s(with_terms(_base(), fitted.weight_GBps, mixed), wl, "resident") == pytest.approx(token_s(mixed.convert_GBps))
    f16_wl = workload_of(MODEL, cache_type("f16"), cache_type("f16"), probe)
    f16_s = simulated_s(with_terms(_base(), fitted.weight_GBps, f16), f16_wl, "resident")
    free = token_s(1e9)  # a free conversion leaves f16's token and the fixed kernels (rotation, conversion launches)
    fixed_s = MODEL.n_attn * (rotation_us(q8, q4) + 2 * CONVERT_KERNELS * SMALL_KERNEL_US) * 1e-6
    assert 0 < free - f16_s == pytest.approx(fixed_s, rel=0.05)
    assert token_s(500.0) - free == pytest.approx(2 * (token_s(1000.0) - free), rel=0.01)  # seconds per converted byte
    band, source = fitted.bands[("q8_0", "q4_0")]
    assert source.startswith("uncalibrated") and band > fitted.bands[("q8_0", "q8_0")][0]


def test_a_mixed_pair_with_one_resident_run_gets_its_conversion_rate_back() -> None:
    f16 = TypeTerms(0.0, TRUTH["f16"], "truth")
    truth_pair = converted(MODEL, cache_type("q8_0"), cache_type("q4_0"), f16, 900.0, "truth")
    pair_profile = with_terms(_base(), WEIGHT_GBPS, truth_pair)
    probe = TokenRun(8192, 1.0, "resident", "-nkvo 0 -d 8192")
    wl = workload_of(MODEL, cache_type("q8_0"), cache_type("q4_0"), probe)
    groups = {("q8_0", "q8_0"): [_run("q8_0", 2048, "resident"), _run("q8_0", 16384, "resident")],
              ("f16", "f16"): [_run("f16", 4096, "resident")],
              ("q8_0", "q4_0"): [TokenRun(8192, simulated_s(pair_profile, wl, "resident"), "resident", probe.label)]}
    fit = fit_types(_base(), MODEL, groups)
    pair = fit.terms[("q8_0", "q4_0")]
    assert "fitted to -nkvo 0 -d 8192" in pair.how and pair.convert_GBps == pytest.approx(900.0, rel=0.03)
    far = TokenRun(32768, 1.0, "resident")  # a depth the pair did not run: the conversion's slope, not only its point
    wl_far = workload_of(MODEL, cache_type("q8_0"), cache_type("q4_0"), far)
    assert simulated_s(with_terms(_base(), fit.weight_GBps, pair), wl_far, "resident") == pytest.approx(
        simulated_s(pair_profile, wl_far, "resident"), rel=0.01)
    assert not fit.bands[("q8_0", "q4_0")][1].startswith("uncalibrated")


def test_the_pageable_staging_fixed_cost_and_rate_are_told_apart_across_copy_sizes() -> None:
    truth = with_link(_truth("q8_0"), "h2d_pageable", 6.0, 40.0)
    q8 = cache_type("q8_0")
    items = []
    for ctx in (1024, 4096, 16384):
        probe = TokenRun(ctx, 1.0, "ordered", f"-d {ctx}", pinned=False)
        wl = workload_of(MODEL, q8, q8, probe)
        items.append(OrderedRun(_truth("q8_0"), wl, TokenRun(ctx, simulated_s(truth, wl, "ordered"), "ordered", probe.label, False)))
    fit = fit_pageable(items)
    assert fit["curve"] == "latency + rate"
    assert fit["GBps"] == pytest.approx(6.0, rel=0.02) and fit["latency_us"] == pytest.approx(40.0, rel=0.15)
    assert all(abs(r["error"]) < 0.005 for r in fit["runs"])
    assert fit["spread_GBps"]["max"] / fit["spread_GBps"]["min"] < 1.02  # one host: every run implies the same rate
    one = fit_pageable(items[:1])  # one copy size cannot tell the fixed cost from the rate: flat, the base's latency kept
    assert one["curve"] == "flat" and one["latency_us"] == _base()["devices"][0]["links"]["h2d_pageable"]["latency_us"]


def _bench_records(runs: dict[tuple[str, int, int], float]) -> list[dict[str, Any]]:
    fixture = Path(__file__).parent / "fixtures" / "reference-both-arms.llama-bench.jsonl"
    template = json.loads(fixture.read_text().splitlines()[0])
    return [dict(template, type_k=t, type_v=t, no_kv_offload=bool(nkvo), n_depth=d, n_gen=128, avg_ns=int(s * 128e9), avg_ts=1 / s)
            for (t, nkvo, d), s in runs.items()]


def test_a_type_the_file_does_not_cover_is_uncalibrated_with_a_band_not_another_types_rate(tmp_path: Path, capsys: Any) -> None:
    runs = {("q8_0", 0, 2048): _run("q8_0", 2048 + 64, "resident").seconds_per_token,
            ("q8_0", 0, 16384): _run("q8_0", 16384 + 64, "resident").seconds_per_token,
            ("f16", 0, 4096): _run("f16", 4096 + 64, "resident").seconds_per_token}
    src = tmp_path / "types.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in _bench_records(runs)) + "\n")
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-llama-bench", str(src), "-m", "qwen3.8-27b", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "uncalibrated" in printed and "| f16 |" in printed
    hw = load_profile(str(out))
    q5 = for_workload(hw, MODEL.name, "q5_0")
    assert q5.devices[0].compute != for_workload(hw, MODEL.name, "q8_0").devices[0].compute
    band = prediction_band(hw, MODEL.name, "q5_0")
    assert band is not None and band.source.startswith("uncalibrated") and band.relative > prediction_band(hw, MODEL.name, "q8_0").relative
    mixed = prediction_band(hw, MODEL.name, "q8_0", "f16")  # no run of the pair: f16's kernel after a conversion, a stand-in rate
    assert mixed is not None and mixed.source.startswith("uncalibrated")
    q8_band = prediction_band(hw, MODEL.name, "q8_0")
    assert q8_band is not None and mixed.relative > q8_band.relative
    assert json.loads(out.read_text())["calibration"]["machine"]["gpu_info"] == "NVIDIA GeForce RTX 4070"


def test_several_types_need_one_with_two_resident_depths(tmp_path: Path, capsys: Any) -> None:
    runs = {("q8_0", 0, 4096): 0.03, ("f16", 0, 8192): 0.03, ("q8_0", 1, 4096): 0.04}
    src = tmp_path / "types.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in _bench_records(runs)) + "\n")
    assert main(["calibrate", "--from-llama-bench", str(src), "-m", "qwen3.8-27b", "--out", str(tmp_path / "fit.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "two depths" in err and "allowed:" in err
    assert not (tmp_path / "fit.json").exists()


def test_a_profile_says_when_the_rows_come_from_another_machine() -> None:
    profile = {"calibration": {"machine": {"cpu_info": "Xeon A", "gpu_info": "NVIDIA H200"}}}
    assert machine_differs(profile, {"cpu_info": "Xeon A", "gpu_info": "NVIDIA H200"}) == ""
    note = machine_differs(profile, {"cpu_info": "EPYC B", "gpu_info": "NVIDIA H200"})
    assert "another machine" in note and "EPYC B" in note and "gpu_info" not in note
    assert "does not record" in machine_differs({}, {"cpu_info": "Xeon A", "gpu_info": "NVIDIA H200"})


def test_the_committed_held_out_predictions_are_the_blind_ones() -> None:
    """prediction-types/blind.json was committed before any held-out file was read; the comparison must use exactly
    those predictions (the profile refitted since gives the same t/s for every held-out run)."""
    folder = Path(__file__).resolve().parents[2] / "validate" / "results" / "h200-llamacpp" / "prediction-types"
    blind = {(r["cache"], r["nkvo"], r["depth"]): r["predicted_tps"] for r in json.loads((folder / "blind.json").read_text())["rows"]}
    held = {(r["cache"], r["nkvo"], r["depth"]): r["predicted_tps"]
            for r in json.loads((folder / "prediction.json").read_text())["rows"] if r["role"] == "held out"}
    assert held.keys() == blind.keys() and len(held) == 11
    for key, tps in held.items():
        assert tps == pytest.approx(blind[key], rel=1e-9), key


def _pageable_runs(truth: dict[str, Any], contexts: tuple[int, ...]) -> list[OrderedRun]:
    q8 = cache_type("q8_0")
    items = []
    for ctx in contexts:
        probe = TokenRun(ctx, 1.0, "ordered", f"-d {ctx}", pinned=False)
        wl = workload_of(MODEL, q8, q8, probe)
        items.append(OrderedRun(_truth("q8_0"), wl, TokenRun(ctx, simulated_s(truth, wl, "ordered"), "ordered", probe.label, False)))
    return items


def test_a_staging_rate_that_changes_regime_with_the_copy_size_is_found_and_predicts_a_size_between_runs() -> None:
    sizes = [i.copy_bytes() for i in _pageable_runs(_truth("q8_0"), (1024, 2048, 8192, 16384))]
    knee = (sizes[1] / 2**20, sizes[2] / 2**20)  # the host stages copies to the second size (MiB) at 9 GB/s, from the third at 7
    truth = with_link(_truth("q8_0"), "h2d_pageable", 9.0)
    for dev in truth["devices"]:
        dev["links"]["h2d_pageable"]["points"] = [[knee[0], 9.0], [knee[1], 7.0]]
    fit = fit_pageable(_pageable_runs(truth, (1024, 2048, 8192, 16384)))
    assert fit["curve"] == "two regimes"
    assert [p[0] for p in fit["points"]] == list(knee)
    assert [p[1] for p in fit["points"]] == pytest.approx([9.0, 7.0], rel=0.02)
    assert all(abs(r["error"]) < 0.01 for r in fit["runs"])
    flat = fit_pageable(_pageable_runs(truth, (2048,)))  # one copy size: flat, and the file says what it cannot tell
    assert flat["curve"] == "flat" and flat["band"] > 0 and "not determined" in flat["undetermined"]
    (unseen,) = _pageable_runs(truth, (12288,))  # a copy size no run had, in the upper regime
    assert unseen.error(with_curve(unseen.profile, "h2d_pageable", fit)) == pytest.approx(0.0, abs=0.01)
    assert abs(unseen.error(with_curve(unseen.profile, "h2d_pageable", flat))) > 0.05  # the flat rate of the small copies misses it


def test_a_curve_that_only_fits_the_scatter_of_the_runs_is_not_chosen() -> None:
    """Rates that scatter from run to run with no size effect: two regimes fit them in-sample far better than flat
    (the old in-sample rule took them), but predict each left-out run worse than the flat rate: flat is chosen."""
    rates = (8.8, 9.2, 7.0, 8.9, 7.2, 7.1)  # GB/s per run, copies growing with the depth
    items = []
    for ctx, g in zip((1024, 2048, 3072, 4096, 8192, 16384), rates, strict=True):
        probe = TokenRun(ctx, 1.0, "ordered", f"-d {ctx}", pinned=False)
        wl = workload_of(MODEL, cache_type("q8_0"), cache_type("q8_0"), probe)
        t = with_link(_truth("q8_0"), "h2d_pageable", g)
        items.append(OrderedRun(_truth("q8_0"), wl, TokenRun(ctx, simulated_s(t, wl, "ordered"), "ordered", probe.label, False)))
    fit = fit_pageable(items)
    choice = fit["choice"]
    assert choice["two regimes"]["in_sample_rms"] ** 2 <= 0.75 * choice["flat"]["in_sample_rms"] ** 2
    assert choice["two regimes"]["leave_one_out_rms"] > choice["flat"]["leave_one_out_rms"]
    assert fit["curve"] == "flat" and "band" not in fit  # copies of several sizes: the leave-one-out is the band, not a rule
    assert len(choice["flat"]["errors"]) == len(items)
