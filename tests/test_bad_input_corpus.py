"""The bad-input corpus: every command, every grid flag, profile and model files, output paths.

Each case runs ``kvpipe`` in-process and asserts exit code 2, exactly one line on stderr that names the bad
value (or its flag) and no traceback, and that nothing was written outside the case's own folder. The fuzzers
feed generated profile and Hugging Face config JSON to the loaders: they either load or raise ValueError.
docs/reliability.md counts the cases by kind.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.profile import PRESET_DIR, load_profile
from kvpipe.cli import main
from sim.workload import load_model

BAD_FLAGS = {
    "--context": ["0", "-1", "abc", "1..0", "", "99999999999", "4096:abc", "1.5"],
    "--depth": ["15", "-1", "x", "0..99"],
    "--budget": ["-1", "70000", "abc"],
    "--cache-type": ["q9", ""],
    "--model": ["nope", "/nonexistent.gguf", "/nonexistent/config.json"],
    "--hardware": ["nope", "/nonexistent.json"],
    "--parallel": ["0", "300", "x"],
    "--tokens": ["0", "-3", "x"],
    "--split-mode": ["bogus"],
    "--mutate": ["bogus"],
    "-nkvo": ["2", "yes"],
    "--ctx-size": ["-5", "x"],
    "--kv-gpu-layers": ["-1", "x", "1.5", "65"],
    "-ngl": ["0", "-1", "x"],
}
COMMANDS = {
    "simulate": [],
    "sweep": ["--jobs", "1", "--quiet", "--out", "{tmp}/out"],
    "plot": ["gain-vs-depth", "--out", "{tmp}/plot"],
    "validate": ["--machine", "simpy", "--out", "{tmp}/report"],
}
FLAG_CASES = [(cmd, flag, v) for cmd in COMMANDS for flag, vals in BAD_FLAGS.items() for v in vals]
OTHER_CASES = [
    ("plan", ["--context", "0"]), ("plan", ["--max-depth", "0"]), ("plan", ["--max-depth", "15"]),
    ("plan", ["--default-budget", "-1"]), ("plan", ["--budget-for-gain", "2"]), ("plan", ["--model", "a,b"]),
    ("plan", ["--tokens", "0"]), ("plan", ["--jobs", "-1"]), ("bench", ["--repeats", "0"]), ("bench", ["--model", "nope"]),
    ("bench", ["--depth", "99"]), ("bench", ["--context", "x"]), ("simulate", ["--split-mode", "layer"]),
    ("simulate", ["--split-mode", "tensor", "--hardware", "rtx4070-gen4x16+rtx3060-gen3x4", "-ts", "nan,1"]),
    ("simulate", ["--split-mode", "layer", "--hardware", "rtx4070-gen4x16+rtx3060-gen3x4", "-ts", "-1,1"]),
    ("simulate", ["--functional", "--cache-type", "q5_0"]), ("plot", ["nope-kind"]), ("nope-command", []),
    ("simulate", ["--functional", "-ngl", "40"]), ("simulate", ["--kv-gpu-layers", "4", "-ngl", "40"]),
    ("simulate", ["--kv-gpu-layers", "2", "--split-mode", "tensor", "--hardware", "rtx4070-gen4x16+rtx3060-gen3x4"]),
    ("validate", ["--machine", "simpy", "--hardware", "h200-gen5x16", "-ngl", "20", "--out", "{tmp}/report"]),
    ("simulate", ["--no-such-flag"]), ("sweep", ["--jobs", "-3", "--out", "{tmp}/out"]),
    ("calibrate", ["--reps", "0"]), ("calibrate", ["--scale", "2"]), ("calibrate", ["--windows", "0"]),
    ("calibrate", ["--machine", "nope"]), ("calibrate", ["--model", "nope"]), ("calibrate", ["--cache-type", "q9"]),
    ("calibrate", ["--machine", "simpy", "--hardware", "h200-gen5x16", "--windows", "4000000", "--out", "{tmp}/c.json"]),
]


def _run(capsys: pytest.CaptureFixture[str], tmp: Path, argv: list[str]) -> str:
    before = sorted(os.listdir(tmp))
    code = main([a.replace("{tmp}", str(tmp)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert sorted(os.listdir(tmp)) == before  # nothing half-written next to the targets
    return err


@pytest.mark.parametrize("cmd,flag,value", FLAG_CASES, ids=[f"{c}{f}={v!r}" for c, f, v in FLAG_CASES])
def test_a_bad_grid_value_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, cmd: str, flag: str,
                                                 value: str) -> None:
    extra = ["--hardware", "h200-gen5x16"] if cmd == "validate" and flag != "--hardware" else []
    err = _run(capsys, tmp_path, [cmd, *COMMANDS[cmd], *extra, flag, value])
    assert (value and value in err) or flag.lstrip("-") in err or "allowed" in err, err


@pytest.mark.parametrize("cmd,argv", OTHER_CASES, ids=[f"{c}:{' '.join(a)}" for c, a in OTHER_CASES])
def test_other_bad_invocations_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, cmd: str,
                                                        argv: list[str]) -> None:
    _run(capsys, tmp_path, [cmd, *argv])


BASE = json.loads((PRESET_DIR / "h200-gen5x16.json").read_text())
PROFILE_EDITS = [("host", "launch_us", v) for v in (-1, "x", None, [1])] + [
    ("devices", "memory_total_mib", v) for v in (0, -5, "x", None)] + [
    ("host", "copy_issue_us", 1e400), ("devices", "h2d_engines", 0), ("devices", "duplex_slowdown", 0.5),
    ("devices", "alignment_bytes", 3), ("devices", "dram_GBps", -1)]


@pytest.mark.parametrize("section,key,value", PROFILE_EDITS, ids=[f"{s}.{k}={v!r}" for s, k, v in PROFILE_EDITS])
def test_a_bad_profile_field_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, section: str, key: str,
                                         value: object) -> None:
    d = json.loads(json.dumps(BASE))
    (d["host"] if section == "host" else d["devices"][0])[key] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    err = _run(capsys, tmp_path, ["simulate", "--hardware", str(path), "--context", "4096", "--depth", "0", "--tokens", "1"])
    assert "p.json" in err


HF_OK = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "intermediate_size": 512}
HF_EDITS = [(k, v) for k in HF_OK for v in (True, 2.5, 0, -4, "x", None, 10**9)]


@pytest.mark.parametrize("key,value", HF_EDITS, ids=[f"{k}={v!r}" for k, v in HF_EDITS])
def test_a_bad_hf_config_field_is_one_line_naming_the_key(capsys: pytest.CaptureFixture[str], tmp_path: Path, key: str,
                                                          value: object) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF_OK, key: value}))
    err = _run(capsys, tmp_path, ["simulate", "--model", str(path), "--context", "512", "--depth", "0", "--tokens", "1"])
    assert key in err


def _gguf(path: Path, drop: str = "", tensors: bool = True) -> Path:
    gguf = pytest.importorskip("gguf", reason="the gguf package is a declared dependency")
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    for key, add, v in (("block_count", w.add_block_count, 4), ("head_count", w.add_head_count, 8),
                        ("head_count_kv", w.add_head_count_kv, 2), ("embedding_length", w.add_embedding_length, 256),
                        ("feed_forward_length", w.add_feed_forward_length, 512)):
        if key != drop:
            add(v)
    if tensors:
        w.add_tensor("blk.0.ffn_up.weight", np.zeros((512, 256), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


GGUF_CASES = ["truncated", "empty", "garbage", "no-block_count", "no-embedding_length", "no-tensors"]


@pytest.mark.parametrize("case", GGUF_CASES)
def test_a_bad_gguf_is_one_line_naming_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str) -> None:
    path = tmp_path / "model.gguf"
    if case == "truncated":
        full = _gguf(tmp_path / "full.gguf").read_bytes()
        path.write_bytes(full[: len(full) // 3])
    elif case == "empty":
        path.write_bytes(b"")
    elif case == "garbage":
        path.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    else:
        _gguf(path, drop=case[3:] if case.startswith("no-") and case != "no-tensors" else "", tensors=case != "no-tensors")
    err = _run(capsys, tmp_path, ["simulate", "--model", str(path), "--context", "512", "--depth", "0", "--tokens", "1"])
    assert "model.gguf" in err


@pytest.mark.parametrize("target", ["folder", "under-a-file"])
def test_an_output_that_cannot_be_written_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, target: str) -> None:
    (tmp_path / "file").write_text("x")
    out = str(tmp_path) if target == "folder" else str(tmp_path / "file" / "rows.csv")
    _run(capsys, tmp_path, ["simulate", "--context", "4096", "--depth", "0", "--tokens", "1", "--csv", out])


JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=True) | st.text(max_size=5),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                       max_leaves=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["launch_us", "copy_issue_us", "event_us", "host_wait_us"]), section=st.sampled_from(["host", "dev"]),
       value=JSONISH)
def test_fuzzed_profile_fields_load_or_raise_value_error(tmp_path: Path, key: str, section: str, value: object) -> None:
    d = json.loads(json.dumps(BASE))
    (d["host"] if section == "host" else d["devices"][0])[key if section == "host" else "memory_total_mib"] = value
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(d, allow_nan=True))
    try:
        load_profile(str(path))
    except ValueError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(HF_OK) + ["num_key_value_heads", "head_dim", "vocab_size", "layer_types"]), value=JSONISH)
def test_fuzzed_hf_configs_load_or_raise_value_error(tmp_path: Path, key: str, value: object) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF_OK, key: value}, allow_nan=True))
    try:
        m = load_model(str(path))
    except ValueError as exc:
        assert "\n" not in str(exc)
    else:
        assert m.n_layers >= 1 and all(math.isfinite(x) for x in (m.hidden, m.ffn, m.vocab))


# ---------------------------------------------------------------- issue 29: internal errors that were bad input

GRID_CASES = [
    ("simulate", ["--context", "1..inf"]), ("simulate", ["--context", "0..1e308/1e-308"]), ("simulate", ["--budget", "0..inf"]),
    ("sweep", ["--context", "1..inf", "--out", "{tmp}/out"]), ("plot", ["gain-vs-depth", "--budget", "0..inf", "--out", "{tmp}/p"]),
    ("simulate", ["--split-mode", "tensor", "--hardware", "rtx4070-gen4x16+rtx3060-gen3x4", "-ts", "1e308,1e308"]),
    ("sweep", ["--jobs", "100000", "--out", "{tmp}/out"]), ("plot", ["gain-vs-depth", "--jobs", "100000", "--out", "{tmp}/p"]),
    ("simulate", ["--context", "1..100000", "--depth", "0..14", "--budget", "1..1000"]),
    ("sweep", ["--context", "1..100000", "--depth", "0..14", "--budget", "1..1000", "--out", "{tmp}/out"]),
]


@pytest.mark.parametrize("cmd,argv", GRID_CASES, ids=[f"{c}:{' '.join(a)}" for c, a in GRID_CASES])
def test_absurd_ranges_jobs_and_grids_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, cmd: str,
                                                   argv: list[str]) -> None:
    err = _run(capsys, tmp_path, [cmd, *argv])
    assert "allowed" in err or "must be" in err, err


def test_a_huge_grid_is_counted_before_it_is_built_in_a_study_dry_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    study = tmp_path / "study.toml"
    study.write_text('contexts = "1..100000"\ndepths = "0..14"\nbudgets_mib = "1..1000"\n[simulate]\n')
    err = _run(capsys, tmp_path, ["run", str(study), "--dry-run"])
    assert "1,500,000,000 points" in err and "10,000,000" in err


def _raw_gguf(path: Path, kv: dict[str, object], tokens: list[str] | None = None, tensors: bool = True) -> Path:
    gguf = pytest.importorskip("gguf", reason="the gguf package is a declared dependency")
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(4)
    w.add_head_count(8)
    w.add_embedding_length(256)
    w.add_feed_forward_length(512)
    for key, value in kv.items():
        if isinstance(value, list):
            w.add_array(f"llama.{key}", value)
        elif key == "vocab_size":
            w.add_uint64(f"llama.{key}", int(value))  # type: ignore[call-overload]
        else:
            w.add_uint32(f"llama.{key}", int(value))  # type: ignore[call-overload]
    if tokens:
        w.add_token_list(tokens)
    if tensors:
        w.add_tensor("blk.0.ffn_up.weight", np.zeros((512, 256), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


HOSTILE_GGUF = ["array-2^60", "negative-kv-head", "head-dim-31-q8_0", "vocab-2^63", "kv-array-wrong-length"]


@pytest.mark.parametrize("case", HOSTILE_GGUF)
def test_a_hostile_gguf_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str) -> None:
    import struct

    path = tmp_path / "model.gguf"
    if case == "array-2^60":
        _raw_gguf(path, {"attention.head_count_kv": 2}, tokens=["a", "b", "c"])
        raw = bytearray(path.read_bytes())
        at = raw.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens")
        assert struct.unpack_from("<IIQ", raw, at) == (9, 8, 3)  # an array of 3 strings
        struct.pack_into("<Q", raw, at + 8, 2**60)
        path.write_bytes(bytes(raw))
    elif case == "negative-kv-head":
        _raw_gguf(path, {"attention.head_count_kv": [2, -3, 2, 2]})
    elif case == "kv-array-wrong-length":
        _raw_gguf(path, {"attention.head_count_kv": [2] * 9})
    elif case == "head-dim-31-q8_0":
        _raw_gguf(path, {"attention.head_count_kv": 2, "attention.key_length": 31, "attention.value_length": 31})
    else:
        _raw_gguf(path, {"attention.head_count_kv": 2, "vocab_size": 2**63})
    err = _run(capsys, tmp_path, ["simulate", "--model", str(path), "--context", "512", "--depth", "0", "--tokens", "1"])
    assert "model" in err and ("allowed" in err or "llama.cpp" in err), err
    assert "model.gguf" in err, err  # the file named, the head-dim case too (through the shape's source)


HF_HOSTILE = [("full_attention_interval", v) for v in ("0", "null", "NaN", "1e999", "2.5", '"x"')] + [
    ("num_attention_heads", "1e999"), ("hidden_size", "1e999"), ("num_key_value_heads", "-1")]


@pytest.mark.parametrize("key,text", HF_HOSTILE, ids=[f"{k}={v}" for k, v in HF_HOSTILE])
def test_a_hostile_hf_config_value_is_one_line_naming_the_key(capsys: pytest.CaptureFixture[str], tmp_path: Path, key: str,
                                                              text: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_OK)[:-1] + f', "{key}": {text}}}')
    err = _run(capsys, tmp_path, ["simulate", "--model", str(path), "--context", "512", "--depth", "0", "--tokens", "1"])
    assert key in err or "NaN" in err, err


PRESET_MODEL = json.loads((Path(__file__).resolve().parents[1] / "sim" / "presets" / "llama-3.1-8b.json").read_text())
MODEL_JSON_EDITS = [("n_head", 0), ("n_head", "1e999"), ("n_layers", "1e999"), ("full_attention_interval", 0),
                    ("attn_layers", [0, 99]), ("attn_layers", "all"), ("small_inputs_bytes", "x"), ("weight_gib", "1e999")]


@pytest.mark.parametrize("key,value", MODEL_JSON_EDITS, ids=[f"{k}={v!r}" for k, v in MODEL_JSON_EDITS])
def test_a_hostile_model_json_value_is_one_line_naming_the_key(capsys: pytest.CaptureFixture[str], tmp_path: Path, key: str,
                                                               value: object) -> None:
    path = tmp_path / "shape.json"
    text = json.dumps({**PRESET_MODEL, key: value})
    path.write_text(text.replace('"1e999"', "1e999"))
    err = _run(capsys, tmp_path, ["simulate", "--model", str(path), "--context", "512", "--depth", "0", "--tokens", "1"])
    assert key in err and "shape.json" in err, err


def _deep(kind: str) -> str:
    return "[" * 100_000 + "]" * 100_000 if kind == "list" else '{"a":' * 100_000 + "1" + "}" * 100_000


FILE_HOSTILE = ["deep-list", "deep-object", "dev-zero", "shallow-but-past-64"]


def _hostile_file(path: Path, case: str) -> None:
    if case == "dev-zero":
        path.symlink_to("/dev/zero")
    elif case == "shallow-but-past-64":
        path.write_text("[" * 65 + "]" * 65)
    else:
        path.write_text(_deep(case.removeprefix("deep-")))


@pytest.mark.parametrize("case", FILE_HOSTILE)
@pytest.mark.parametrize("what", ["model", "hardware"])
def test_a_hostile_model_or_profile_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, what: str,
                                                     case: str) -> None:
    path = tmp_path / ("config.json" if what == "model" else "profile.json")
    _hostile_file(path, case)
    err = _run(capsys, tmp_path, ["simulate", f"--{what}", str(path), "--context", "512", "--depth", "0", "--tokens", "1"])
    assert path.name in err and ("nests deeper" in err or "larger than" in err), err


def test_a_multimodal_config_is_read_from_its_text_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["SomeVLM"], "vision_config": {"hidden_size": 1}, "text_config": HF_OK}))
    m = load_model(str(path))
    assert (m.n_layers, m.hidden, m.n_head, m.ffn) == (4, 256, 8, 512)


PROFILE_HOSTILE = [("devices", k, "1e999") for k in ("h2d_engines", "d2h_engines", "alignment_bytes", "duplex_slowdown")] + [
    ("top", "workloads", "[1, 2]"), ("top", "workloads", '{"llama-3.1-8b@q8_0": "fast"}'),
    ("top", "workloads", '{"llama-3.1-8b@q8_0": {"compute": "x"}}'),
    ("top", "workloads", '{"llama-3.1-8b@q8_0": {"compute": {}, "launch_us": "x"}}'),
    ("top", "workloads", '{"llama-3.1-8b@q8_0": {"compute": {"layer_us": 1e999}}}'), ("top", "devices", '"x"')]


@pytest.mark.parametrize("section,key,text", PROFILE_HOSTILE, ids=[f"{s}.{k}={v}" for s, k, v in PROFILE_HOSTILE])
def test_a_hostile_profile_value_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, section: str, key: str,
                                             text: str) -> None:
    d = json.loads(json.dumps(BASE))
    (d if section == "top" else d["devices"][0])[key] = "@@"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d).replace('"@@"', text))
    err = _run(capsys, tmp_path, ["simulate", "--hardware", str(path), "-m", "llama-3.1-8b", "--context", "4096", "--depth", "0",
                                  "--tokens", "1"])
    assert "p.json" in err, err


BENCH = Path(__file__).resolve().parent / "validate" / "fixtures" / "reference-ordered.llama-bench.json"
BENCH_EDITS = [("n_depth", 2**40), ("n_gen", 2**40), ("n_gen", 1.5), ("n_prompt", -1), ("n_depth", "deep")]


@pytest.mark.parametrize("key,value", BENCH_EDITS, ids=[f"{k}={v!r}" for k, v in BENCH_EDITS])
def test_a_hostile_llama_bench_value_is_one_line_naming_the_key(capsys: pytest.CaptureFixture[str], tmp_path: Path, key: str,
                                                                value: object) -> None:
    records = json.loads(BENCH.read_text())
    records[0][key] = value
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(records))
    err = _run(capsys, tmp_path, ["calibrate", "--from-llama-bench", str(src), "-m", "qwen3.8-27b", "--out", f"{tmp_path}/c.json"])
    assert key in err and "bench.json" in err, err


@pytest.mark.parametrize("case", ["deep-list", "dev-zero"])
def test_a_hostile_llama_bench_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str) -> None:
    src = tmp_path / "bench.json"
    _hostile_file(src, case)
    err = _run(capsys, tmp_path, ["calibrate", "--from-llama-bench", str(src), "-m", "qwen3.8-27b", "--out", f"{tmp_path}/c.json"])
    assert "bench.json" in err, err


def _bomb(path: Path, inflated_mib: int) -> Path:
    import gzip

    with gzip.open(path, "wb", compresslevel=1) as f:
        chunk = b" " * (1 << 20)
        f.write(b"[")
        for _ in range(inflated_mib):
            f.write(chunk)
        f.write(b"]")
    return path


@pytest.fixture(scope="module")
def sample_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Rows and a trace of a small grid, made once."""
    import contextlib
    import io

    folder = tmp_path_factory.mktemp("samples")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["simulate", "--context", "2048,4096", "--depth", "0,1", "--tokens", "1", "--json",
                     "--trace", str(folder / "trace.json")]) == 0
    return {"rows": json.loads(out.getvalue()), "trace": json.loads((folder / "trace.json").read_text())}


