"""The command line: the default run, JSON schema, traces, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvpipe.cli import main

ROW_KEYS = {
    "context", "depth", "budget_mib", "tokens_per_s", "ms_per_token", "ring_mib", "ring_alloc_mib", "declined",
    "decline_reason", "early_mib", "late_mib", "ordered_mib", "breakdown_ms",
}


def test_default_run_prints_reference_table(capsys):  # type: ignore[no-untyped-def]
    assert main([]) == 0
    out = capsys.readouterr().out
    for ctx in ("4,096", "16,384", "32,768"):
        assert ctx in out
    assert "gain" in out and "qwen3.8-27b" in out and "declined" in out  # 32,768 is over the default budget


def test_json_rows_have_the_schema(capsys):  # type: ignore[no-untyped-def]
    assert main(["simulate", "--context", "4096", "--depth", "0,1", "--budget", "0", "--tokens", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and all(ROW_KEYS <= set(r) for r in rows)
    ordered, piped = rows
    assert ordered["ring_mib"] == 0 and piped["ring_mib"] > 0
    assert piped["tokens_per_s"] > ordered["tokens_per_s"]
    assert set(piped["breakdown_ms"]) >= {"total", "blocked_in_ordered_copies", "waiting_for_consumer", "issuing_deliveries"}


def test_aliases_and_csv_and_trace(tmp_path, capsys):  # type: ignore[no-untyped-def]
    csv_path, trace_path = tmp_path / "rows.csv", tmp_path / "t.json"
    code = main(["simulate", "--context", "4096", "-kvpd", "1", "--kv-pipeline-budget", "0", "--tokens", "1",
                 "--csv", str(csv_path), "--trace", str(trace_path)])
    assert code == 0
    header = csv_path.read_text().splitlines()[0].split(",")
    assert "breakdown_ms.total" in header and "ring_mib" in header
    trace = json.loads(trace_path.read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert {"host", "consumer0", "transfer0", "h2d0", "d2h0"} <= names
    assert any(e["ph"] == "X" and e["name"].startswith("delivery") for e in trace["traceEvents"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--depth", "15"], "depth 15 out of range; allowed: 0..14"),
        (["--depth", "-1"], "depth -1 out of range"),
        (["--budget", "-1"], "budget -1 MiB out of range"),
        (["--budget", "70000"], "budget 70000 MiB out of range"),
        (["--context", "0"], "context 0 out of range"),
        (["--context", "abc"], "--context 'abc' is not valid"),
        (["--model", "nope"], "unknown model 'nope'"),
        (["--hardware", "nope"], "unknown hardware 'nope'"),
        (["--cache-type", "q9"], "unknown cache type 'q9'"),
        (["--model", "/nonexistent/m.gguf"], "cannot read GGUF file"),
        (["--mutate", "nope"], "unknown mutation 'nope'"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle, capsys, tmp_path):  # type: ignore[no-untyped-def]
    out_csv = tmp_path / "x.csv"
    assert main(["simulate", *args, "--csv", str(out_csv)]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out_csv.exists()  # nothing half-written


def test_unreadable_files_are_one_line_errors(tmp_path, capsys):  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    assert main(["simulate", "--model", str(bad)]) == 2
    assert main(["simulate", "--hardware", str(tmp_path / "missing.json")]) == 2
    errs = capsys.readouterr().err.strip().splitlines()
    assert len(errs) == 2 and "GGUF" in errs[0] and "cannot read hardware profile" in errs[1]


def test_console_script_exit_code_without_traceback():  # type: ignore[no-untyped-def]
    r = subprocess.run([sys.executable, "-m", "kvpipe.cli", "simulate", "--depth", "99"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_bench_reports_positive_rates(capsys):  # type: ignore[no-untyped-def]
    assert main(["bench", "--tokens", "2", "--repeats", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["machine_events_per_s"] > 0 and r["bare_simpy_events_per_s"] > 0 and r["machine_events"] > 100


def test_llama_cpp_flag_names_are_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    # -ctk is llama.cpp's K cache type (it no longer parses as -c tk), -d llama-bench's depth, -nkvo 0 the cache on the device
    assert main(["simulate", "-m", "llama-3.1-8b", "-ctk", "q4_0", "-ctv", "f16", "-d", "4096..8192/4096", "-nkvo", "0,1",
                 "--depth", "0,1", "--hardware", "h200-gen5x16", "--tokens", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["cache_type"], r["cache_type_v"]) for r in rows} == {("q4_0", "f16")}
    assert sorted((r["context"], r["arm"], r["depth"]) for r in rows) == [
        (4096, "resident", 0), (4096, "transport", 0), (4096, "transport", 1),
        (8192, "resident", 0), (8192, "transport", 0), (8192, "transport", 1)]
    resident = next(r for r in rows if r["arm"] == "resident" and r["context"] == 4096)
    assert resident["ordered_mib"] < 1 and resident["early_mib"] == 0  # the one-time load is not a token's cost
    assert resident["tokens"] == 2
    from kvpipe.cli import build_parser
    from kvpipe.commands.args import points_from_args  # a sweep's rows leave the load out too (shared: run_point)
    from kvpipe.sweep import run_chunk

    ns = build_parser().parse_args(["sweep", "-d", "4096", "-nkvo", "0", "--tokens", "2"])
    (row,) = run_chunk(points_from_args(ns))
    assert isinstance(row, dict) and row["arm"] == "resident" and row["ordered_mib"] < 1 and row["tokens"] == 2
    assert main(["bench", "-m", "llama-3.1-8b", "-d", "4096", "-kvpd", "2", "--tokens", "2", "--repeats", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["machine_events"] > 0
    assert main(["simulate", "-nkvo", "2"]) == 2
    assert "--no-kv-offload '2'" in capsys.readouterr().err


def test_a_point_that_does_not_fit_is_a_row_that_says_so_and_the_grid_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--context", "4096,16777216", "--depth", "0", "--tokens", "1", "--json"]) == 0
    small, huge = json.loads(capsys.readouterr().out)
    assert small["tokens_per_s"] > 0 and small.get("fits", True)
    assert huge["fits"] is False and huge["tokens_per_s"] == 0.0
    assert "MiB free" in huge["fit_reason"] and "need 34,832.5 MiB" in huge["fit_reason"]


def test_weights_that_do_not_fit_the_card_are_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "-m", "llama-3.1-70b", "--context", "4096", "--depth", "0", "--tokens", "1"]) == 0
    assert "weights 39.6 GiB do not fit the devices' 11.6 GiB" in capsys.readouterr().out
    assert main(["simulate", "--split-mode", "layer", "--hardware", "rtx4070-gen4x16+rtx3060-gen3x4", "-ts", "nan,1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nan" in err


def test_a_bug_is_one_line_and_exit_1_with_its_traceback_behind_debug(capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import kvpipe.commands.simulate as cmd

    def broken(*_a, **_k):  # type: ignore[no-untyped-def]
        raise RuntimeError("a bug")

    monkeypatch.setattr(cmd, "run_points", broken)
    assert main(["simulate", "--context", "4096", "--depth", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: RuntimeError: a bug" in err and "--debug" in err
    with pytest.raises(RuntimeError, match="a bug"):
        main(["simulate", "--context", "4096", "--depth", "0", "--debug"])


def test_a_closed_pipe_stops_quietly() -> None:
    """``kvpipe simulate --json | head -1``: the reader closes the pipe early (the output, 48 rows, is larger than a
    pipe holds, so the write meets the closed pipe); no traceback and no 'internal error' line."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "kvpipe.cli", "simulate", "--context", "1024..49152/1024", "--depth", "0",
                             "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # as head does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (0, 141)
    assert "internal error" not in err and "Traceback" not in err


