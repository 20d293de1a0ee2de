"""The span check of issue 28 (tools/llamacpp/README-span.md): llama-batched-bench at -npp 1216 with two -c values,
split and unified, in rounds with even rounds reversed; each call's -c is the one its name says (h200_bench.sh's
batched_one takes CTX), and run 9's calls keep their computed -c."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import bench_dry_run


def _dry_run(tmp_path: Path, phase: str, env_extra: dict[str, str]) -> tuple[list[str], str]:
    summary, commands = bench_dry_run(tmp_path, phase, env_extra)
    return re.findall(r"\] (\S+-batched-\S+|span-\S+): rc=", summary), commands


def test_rounds_of_four_even_rounds_reversed_each_call_its_own_c(tmp_path: Path) -> None:
    names, commands = _dry_run(tmp_path, "span", {})
    four = ["split-c12288", "split-c10240", "unified-c12288", "unified-c10240"]
    assert names == [f"span-{c}-r{k}" for k in (1, 2, 3) for c in (four if k % 2 else four[::-1])]
    for line in commands.splitlines():
        if line.startswith("span-"):
            name = line.split(":")[0]
            c = re.search(r"-c(\d+)-", name).group(1)  # type: ignore[union-attr]
            assert f" -c {c} " in line and " -npp 1216 -ntg 64 -npl 2,8 " in line
            assert line.endswith(" -kvu") == ("unified" in name)


def test_run9_calls_keep_their_computed_c(tmp_path: Path) -> None:
    _, commands = _dry_run(tmp_path, "run9", {"LCP_R9_ROUNDS": "1"})
    assert " -npp 1216 " in commands and " -c 10496 " in commands and " -c 12288 " not in commands  # 8 x 1280 + 256
