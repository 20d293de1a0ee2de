"""``kvpipe calibrate --from-batched-bench``: llama-batched-bench files in, the per-sequence term out, bad files one line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from backends.profile import load_profile, read_profile_dict
from kvpipe.cli import main
from sim.errors import InputError
from sim.workload import cache_type, load_model
from validate import batched_bench
from validate.batch_fit import with_staging, with_term
from validate.token_fit import simulated_s, workload_at

FIXTURES = Path(__file__).parent / "fixtures"
JSONL = FIXTURES / "batched-bench-split-pp2048.jsonl"  # llama-batched-bench --output-format jsonl (H200, run 4)
MARKDOWN = FIXTURES / "batched-bench-split-pp2048.md"  # the same run as its markdown table prints it, log lines around


def test_the_jsonl_and_the_markdown_table_of_one_run_give_the_same_steps() -> None:
    j, m = batched_bench.load(JSONL), batched_bench.load(MARKDOWN)
    assert (j.form, m.form) == ("jsonl", "markdown")
    assert j.settings == tuple((k, v) for k, v in m.settings if k != "is_tg_separate")  # the JSONL lacks is_tg_separate
    assert [(r.prompt_tokens, r.gen_tokens, r.sequences, r.n_kv) for r in j.rows] == \
        [(r.prompt_tokens, r.gen_tokens, r.sequences, r.n_kv) for r in m.rows]
    for a, b in zip(j.rows, m.rows, strict=True):
        assert b.seconds_per_step == pytest.approx(a.seconds_per_step, rel=2e-4)  # S_TG printed to 2 decimals


def test_a_step_is_all_sequences_over_the_decode_rate_behind_the_mean_context() -> None:
    raw = [json.loads(line) for line in JSONL.read_text().splitlines() if line.strip()]
    bench = batched_bench.load(JSONL)
    for rec, row in zip(raw, bench.rows, strict=True):
        assert row.seconds_per_step == pytest.approx(rec["t_tg"] / rec["tg"], rel=1e-5)  # speed_tg = pl tg / t_tg
        assert row.context == rec["pp"] + rec["tg"] // 2
    runs = batched_bench.token_runs(bench, "ordered", unified=True, pinned=False)
    assert [(r.sequences, r.unified, r.pinned, r.arm) for r in runs] == [(row.sequences, True, False, "ordered") for row in bench.rows]


def _write_truth_rows(path: Path, base: dict[str, Any], term_us: float, offset_s: float, unified: bool, pp: int = 2048,
                      markdown: bool = False) -> None:
    """A llama-batched-bench file whose steps are what ``base`` with ``layer_seq_us = term_us`` simulates, plus a
    constant (what a one-sequence profile misses at that point)."""
    m, q = load_model("llama-3.1-8b"), cache_type("q8_0")
    truth = with_term(base, "layer_seq_us", term_us)
    lines = []
    for b in (1, 2, 4, 8):
        s = simulated_s(truth, workload_at(m, q, q, pp + 16, sequences=b, unified=unified), "ordered") + offset_s
        rec = {"n_kv_max": 8 * (pp + 32) + 256, "n_batch": 2048, "n_ubatch": 512, "flash_attn": 1, "is_pp_shared": 0,
               "n_gpu_layers": 99, "n_threads": 16, "n_threads_batch": 16, "pp": pp, "tg": 32, "pl": b, "n_kv": b * (pp + 32),
               "t_pp": 0.5, "speed_pp": b * pp / 0.5, "t_tg": 32 * s, "speed_tg": b / s, "t": 0.5 + 32 * s, "speed": 1.0}
        cells = " | ".join(f"{rec[k]:.6g}" for k in ("pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed"))
        lines.append(f"| {cells} |" if markdown else json.dumps(rec))
    if markdown:
        lines = ["| " + " | ".join(batched_bench.COLUMNS) + " |", "|---" * len(batched_bench.COLUMNS) + "|", *lines]
    path.write_text("\n".join(lines) + "\n")


def test_a_users_file_fits_in_one_command_and_the_profile_reproduces_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = read_profile_dict("h200-gen5x16")
    split, unified, out = tmp_path / "split.jsonl", tmp_path / "unified.md", tmp_path / "fit.json"
    _write_truth_rows(split, base, 37.0, 1.0e-3, unified=False)
    _write_truth_rows(unified, base, 37.0, -0.5e-3, unified=True, markdown=True)
    assert main(["calibrate", "--from-batched-bench", f"{split},{unified}", "--kv-unified", "0,1", "--nkvo", "1",
                 "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "layer_seq_us" in printed and printed.count("| split -npp 2048") == 4 and printed.count("| unified -npp 2048") == 4
    fitted = json.loads(out.read_text())
    assert fitted["devices"][0]["compute"]["layer_seq_us"] == pytest.approx(37.0, abs=2e-3)
    record = fitted["batch"]
    assert {(o["unified"], round(o["offset_ms"], 2)) for o in record["offsets"]} == {(False, 1.0), (True, -0.5)}
    # exact rows: any row left out, the others give the same term (the rows at one sequence hold none of it)
    assert len(record["held_out"]) == 6 and all(h["term_us"] == pytest.approx(37.0, abs=2e-3) for h in record["held_out"])
    assert "devices.compute.layer_seq_us" in fitted["provenance"]
    load_profile(str(out))  # a profile like any other
    m, q = load_model("llama-3.1-8b"), cache_type("q8_0")
    wl = workload_at(m, q, q, 4096, sequences=4, unified=False)
    assert simulated_s(fitted, wl, "ordered") == pytest.approx(simulated_s(with_term(base, "layer_seq_us", 37.0), wl, "ordered"),
                                                              rel=1e-4)


def _good(path: Path) -> Path:
    path.write_text(JSONL.read_text())
    return path


def _edit(path: Path, line: int, **changes: Any) -> Path:
    recs = [json.loads(x) for x in JSONL.read_text().splitlines() if x.strip()]
    recs[line].update(changes)
    for k in [k for k, v in changes.items() if v is None]:
        del recs[line][k]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return path


BAD_FILES = {
    "empty": lambda p: p.write_text(""),
    "prose": lambda p: p.write_text("llama_model_load: error loading model\n"),
    "not-json": lambda p: p.write_text('{"pp": 2048, "tg": \n'),
    "no-speed_tg": lambda p: _edit(p, 1, speed_tg=None),
    "speed_tg-0": lambda p: _edit(p, 1, speed_tg=0),
    "pl-0": lambda p: _edit(p, 1, pl=0),
    "pl-text": lambda p: _edit(p, 2, pl="four"),
    "shared-prompt": lambda p: _edit(p, 2, n_kv=2048 + 4 * 32),
    "is_pp_shared": lambda p: _edit_all(_good(p), is_pp_shared=1),
    "is_tg_separate": lambda p: p.write_text(MARKDOWN.read_text().replace("is_tg_separate = 0", "is_tg_separate = 1")),
    "mixed-ngl": lambda p: _edit(p, 3, n_gpu_layers=20),
    "md-text-cell": lambda p: p.write_text(MARKDOWN.read_text().replace("|    40.39 |", "|    4O.39 |")),
    "md-short-row": lambda p: p.write_text(MARKDOWN.read_text().replace("|    2.215 |  1878.19 |", "|")),
}


def _refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]) -> str:
    before = sorted(os.listdir(tmp_path))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path)) == before  # nothing half-written
    return err


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_file_is_one_line_naming_it_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str) -> None:
    src = tmp_path / "bench.jsonl"
    BAD_FILES[case](src)
    err = _refused(capsys, tmp_path, ["calibrate", "--from-batched-bench", str(src), "--nkvo", "1", "--hardware", "h200-gen5x16",
                                      "-m", "llama-3.1-8b", "--out", str(tmp_path / "fit.json")])
    assert "bench.jsonl" in err and "allowed" in err, err


BAD_CALLS = {
    "no-nkvo": (["--hardware", "h200-gen5x16", "-m", "llama-3.1-8b"], "--nkvo"),
    "kvu-count": (["--nkvo", "1", "--kv-unified", "0,1", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b"], "--kv-unified"),
    "kvu-value": (["--nkvo", "1", "--kv-unified", "2", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b"], "--kv-unified"),
    "no-hardware": (["--nkvo", "1", "-m", "llama-3.1-8b"], "--hardware"),
    "no-model": (["--nkvo", "1", "--hardware", "h200-gen5x16"], "--model"),
    "ngl-below": (["--nkvo", "1", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b"], "n_gpu_layers"),
    "one-count": (["--nkvo", "1", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b"], "sequence counts"),
    "staging-one-npp": (["--nkvo", "1", "--fit-staging", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b"], "two -npp values"),
    "staging-how": (["--nkvo", "1", "--fit-staging", "some", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b"], "'some'"),
    "staging-no-one": (["--nkvo", "1", "--fit-staging", "one", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b"], "one sequence"),
    "staging-no-one-sizes": (["--nkvo", "1", "--fit-staging", "sizes", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b"],
                             "one sequence"),
    "span-resident": (["--nkvo", "0", "--kv-copy", "span", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b"], "span with --nkvo 0"),
    "copy-how": (["--nkvo", "1", "--kv-copy", "gaps", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b"], "'gaps'"),
    "outlier-spread": (["--nkvo", "1", "--drop-outliers", "1.5", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b"],
                       "--drop-outliers 1.5"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_a_bad_invocation_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str) -> None:
    src = _good(tmp_path / "bench.jsonl")
    argv, named = BAD_CALLS[case]
    if case == "ngl-below":  # 20 of llama-3.1-8b's 32 layers on the GPU: the rest on the CPU, not fitted here
        src = _edit_all(src, n_gpu_layers=20)
    if case == "one-count":
        src = _edit_all(src, pl=4, n_kv=4 * 2080)
    if case.startswith("staging-no-one"):  # rows at 2, 4 and 8 sequences: the term is fitted, the one-sequence staging is not
        recs = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
        src.write_text("\n".join(json.dumps(r) for r in recs if r["pl"] > 1) + "\n")
    err = _refused(capsys, tmp_path, ["calibrate", "--from-batched-bench", str(src), *argv, "--out", str(tmp_path / "fit.json")])
    assert named in err, err


def _edit_all(path: Path, **changes: Any) -> Path:
    recs = [dict(json.loads(x), **changes) for x in path.read_text().splitlines() if x.strip()]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return path


def test_the_fit_never_writes_over_the_file_it_reads(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src = _good(tmp_path / "bench.jsonl")
    before = src.read_bytes()
    assert main(["calibrate", "--from-batched-bench", str(src), "--nkvo", "1", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b",
                 "--out", str(src)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bench.jsonl" in err and src.read_bytes() == before


def test_the_calls_staging_is_fitted_beside_the_term_from_two_prompt_lengths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = read_profile_dict("h200-gen5x16")
    slower = with_staging(base, "h2d_pinned", 0.9)  # this call's host link ran at 90% of the profile's
    files = [tmp_path / f"{lay}-{pp}.jsonl" for pp in (1024, 4096) for lay in ("split", "unified")]
    for f in files:
        _write_truth_rows(f, slower, 37.0, 0.0, unified=f.name.startswith("unified"), pp=int(f.stem.split("-")[1]))
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-batched-bench", ",".join(map(str, files)), "--kv-unified", "0,1,0,1", "--nkvo", "1",
                 "--fit-staging", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b", "--out", str(out)]) == 0
    assert "the staging rate 0.900 times" in capsys.readouterr().out
    fitted = json.loads(out.read_text())
    assert fitted["devices"][0]["compute"]["layer_seq_us"] == pytest.approx(37.0, rel=0.02)
    assert fitted["batch"]["staging_factor"] == pytest.approx(0.9, rel=0.005) and "devices.links.h2d_pinned" in fitted["provenance"]
    link = [g for _, g in fitted["devices"][0]["links"]["h2d_pinned"]["points"]]
    assert link == pytest.approx([g for _, g in slower["devices"][0]["links"]["h2d_pinned"]["points"]], rel=0.005)


def test_the_one_sequence_rule_takes_the_staging_from_the_one_sequence_rows_alone(tmp_path: Path,
                                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = read_profile_dict("h200-gen5x16")
    slower = with_staging(base, "h2d_pinned", 0.9)  # this call's host link ran at 90% of the profile's
    files = [tmp_path / f"{lay}.jsonl" for lay in ("split", "unified")]  # one -npp: enough for this rule
    for f in files:
        _write_truth_rows(f, slower, 37.0, 0.0, unified=f.name.startswith("unified"))
    out = tmp_path / "fit.json"
    argv = ["calibrate", "--from-batched-bench", ",".join(map(str, files)), "--kv-unified", "0,1", "--nkvo", "1",
            "--fit-staging", "one", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b", "--out", str(out)]
    assert main(argv) == 0
    assert "the staging rate 0.900 times --hardware's (from the one-sequence rows)" in capsys.readouterr().out
    fitted = json.loads(out.read_text())
    assert fitted["batch"]["staging_factor"] == pytest.approx(0.9, rel=0.005) and fitted["batch"]["staging_from"] == "one"
    assert fitted["devices"][0]["compute"]["layer_seq_us"] == pytest.approx(37.0, rel=0.02)
    assert "staging_one" in fitted["provenance"]["devices.links.h2d_pinned"]
    # the rows of further sequences do not move the factor (only the term): make them 20% slower
    for f in files:
        recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        f.write_text("\n".join(json.dumps(dict(r, t_tg=r["t_tg"] * 1.2, speed_tg=r["speed_tg"] / 1.2) if r["pl"] > 1 else r)
                               for r in recs) + "\n")
    assert main(argv) == 0
    again = json.loads(out.read_text())
    assert again["batch"]["staging_factor"] == pytest.approx(0.9, rel=0.005)
    assert again["devices"][0]["compute"]["layer_seq_us"] > 37.0 * 1.05  # the slower rows went into the term


def test_the_sizes_rule_fits_the_link_curve_at_the_one_sequence_rows_copy_sizes(tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 28, run 13: a held-out window between the calibration sizes was priced by the base curve's shape there.
    With ``--fit-staging sizes`` the curve is the one-sequence rows' own: a truth whose link runs at the base's rate at
    the short prompt's copy size and 20% below it at the long one's gives both rates back (a factor on the base's
    shape cannot: ``one`` leaves each size several percent off), the term beside them, and the profile carries the
    curve."""
    from validate.batch_fit import fit_per_sequence
    from validate.link_fit import with_points
    from validate.staging_fit import base_rate, one_sequence_copy_bytes

    base, _ = read_profile_dict("h200-gen5x16")
    m, q = load_model("llama-3.1-8b"), cache_type("q8_0")
    probe = tmp_path / "probe.jsonl"
    sizes = []
    for pp in (1024, 4096):
        _write_truth_rows(probe, base, 37.0, 0.0, unified=False, pp=pp)
        one = [r for r in batched_bench.token_runs(batched_bench.load(probe), "ordered", False, pinned=True) if r.sequences == 1]
        sizes.append(one_sequence_copy_bytes(m, q, q, one[0]) / 2**20)
    assert sizes[0] < sizes[1]
    truth_points = [(sizes[0], base_rate(base, "h2d_pinned", sizes[0])), (sizes[1], 0.8 * base_rate(base, "h2d_pinned", sizes[1]))]
    truth = with_points(base, "h2d_pinned", truth_points)
    files = [tmp_path / f"{lay}-{pp}.jsonl" for pp in (1024, 4096) for lay in ("split", "unified")]
    for f in files:
        _write_truth_rows(f, truth, 37.0, 0.0, unified=f.name.startswith("unified"), pp=int(f.stem.split("-")[1]))
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-batched-bench", ",".join(map(str, files)), "--kv-unified", "0,1,0,1", "--nkvo", "1",
                 "--fit-staging", "sizes", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b", "--out", str(out)]) == 0
    assert "the staging curve from the one-sequence rows: " in capsys.readouterr().out
    fitted = json.loads(out.read_text())
    points = fitted["devices"][0]["links"]["h2d_pinned"]["points"]
    assert [b for b, _ in points] == pytest.approx(sizes, rel=1e-9)
    assert [g for _, g in points] == pytest.approx([g for _, g in truth_points], rel=0.005)
    assert fitted["batch"]["staging_from"] == "sizes" and len(fitted["batch"]["staging_points"]) == 2
    assert fitted["devices"][0]["compute"]["layer_seq_us"] == pytest.approx(37.0, rel=0.02)
    assert "staging_sizes" in fitted["provenance"]["devices.links.h2d_pinned"]
    # the same rows under the one-factor rule: the base's shape between the sizes cannot carry both rates
    runs = [r for f in files for r in batched_bench.token_runs(batched_bench.load(f), "ordered", f.name.startswith("unified"),
                                                               pinned=True)]
    one = fit_per_sequence(base, m, q, q, runs, staging="one")
    worst = max(abs(r["error"]) for r in one.residuals if r["sequences"] == 1)
    sized = fit_per_sequence(base, m, q, q, runs, staging="sizes")
    assert worst > 0.03 and max(abs(r["error"]) for r in sized.residuals if r["sequences"] == 1) < 0.002