# ---------------------------------------------------------------- issue 29 part C: terminal friction


@pytest.mark.parametrize("argv", [["simulate", "--tok", "2"], ["simulate", "-t", "8"], ["simulate", "--cont", "4096"],
                                  ["sweep", "--out-d", "x"], ["plan", "--max-d", "2"], ["bench", "--rep", "1"]])
def test_a_flag_is_taken_only_as_written(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert main(argv) == 2  # -t 8 (llama.cpp's threads) was the tensor split 8; --tok was --tokens
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments" in err, err


def test_a_one_letter_flag_still_takes_a_glued_value() -> None:
    from kvpipe.cli import build_parser

    assert build_parser().parse_args(["simulate", "-c8192"]).ctx_size == 8192


def test_a_bare_nkvo_means_1_as_in_llama_cpp(capsys: pytest.CaptureFixture[str]) -> None:
    from kvpipe.cli import build_parser

    assert build_parser().parse_args(["simulate", "-nkvo", "--depth", "0"]).nkvo == "1"
    assert build_parser().parse_args(["simulate", "-nkvo", "0"]).nkvo == "0"
    assert main(["simulate", "-nkvo", "--context", "2048", "--depth", "0", "--tokens", "1", "--json"]) == 0
    assert [r["arm"] for r in json.loads(capsys.readouterr().out)] == ["transport"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from kvpipe.cli import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"kvpipe {version()}" and version() != "unknown"


def test_every_bench_option_has_help() -> None:
    from kvpipe.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    bench = sub.choices["bench"]  # type: ignore[attr-defined]
    assert all(a.help for a in bench._actions if a.dest != "help"), [a.dest for a in bench._actions if not a.help]


def test_the_driver_version_is_printed_as_nvidia_smi_does() -> None:
    from pathlib import Path

    from validate.report_md import driver_text, markdown

    assert (driver_text(13000), driver_text(12040), driver_text("575.57"), driver_text(None)) == ("13.0", "12.4", "575.57", None)
    rep = json.loads((Path(__file__).resolve().parents[2] / "validate/results/h200/run13/report/report.json").read_text())
    text = markdown(rep["points"], rep["summary"], rep["exactness"], {**rep, "driver_version": 13000})
    assert "driver 13.0;" in text
