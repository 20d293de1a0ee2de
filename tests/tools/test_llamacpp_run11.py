"""Run 11 of issue 28 (tools/llamacpp/README-run11.md): up to twelve rounds of llama-batched-bench as run 10, held out
-npp 576 (at -c 14336, where a split cache's streams are 2.3x the window) and 1120, held-out calls hidden, held-out -npp
and -c no earlier run used."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import alternating_rounds, assert_held_out_hidden, bench_dry_run

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "validate" / "results" / "h200-llamacpp"
SCRIPT = (ROOT / "tools" / "llamacpp" / "run11.sh").read_text()


def _dry_run(tmp_path: Path, phase: str, env_extra: dict[str, str] | None = None) -> tuple[list[str], str, str]:
    summary, commands = bench_dry_run(tmp_path, phase, env_extra)
    return re.findall(r"\] (r11-batched-\S+): rc=", summary), summary, commands


def test_twelve_rounds_odd_ascending_even_reversed_held_out_hidden(tmp_path: Path) -> None:
    names, summary, commands = _dry_run(tmp_path, "run11")
    assert names == alternating_rounds("r11", (512, 576, 1120, 1280), rounds=12) and len(names) == 96
    assert_held_out_hidden(names, summary, (576, 1120))
    ctx = {int(pp): int(c) for c, pp in re.findall(r" -c (\d+) .* -npp (\d+) ", commands)}
    assert ctx == {512: 4864, 576: 14336, 1120: 9728, 1280: 11008}  # 8 x (npp + 64) + 256, but -npp 576 at -c 14336
    assert commands.count(" -kvu") == 48 and commands.count(" -npl 1,2,4,8 ") == 96 and " -ntg 64 " in commands


def test_a_warm_follow_up_call_repeats_no_finished_call(tmp_path: Path) -> None:
    first, _, _ = _dry_run(tmp_path, "run11", {"LCP_R11_ROUNDS": "2"})
    again, summary, _ = _dry_run(tmp_path, "run11b", {"LCP_R11_ROUNDS": "3"})
    assert len(first) == 16 and len(again) == 8 and all(n.endswith("-r3") for n in again)
    assert summary.count("done in an earlier call") == 16


def test_no_held_out_prompt_or_context_was_used_by_an_earlier_run() -> None:
    prompts: set[int] = set()
    contexts: set[int] = set()
    for run in ("run1", "run2", "run3", "run4", "run5", "run6", "run7", "run8", "run9", "run10", "span"):
        for f in (RESULTS / run).rglob("commands.txt"):
            text = f.read_text()
            prompts |= {int(x) for x in re.findall(r" -npp (\d+)", text)}
            contexts |= {int(x) for x in re.findall(r"batched-bench .* -c (\d+) ", text)}
    assert {512, 1280, 704, 960} <= prompts and {6400, 16384, 12800} <= contexts
    held = re.search(r'LCP_R11_PP_HELD:-([\d ]+)\}', SCRIPT)
    every = re.search(r'LCP_R11_PP:-([\d ]+)\}', SCRIPT)
    assert held is not None and every is not None
    assert held.group(1).split() == ["576", "1120"] and not {576, 1120} & prompts
    assert every.group(1).split() == ["512", "576", "1120", "1280"]  # every held-out -npp between the calibration ones
    assert not {14336, 9728} & contexts and re.search(r'LCP_R11_ROUNDS:-12\}', SCRIPT)
