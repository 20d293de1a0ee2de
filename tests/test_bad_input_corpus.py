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