READ_BACK = ["row-number-as-text", "row-context-as-text", "trace-without-pid", "trace-ts-as-text", "report-empty-summary",
             "report-points-not-objects", "gzip-bomb", "dev-zero", "deep-list"]


READ_BACK_CASES = [("report", c) for c in READ_BACK] + [("plot", c) for c in READ_BACK if not c.startswith(("trace", "report"))]


@pytest.mark.parametrize("cmd,case", READ_BACK_CASES, ids=[f"{c}:{k}" for c, k in READ_BACK_CASES])
def test_report_and_plot_on_hostile_outputs_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                         sample_outputs: dict[str, Any], cmd: str, case: str) -> None:
    src = tmp_path / ("in.json.gz" if case == "gzip-bomb" else "in.json")
    rows = json.loads(json.dumps(sample_outputs["rows"]))
    trace = json.loads(json.dumps(sample_outputs["trace"]))
    if case == "row-number-as-text":
        rows[1]["tokens_per_s"] = "fast"
        src.write_text(json.dumps(rows))
    elif case == "row-context-as-text":
        rows[0]["context"] = "4k"
        src.write_text(json.dumps(rows))
    elif case == "trace-without-pid":
        trace["traceEvents"][0].pop("pid")
        src.write_text(json.dumps(trace))
    elif case == "trace-ts-as-text":
        next(e for e in trace["traceEvents"] if e["ph"] == "X")["ts"] = "soon"
        src.write_text(json.dumps(trace))
    elif case == "report-empty-summary":
        src.write_text(json.dumps({"points": [], "summary": {}, "exactness": {}}))
    elif case == "report-points-not-objects":
        src.write_text(json.dumps({"points": [{"x": 1}], "summary": {"points": 1, "median_abs_error": 0.1, "max_abs_error": 0.2},
                                   "exactness": {}}))
    elif case == "gzip-bomb":
        _bomb(src, 520)
    else:
        _hostile_file(src, case)
    argv = ["report", str(src), "--out", f"{tmp_path}/r.html"] if cmd == "report" else [
        "plot", "gain-vs-depth", "--rows", str(src), "--out", f"{tmp_path}/p"]
    err = _run(capsys, tmp_path, argv)
    assert "in.json" in err, err


def test_a_path_with_a_newline_is_named_on_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = _run(capsys, tmp_path, ["simulate", "--hardware", f"{tmp_path}/x\ny.json", "--context", "4096", "--depth", "0"])
    assert "x\\ny.json" in err
    study = tmp_path / "a\nb.toml"
    study.write_text("[simulate]\nbogus = 1\n")
    err = _run(capsys, tmp_path, ["run", str(study)])
    assert "a\\nb.toml" in err and "bogus" in err
