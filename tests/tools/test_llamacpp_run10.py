"""Run 10 of issue 28 (tools/llamacpp/README-run10.md): six rounds of llama-batched-bench as run 9, held out -npp 704 and
960 (the latter at -c 16384, where a split cache's streams outgrow the window), held-out calls hidden, held-out -npp
and -c no earlier run used."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import alternating_rounds, assert_held_out_hidden, bench_dry_run

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "validate" / "results" / "h200-llamacpp"
SCRIPT = (ROOT / "tools" / "llamacpp" / "run10.sh").read_text()


def _dry_run(tmp_path: Path, phase: str, env_extra: dict[str, str] | None = None) -> tuple[list[str], str, str]:
    summary, commands = bench_dry_run(tmp_path, phase, env_extra)
    return re.findall(r"\] (r10-batched-\S+): rc=", summary), summary, commands


def test_six_rounds_odd_ascending_even_reversed_held_out_hidden(tmp_path: Path) -> None:
    names, summary, commands = _dry_run(tmp_path, "run10")
    assert names == alternating_rounds("r10", (512, 704, 960, 1280)) and len(names) == 48
    assert_held_out_hidden(names, summary, (704, 960))
    ctx = {int(pp): int(c) for c, pp in re.findall(r" -c (\d+) .* -npp (\d+) ", commands)}
    assert ctx == {512: 4864, 704: 6400, 960: 16384, 1280: 11008}  # 8 x (npp + 64) + 256, but -npp 960 at -c 16384
    assert commands.count(" -kvu") == 24 and commands.count(" -npl 1,2,4,8 ") == 48 and " -ntg 64 " in commands


def test_a_warm_follow_up_call_repeats_no_finished_call(tmp_path: Path) -> None:
    first, _, _ = _dry_run(tmp_path, "run10", {"LCP_R10_ROUNDS": "2"})
    again, summary, _ = _dry_run(tmp_path, "run10b", {"LCP_R10_ROUNDS": "3"})
    assert len(first) == 16 and len(again) == 8 and all(n.endswith("-r3") for n in again)
    assert summary.count("done in an earlier call") == 16


def test_no_held_out_prompt_or_context_was_used_by_an_earlier_run() -> None:
    prompts: set[int] = set()
    contexts: set[int] = set()
    for run in ("run1", "run2", "run3", "run4", "run5", "run6", "run7", "run8", "run9", "span"):
        for f in (RESULTS / run).rglob("commands.txt"):
            text = f.read_text()
            prompts |= {int(x) for x in re.findall(r" -npp (\d+)", text)}
            contexts |= {int(x) for x in re.findall(r"batched-bench .* -c (\d+) ", text)}
    assert {512, 1280, 832, 1216} <= prompts and {10496, 12288} <= contexts
    held = re.search(r'LCP_R10_PP_HELD:-([\d ]+)\}', SCRIPT)
    every = re.search(r'LCP_R10_PP:-([\d ]+)\}', SCRIPT)
    assert held is not None and every is not None
    assert held.group(1).split() == ["704", "960"] and not {704, 960} & prompts
    assert every.group(1).split() == ["512", "704", "960", "1280"]  # every held-out -npp between the calibration ones
    assert not {6400, 16384} & contexts and re.search(r'LCP_R10_ROUNDS:-6\}', SCRIPT)
