"""kvpipe plan under a memory cap: the user's model on the user's card, what fits, at what t/s, with which build's flags."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvpipe.capacity import FORK, UPSTREAM, plan_fit
from kvpipe.capacity_fit import fits_host_cache
from kvpipe.cli import main
from kvpipe.plan import PlanRequest
from sim.memory import GIB


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:  # type: ignore[type-arg]
    assert main(["plan", "--tokens", "2", "--max-depth", "2", "--jobs", "1", "--host-mem", "64", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("card", ["rtx4070-gen4x16", "rtx3060-gen3x4"])
def test_an_8b_model_plans_on_a_12_gb_card_instead_of_a_false_out_of_memory(capsys: pytest.CaptureFixture[str], card: str) -> None:
    got = _plan(capsys, "-m", "llama-3.1-8b", "--hardware", card, "-d", "16384,32768,131072")
    assert [c["context"] for c in got] == [16384, 32768, 131072]
    for c in got:
        best = c["memory_plan"]["best"]
        assert best is not None and best["tokens_per_s"] > 0
        assert best["memory_gib"]["free"] >= 0  # what the plan picks fits the card
        assert best["memory_gib"]["weights"] == pytest.approx(4.58, abs=0.01)
    # 16,384 cells of KV (1.1 GiB) fit beside 4.6 GiB of weights: the cache on the device, upstream's flags, no -nkvo
    small = got[0]["memory_plan"]["best"]
    assert small["resident"] and got[0]["llama_cpp"]["build"] == UPSTREAM and "-nkvo" not in got[0]["llama_cpp"]["flags"]
    # 131,072 cells (4.3 GiB x 32 layers' worth) do not: the host cache, with as many KV layers on the GPU as fit
    big = got[2]["memory_plan"]["best"]
    assert not big["resident"] and "-nkvo" in got[2]["llama_cpp"]["flags"]


def test_weights_that_cannot_load_get_a_verdict_with_the_ngl_that_fits_never_a_gain(capsys: pytest.CaptureFixture[str]) -> None:
    got = _plan(capsys, "-m", "llama-3.1-70b", "--hardware", "rtx4070-gen4x16", "-d", "32768,65536")
    head = got[0]["memory_plan"]
    n = head["gpu_layers"]  # repeating layers on the GPU; llama.cpp's -ngl counts the output layer too
    assert "do not fit" in head["weights_verdict"] and f"-ngl {n + 1} at most ({n} of 80 layers" in head["weights_verdict"]
    assert 0 < n < 80
    for c in got:
        assert "uncapped_gain" not in c and "gain_by_depth" not in c  # no gain analysis for a model that cannot load
        best = c["memory_plan"]["best"]
        assert best is not None and best["n_gpu_layers"] <= n + 1 and best["memory_gib"]["free"] >= 0
    assert main(["plan", "--tokens", "2", "--max-depth", "1", "--jobs", "1", "--host-mem", "64", "-m", "llama-3.1-70b",
                 "-d", "32768"]) == 0
    text = capsys.readouterr().out
    assert "-ngl" in text and "uncapped gain" not in text


def test_flags_name_their_build_and_the_upstream_build_gets_only_upstream_flags(capsys: pytest.CaptureFixture[str]) -> None:
    fork = _plan(capsys, "-d", "65536")  # the reference model: its 2.1 GiB cache does not fit beside 9.6 GiB of weights
    fl = fork[0]["llama_cpp"]["flags"]
    assert fork[0]["llama_cpp"]["build"] == FORK and "--kv-cpu-pinned" in fl
    assert "--kv-pipeline-depth" in fl or "--kv-gpu-layers" in fl  # the fork's own: a pipeline or resident layers
    up = _plan(capsys, "-d", "65536", "--build", "upstream")
    best = up[0]["memory_plan"]["best"]
    assert best["depth"] == 0 and best["kv_gpu_layers"] == 0 and not best["pinned"]
    assert up[0]["llama_cpp"]["build"] == UPSTREAM and "--kv-" not in up[0]["llama_cpp"]["flags"]


def test_a_smaller_vram_moves_the_cache_off_the_device_and_still_fits(capsys: pytest.CaptureFixture[str]) -> None:
    card = _plan(capsys, "-m", "llama-3.1-8b", "--hardware", "rtx4070-gen4x16", "-d", "32768")[0]["memory_plan"]
    small = _plan(capsys, "-m", "llama-3.1-8b", "--hardware", "rtx4070-gen4x16", "-d", "32768", "--vram", "6")[0]["memory_plan"]
    assert card["best"]["resident"] and not small["best"]["resident"]
    assert small["vram_gib"] == 6 and small["best"]["memory_gib"]["free"] >= 0
    assert small["largest_resident_context"] < card["largest_resident_context"]


def test_the_largest_context_is_the_edge_of_what_fits() -> None:
    req = PlanRequest(model="llama-3.1-8b", hardware="rtx4070-gen4x16", contexts=(4096,), max_depth=1, tokens=2, jobs=1,
                      host_mem_gib=64.0)
    fp = plan_fit(req)
    from kvpipe.plan import points

    wl = points(req, [4096], [0], 0)[0].workload
    reserved = points(req, [4096], [0], 0)[0].hardware.devices[0].memory_reserved_bytes
    edge = fp.largest_host_context
    assert fits_host_cache(replace(wl, context=(edge,)), fp.limits, reserved)
    assert not fits_host_cache(replace(wl, context=(edge + 1024,)), fp.limits, reserved)
    assert fp.largest_resident_context < edge


def test_min_tps_gives_the_largest_context_at_or_above_it() -> None:
    req = PlanRequest(model="llama-3.1-8b", hardware="rtx4070-gen4x16", contexts=(8192,), max_depth=1, tokens=2, jobs=1,
                      host_mem_gib=64.0, min_tps=20.0)
    fp = plan_fit(req)
    c = fp.largest_at_min_tps
    assert c is not None and 8192 < c < fp.largest_host_context
    at, past = (plan_fit(replace(req, contexts=(x,), min_tps=None)).fits[0].best for x in (c, int(c * 1.1)))
    assert at is not None and past is not None and at.tokens_per_s >= 20.0 > past.tokens_per_s


def test_a_quantized_hf_config_weighs_what_its_type_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
           "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16", "model_type": "llama"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    bf16 = _plan(capsys, "-m", str(path), "-d", "4096")[0]["memory_plan"]  # read as BF16: 15 GiB, not on a 12 GB card
    assert f"{8.03e9 * 2 / GIB:.1f} GiB of weights on the GPU do not fit" in bf16["weights_verdict"]
    q4 = _plan(capsys, "-m", str(path), "-d", "4096", "--weights-type", "q4_k_m")[0]["memory_plan"]
    assert q4["weights_verdict"] == "" and q4["gpu_layers"] == 32
    assert q4["best"]["memory_gib"]["weights"] == pytest.approx(8.03e9 * 4.85 / 8 / GIB, rel=0.01)


@pytest.mark.parametrize(("args", "message"), [
    (["--vram", "64"], "--vram 64 GiB is above the card"),
    (["--vram", "0"], "--vram 0 out of range"),
    (["-ngl", "-1"], "-ngl -1 out of range"),
    (["-ngl", "0"], "-ngl 0 out of range"),
    (["-ngl", "1.5"], "1.5"),
    (["--min-tps", "-3"], "--min-tps -3 out of range"),
    (["--weights-type", "q9_z"], "--weights-type 'q9_z' unknown"),
    (["--build", "mine"], "mine"),
    (["-d", "1..100000", "--max-depth", "14", "--budget", "0..200"], "the plan has 303,000,000 points"),
])
def test_bad_memory_plan_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main(["plan", "--tokens", "1", "-d", "4096", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_the_plot_draws_every_context_that_fits_and_the_memory_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--tokens", "2", "--max-depth", "1", "--jobs", "1", "--host-mem", "64", "-m", "llama-3.1-8b",
                 "-d", "16384,131072", "--plot", str(tmp_path / "plan")]) == 0
    capsys.readouterr()
    assert (tmp_path / "plan.png").stat().st_size > 10_000
    svg = (tmp_path / "plan.svg").read_text()
    assert "16,384" in svg and "131,072" in svg and "KV on the device" in svg and "compute buffer~" in svg


def test_the_plan_holds_its_evaluated_rows_to_the_simulator_once(monkeypatch: pytest.MonkeyPatch) -> None:
    req = PlanRequest(contexts=(4096, 16384), max_depth=1, tokens=2, jobs=1, host_mem_gib=64.0)
    fp = plan_fit(req)
    n, worst = fp.check
    assert n > 0 and 0.0 <= worst <= 1e-9  # the evaluator answered, and a sample agreed with the simulator
    from sim.evaluator import EvaluatorDisagreement
    from sim.evaluator.evaluate import Evaluation

    real = Evaluation.row

    def off_by_a_little(self, i, wall_s=0.0):  # type: ignore[no-untyped-def]
        r = real(self, i, wall_s)
        return {**r, "tokens_per_s": r["tokens_per_s"] * (1 + 1e-6)}

    monkeypatch.setattr(Evaluation, "row", off_by_a_little)
    with pytest.raises(EvaluatorDisagreement):
        plan_fit(req)
    assert plan_fit(replace(req, check_n=0)).check[1] == 0.0  # --check 0: nothing re-simulated


def test_the_memory_plan_runs_beside_the_gain_analysis_with_the_answer_of_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the plan's pool (``--jobs 2``, work worth several pieces), the memory plan's candidates are submitted as soon
    as the gain grid's uncapped figures give their rings, and collected after the gain analysis's own runs
    (``Runner.start``): every figure, choice and the sample check (the same points drawn: runs join the check's record
    in the order they are collected) the same as one process's, where every run is made when it starts."""
    from kvpipe import plan_run

    monkeypatch.setattr(plan_run, "PARALLEL_POINTS", 8)  # pieces for a small plan: the pool is used
    monkeypatch.setattr(plan_run, "PARALLEL_LINES", 1)
    log: list[tuple[str, int]] = []
    real = plan_run.Runner.start

    def start(self, pts, grid=False):  # type: ignore[no-untyped-def]
        log.append(("start", len(pts)))
        got = real(self, pts, grid)
        return lambda: (log.append(("collect", len(pts))), got())[1]

    monkeypatch.setattr(plan_run.Runner, "start", start)
    req = PlanRequest(contexts=tuple(range(4096, 4096 * 13, 4096)), tokens=2, max_depth=3, budgets_mib=(0, 64), jobs=2,
                      host_mem_gib=64)
    two = plan_fit(req)
    mem = log[2][1]  # the grid's run, then the memory plan's begun, the budgets' runs made, the memory plan's collected
    assert log[:3] == [("start", 12 * 4 * 2), ("collect", 12 * 4 * 2), ("start", mem)] and log[-1] == ("collect", mem)
    assert len(log) > 4 and all(kind == "start" for kind, _ in log[3:-1:2]) and all(kind == "collect" for kind, _ in log[4:-1:2])
    two_log = list(log)
    log.clear()
    one = plan_fit(replace(req, jobs=1))
    assert log == two_log  # runs started and recorded in the same order (one process makes each as it starts)
    assert (one.check, one.checked, one.checked_exact) == (two.check, two.checked, two.checked_exact)
    assert [f.best for f in one.fits] == [f.best for f in two.fits] and [f.candidates for f in one.fits] == [f.candidates for f in two.fits]
    assert [p.to_json() for p in one.plans] == [p.to_json() for p in two.plans]