RUN9 = Path(__file__).resolve().parents[2] / "validate" / "results" / "h200-llamacpp" / "run9"


def test_upstreams_span_of_a_split_cache_is_named_where_a_stream_outgrows_the_window() -> None:
    # run 9's -npp 1216 split calls: n_kv_max 12288 over 8 sequences = streams of 1,536 cells, a 1,280-row window
    split = batched_bench.load(next(RUN9.glob("call*/r9-batched-split-pp1216-r1.jsonl")))
    got = [(r.sequences, stream, window, round(ratio, 4)) for r, stream, window, ratio in batched_bench.span_ratios(split, False)]
    assert got == [(2, 1536, 1280, 1.1), (4, 1536, 1280, 1.15), (8, 1536, 1280, 1.175)]
    assert batched_bench.span_ratios(split, True) == []  # read as -kvu: one stream, nothing between windows
    # -npp 1280: the streams (1,536) are the window, and a unified call's n_kv_max says nothing of streams
    for name, uni in (("r9-batched-split-pp1280-r1.jsonl", False), ("r9-batched-unified-pp1216-r1.jsonl", True)):
        assert batched_bench.span_ratios(batched_bench.load(next(RUN9.glob(f"call*/{name}"))), uni) == []


def test_calibrate_prints_one_note_for_a_split_file_whose_streams_outgrow_the_window(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = read_profile_dict("h200-gen5x16")
    split, unified, out = tmp_path / "split.jsonl", tmp_path / "unified.jsonl", tmp_path / "fit.json"
    _write_truth_rows(split, base, 37.0, 0.0, unified=False)
    _write_truth_rows(unified, base, 37.0, 0.0, unified=True)
    argv = ["calibrate", "--from-batched-bench", f"{split},{unified}", "--kv-unified", "0,1", "--nkvo", "1",
            "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b", "--out", str(out)]
    assert main(argv) == 0 and "note:" not in capsys.readouterr().out  # 8 x (2048 + 32) + 256: streams of 2,304 = window
    for path in (split, unified):  # a larger -c: streams of 2,560 cells
        path.write_text(path.read_text().replace('"n_kv_max": 16896', '"n_kv_max": 18944'))
    assert main(argv) == 0
    notes = [x for x in capsys.readouterr().out.splitlines() if x.startswith("note:")]
    assert len(notes) == 1 and str(split) in notes[0] and "-npl 8 " in notes[0] and "2560-cell streams" in notes[0]
    assert f"{(7 * 2560 + 2304) / (8 * 2304):.3f}x" in notes[0]


def test_kv_copy_span_fits_upstreams_rows_where_the_fork_s_model_reads_slower_sequences(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # rows upstream's span copy makes: -npp 960 at -c 16384, streams of 2,048 cells against a 1,024-row window
    base, _ = read_profile_dict("h200-gen5x16")
    m, q = load_model("llama-3.1-8b"), cache_type("q8_0")
    truth = with_term(base, "layer_seq_us", 37.0)
    files = []
    for uni in (False, True):
        lines = []
        for b in (1, 2, 4, 8):
            s = simulated_s(truth, workload_at(m, q, q, 960 + 16, sequences=b, unified=uni, cells_per_stream=2048,
                                               copy_span=True), "ordered")
            lines.append(json.dumps({"n_kv_max": 16384, "n_batch": 2048, "n_ubatch": 512, "flash_attn": 1, "is_pp_shared": 0,
                                     "n_gpu_layers": 99, "pp": 960, "tg": 32, "pl": b, "n_kv": b * 992, "t_pp": 0.5,
                                     "speed_pp": b * 960 / 0.5, "t_tg": 32 * s, "speed_tg": b / s, "t": 0.5 + 32 * s, "speed": 1.0}))
        files.append(tmp_path / f"{'unified' if uni else 'split'}.jsonl")
        files[-1].write_text("\n".join(lines) + "\n")
    fitted = {}
    for copy in ("span", "streams"):
        out = tmp_path / f"fit-{copy}.json"
        argv = ["calibrate", "--from-batched-bench", ",".join(map(str, files)), "--kv-unified", "0,1", "--nkvo", "1",
                "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b", "--kv-copy", copy, "--out", str(out)]
        assert main(argv) == 0
        text = capsys.readouterr().out
        assert ("give --kv-copy span" in text) == (copy == "streams")  # the note only where the span is not modelled
        fitted[copy] = json.loads(out.read_text())["devices"][0]["compute"]["layer_seq_us"]
    assert fitted["span"] == pytest.approx(37.0, rel=0.01)
    assert fitted["streams"] > 37.0 * 1.2  # the span's extra bytes read as slower sequences


def _scaled(src: Path, dst: Path, factor: float) -> Path:
    """``src`` as a call that ran ``factor`` times slower at every -npl."""
    recs = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    dst.write_text("\n".join(json.dumps(dict(r, t_tg=r["t_tg"] * factor, speed_tg=r["speed_tg"] / factor)) for r in recs) + "\n")
    return dst


def test_repeated_calls_of_a_configuration_are_fitted_at_their_geometric_mean(tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 28, run 11: calls of one configuration scatter ~9%; fitted call by call, the squared relative error puts
    the fit ~2 s^2 fast of their geometric mean, the statistic predictions are held to. Pooled first, two calls 25%
    slower and 25% faster than the truth give the truth's staging and term back, and the rows say so."""
    base, _ = read_profile_dict("h200-gen5x16")
    slower = with_staging(base, "h2d_pinned", 0.9)
    calls, flags = [], []
    for lay in ("split", "unified"):
        truth = tmp_path / f"{lay}.jsonl"
        _write_truth_rows(truth, slower, 37.0, 0.0, unified=lay == "unified")
        calls += [_scaled(truth, tmp_path / f"{lay}-slow.jsonl", 1.25), _scaled(truth, tmp_path / f"{lay}-fast.jsonl", 1 / 1.25)]
        flags += ["1" if lay == "unified" else "0"] * 2
    out = tmp_path / "fit.json"
    assert main(["calibrate", "--from-batched-bench", ",".join(map(str, calls)), "--kv-unified", ",".join(flags), "--nkvo",
                 "1", "--fit-staging", "one", "--hardware", "h200-gen5x16", "-m", "llama-3.1-8b", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("(geometric mean of 2 calls)") == 8  # 2 layouts x 4 -npl, one row each
    fitted = json.loads(out.read_text())
    assert fitted["batch"]["staging_factor"] == pytest.approx(0.9, rel=0.005)
    assert fitted["devices"][0]["compute"]["layer_seq_us"] == pytest.approx(37.0, rel=0.02)
    # the same calls one by one: each point's squared relative error is least below their geometric mean
    m, q = load_model("llama-3.1-8b"), cache_type("q8_0")
    runs = [r for f, u in zip(calls, flags, strict=True)
            for r in batched_bench.token_runs(batched_bench.load(f), "ordered", u == "1", pinned=True)]
    from validate.batch_fit import pooled, staging_one
    assert staging_one(base, m, q, q, runs) > 0.9 * 1.05  # call by call: the link fitted >5% fast
    assert staging_one(base, m, q, q, pooled(runs)) == pytest.approx(0.9, rel=0.005)


def test_a_call_outside_its_configurations_spread_is_left_out_and_only_it() -> None:
    """Issue 28, run 12: a slow spell of the machine ran one call 26-40% below its configuration's other calls. With a
    spread of 0.25 a call more than 25% below the median of its calls, or as far above in log (x 4/3), is left out;
    one just inside either side is kept; fewer than three calls, or a spread of 0, keep every call."""
    from validate.batch_fit import outlying

    calls = [53.1, 46.3, 58.5, 48.1, 56.9, 32.4, 53.3, 45.3]  # run 12's unified -npp 1000 one-sequence calls
    assert outlying(calls, 0.25) == [False] * 5 + [True] + [False] * 2
    assert outlying(calls, 0.0) == [False] * 8
    assert outlying([10.0, 5.0], 0.25) == [False, False]  # no median of three to hold them to
    mid = 100.0
    assert outlying([mid, mid, mid * 0.7501, mid / 0.7501, mid * 0.7499, mid / 0.7499], 0.25) == [False] * 4 + [True] * 2
    with pytest.raises(InputError, match="1.5"):
        outlying(calls, 1.5)


def test_pooling_with_a_spread_gives_the_truth_back_past_one_slow_call(tmp_path: Path) -> None:
    """Five calls of one configuration about a truth, one of them 40% slow: pooled with a spread of 0.25 the point is
    the geometric mean of the other four (the truth) and its label counts the call left out; pooled without, the
    slow call pulls the point ~10% slow."""
    from validate.batch_fit import pooled

    base, _ = read_profile_dict("h200-gen5x16")
    truth = tmp_path / "truth.jsonl"
    _write_truth_rows(truth, base, 37.0, 0.0, unified=False)
    scales = (1.05, 1 / 1.05, 1.02, 1 / 1.02, 1 / 0.6)  # t/s divided by these: the last call 40% slow
    runs = [r for i, k in enumerate(scales)
            for r in batched_bench.token_runs(batched_bench.load(_scaled(truth, tmp_path / f"c{i}.jsonl", k)), "ordered",
                                              False, pinned=True)]
    want = {r.sequences: r.seconds_per_token
            for r in batched_bench.token_runs(batched_bench.load(truth), "ordered", False, pinned=True)}
    kept = pooled(runs, 0.25)
    assert len(kept) == len(want)
    for r in kept:
        assert r.seconds_per_token == pytest.approx(want[r.sequences], rel=1e-9)
        assert "(geometric mean of 4 calls, 1 left out as outlying)" in r.label
    for r in pooled(runs):
        assert r.seconds_per_token > want[r.sequences] * 1.09
