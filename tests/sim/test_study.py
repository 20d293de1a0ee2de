"""kvpipe run STUDY.toml: the same rows as the equivalent flags, paths from the study's folder, one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from backends.profile import PRESET_DIR
from kvpipe import study
from kvpipe.cli import main
from sim.evaluator import row_disagreement
from sim.model_files import PRESET_DIR as MODEL_PRESET_DIR
from tests.sim.test_sweep import _simulate_json
from tests.test_bad_input_corpus import _run

ROOT = Path(__file__).resolve().parents[2]
# The example study's grid, spelled as llama.cpp users spell the flags.
EXAMPLE_FLAGS = ["-m", "qwen3.8-27b", "--hardware", "rtx4070-gen4x16", "-ctk", "q8_0", "-d", "4096,16384", "-kvpd", "0,1",
                 "-kvpb", "128", "-np", "1", "-nkvo", "1", "--tokens", "2"]
OUTPUTS = """
[plan]
out = "out/plan.txt"
[simulate]
out = "out/rows.json"
format = "json"
[sweep]
jobs = 1
quiet = true
[plot]
kinds = ["gain-vs-depth"]
format = "svg"
"""


def _study(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "study.toml"
    path.write_text(text)
    return path


def test_print_example_is_the_committed_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--print-example"]) == 0
    assert capsys.readouterr().out == (ROOT / "docs/examples/study.toml").read_text() == study.EXAMPLE


def test_the_example_study_gives_the_rows_of_the_equivalent_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = _study(tmp_path / "study", study.EXAMPLE)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["run", str(path)]) == 0
    capsys.readouterr()
    out = tmp_path / "study/out"
    expected = _simulate_json(capsys, EXAMPLE_FLAGS)
    assert len(expected) == 4
    assert json.loads((out / "rows.json").read_text()) == expected
    swept = json.loads((out / "sweep/rows.json").read_text())  # the evaluator's rows (engine), within 1e-9 of simulate's
    assert {r["engine"] for r in swept} == {"evaluator"} and max(map(row_disagreement, swept, expected)) <= 1e-9
    assert main(["plan", "-d", "4096,16384", "--max-depth", "2", "--tokens", "2", "--jobs", "1"]) == 0
    assert (out / "plan.txt").read_text() == capsys.readouterr().out
    assert (out / "plots/gain-vs-depth.svg").read_text().lstrip().startswith("<?xml")
    assert list(elsewhere.iterdir()) == []  # outputs land beside the study, not in the working directory


def test_dry_run_prints_the_equivalent_commands_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _study(tmp_path, study.EXAMPLE)
    assert main(["run", str(path), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["plan", "simulate", "sweep", "plot"]
    assert lines[1].endswith(f"--tokens=2 --json > {tmp_path / 'out/rows.json'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.toml"]


def test_relative_model_and_profile_files_are_taken_from_the_study_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cards").mkdir()
    (tmp_path / "models").mkdir()
    shutil.copy(PRESET_DIR / "rtx4070-gen4x16.json", tmp_path / "cards/card.json")
    shutil.copy(MODEL_PRESET_DIR / "qwen3.8-27b.json", tmp_path / "models/qwen.json")
    path = _study(tmp_path, 'models = ["models/qwen.json"]\nhardware = "cards/card.json"\ncontexts = [4096]\ndepths = [0, 1]\n'
                            'tokens = 2\n[simulate]\nout = "rows.json"\nformat = "json"\n')
    monkeypatch.chdir(tmp_path / "cards")  # a cwd where "cards/card.json" does not exist
    assert main(["run", str(path)]) == 0
    got = json.loads((tmp_path / "rows.json").read_text())
    want = _simulate_json(capsys, ["--context", "4096", "--depth", "0,1", "--tokens", "2"])
    assert [r["tokens_per_s"] for r in got] == [r["tokens_per_s"] for r in want]


def test_translation_lists_ranges_switches_presets_files_and_overrides() -> None:
    base = Path("/s")
    tasks = study.tasks({"models": ["qwen3.8-27b", "m.gguf"], "hardware": "card.json+rtx3060-gen3x4", "contexts": "1024..4096/1024",
                         "depths": [0, 2], "pageable": False, "plan": {"contexts": [8192]},
                         "simulate": {"csv": "r.csv", "pageable": True},
                         "plot": {"kinds": ["gain-vs-depth", "timeline"]}}, base)
    plan, sim, *plots = tasks
    assert plan == study.Task("plan", ("plan", "--model=qwen3.8-27b,/s/m.gguf", "--hardware=/s/card.json+rtx3060-gen3x4",
                                       "--context=8192"))  # no --depth: plan searches its own; table key wins
    assert sim.argv[1:] == ("--model=qwen3.8-27b,/s/m.gguf", "--hardware=/s/card.json+rtx3060-gen3x4", "--context=1024..4096/1024",
                            "--depth=0,2", "--pageable", "--csv=/s/r.csv")
    assert [p.argv[:2] + p.argv[-1:] for p in plots] == [("plot", "gain-vs-depth", "--out=/s/out/plots/gain-vs-depth"),
                                                         ("plot", "timeline", "--out=/s/out/plots/timeline")]


@pytest.mark.parametrize(("text", "needle"), [
    ("contxts = [1]\n" + OUTPUTS, "study.toml: unknown key 'contxts'; allowed: version, models, hardware"),
    ("[plan]\ndepths = [1]\n", "unknown key 'depths' in [plan]; allowed: out, format, max_depth"),
    ("contexts = [4096, x]\n" + OUTPUTS, "study.toml:1: Invalid value"),
    ("[simulate]\nout = 'r.json'\n[simulate]\n", "study.toml:3: Cannot declare"),
    ("pageable = 'yes'\n" + OUTPUTS, "pageable = 'yes': expected true or false"),
    ("[simulate]\nout = 'r.json'\nformat = 'xml'\n", "simulate.format = 'xml' is not valid; allowed: 'json', 'table'"),
    ("contexts = [[4096]]\n" + OUTPUTS, "contexts: expected a value or a flat list"),
    ("version = 2\n" + OUTPUTS, "version 2 is not supported; allowed: 1"),
    ("contexts = [4096]\n", "the study runs nothing"),
    ("simulate = 1\n", "simulate must be a table"),
    ("[plot]\nkinds = ['nope']\n", "study.toml [plot]: unknown plot kind 'nope'"),
])
def test_a_bad_study_is_one_line_exit_2_and_writes_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str,
                                                           needle: str) -> None:
    path = _study(tmp_path, text)
    assert needle in _run(capsys, tmp_path, ["run", str(path)])


# (study text, the same value as flags): the study's line is the flag's line, said of the study and table.
SAME_AS_FLAG = [
    ("contexts = [0]\n" + OUTPUTS, "simulate", ["--context", "0"]),
    ("depths = '0..99'\n" + OUTPUTS, "simulate", ["--depth", "0..99"]),
    ("tokens = 'x'\n" + OUTPUTS, "plan", ["--tokens", "x"]),
    ("models = ['nope']\n" + OUTPUTS, "simulate", ["--model", "nope"]),
    ("models = ['missing.gguf']\n" + OUTPUTS, "simulate", ["--model", "{tmp}/missing.gguf"]),
    ("cache_types_k = 'q9'\n" + OUTPUTS, "simulate", ["-ctk", "q9"]),
    ("nkvo = [2]\n" + OUTPUTS, "simulate", ["-nkvo", "2"]),
    ("budgets_mib = [70000]\n[sweep]\n", "sweep", ["--budget", "70000", "--out", "{tmp}/out"]),
    ("[plan]\nmax_depth = 15\n", "plan", ["--max-depth", "15"]),
    ("models = ['a', 'b']\n[plan]\n", "plan", ["--model", "a,b"]),
    ("[sweep]\njobs = -3\n", "sweep", ["--jobs", "-3", "--out", "{tmp}/out"]),
]


@pytest.mark.parametrize(("text", "command", "flags"), SAME_AS_FLAG, ids=[f"{c}:{' '.join(f)}" for _, c, f in SAME_AS_FLAG])
def test_a_bad_value_gets_the_flags_own_message(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, command: str,
                                                flags: list[str]) -> None:
    path = _study(tmp_path / "study", text)
    (tmp_path / "flags").mkdir()
    flag_line = _run(capsys, tmp_path / "flags", [command, *(f.replace("{tmp}", str(tmp_path / "study")) for f in flags)])
    study_line = _run(capsys, tmp_path / "study", ["run", str(path)])
    assert study_line == flag_line.replace("kvpipe: error: ", f"kvpipe: error: {path} [{command}]: ", 1)


def test_a_missing_study_or_none_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert "cannot read study" in _run(capsys, tmp_path, ["run", str(tmp_path / "missing.toml")])
    assert "cannot read study" in _run(capsys, tmp_path, ["run", str(tmp_path)])
    assert "run needs a study file" in _run(capsys, tmp_path, ["run"])