@pytest.mark.parametrize("build", ["fork", "upstream"])
def test_the_memory_plan_placed_while_the_grid_runs_is_the_one_placed_after(build: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_plan_fit`` makes each context's candidates but the rings' (``kvpipe.capacity_fit.placed``) while the grid is
    answered (``plan(meanwhile=...)``): every candidate run, every choice, the plans and the check are those made with
    nothing placed ahead -- over contexts where the cache fits the device and where it does not, a context asked twice,
    both builds."""
    from kvpipe import capacity
    from kvpipe import plan as gain_plan
    from kvpipe.plan_run import Runner

    req = PlanRequest(model="llama-3.1-8b", contexts=(8192, 65536, 8192, 200_000), tokens=2, max_depth=3, jobs=1, build=build,
                      host_mem_gib=64)
    runs: dict[str, list[object]] = {}
    real_start, real_plan = Runner.start, gain_plan.plan

    def answers(tag: str) -> object:
        runs[tag] = []

        def start(self: Runner, pts: object, grid: bool = False) -> object:
            runs[tag].append(list(pts) if not grid else len(pts))  # type: ignore[arg-type]
            return real_start(self, pts, grid)  # type: ignore[arg-type]

        monkeypatch.setattr(Runner, "start", start)
        out = plan_fit(req)
        return ([(f.context, f.best, f.candidates, f.reason) for f in out.fits], [p.to_json() for p in out.plans], out.check,
                out.checked)

    ahead = answers("ahead")
    monkeypatch.setattr(gain_plan, "plan", lambda *a, meanwhile=None, **k: real_plan(*a, **k))  # nothing placed ahead
    after = answers("after")
    assert ahead == after and runs["ahead"] == runs["after"]
    assert any(c is not None and c.resident for _, c, _, _ in ahead[0]) or build == "upstream"  # type: ignore[index]
    placed_ahead: list[int] = []
    monkeypatch.setattr(gain_plan, "plan", real_plan)
    real_placed = capacity.placed
    monkeypatch.setattr(capacity, "placed", lambda *a, **k: placed_ahead.append(1) or real_placed(*a, **k))
    plan_fit(req)
    assert len(placed_ahead) == len(set(req.contexts))  # each context placed once, ahead; its twin made as before
