"""tools/llamacpp/span_ratio.py: geometric means over the complete rounds only (unless --all-rounds), the ratio of
-c 10240 over -c 12288, and one line with exit 2 for a folder that is not the span check's."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "llamacpp"))
import span_ratio  # noqa: E402


def _write(folder: Path, name: str, tps: dict[int, float]) -> None:
    lines = ["log line"] + [json.dumps({"pp": 1216, "tg": 64, "pl": p, "n_kv": p * 1280, "t_tg": p * 64 / v, "speed_tg": v})
                            for p, v in tps.items()]  # llama-batched-bench's JSONL keys (validate.batched_bench reads them)
    (folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


def test_complete_rounds_only_then_all_rounds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for k, (a, b) in enumerate([(80.0, 50.0), (45.0, 72.0)], start=1):  # two complete rounds
        _write(tmp_path, f"span-split-c10240-r{k}", {8: a})
        _write(tmp_path, f"span-split-c12288-r{k}", {8: b})
        _write(tmp_path, f"span-unified-c10240-r{k}", {8: 60.0})
        _write(tmp_path, f"span-unified-c12288-r{k}", {8: 60.0})
    _write(tmp_path, "span-split-c10240-r3", {8: 1000.0})  # round 3 incomplete: counted only with --all-rounds
    assert span_ratio.main([str(tmp_path)]) == 0
    split = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| split | 8 "))
    want = math.sqrt(80 * 45) / math.sqrt(50 * 72)
    assert split.endswith(f"| {want:.3f} |") and "| 1,2 / 1,2 |" in split
    assert span_ratio.main([str(tmp_path), "--all-rounds"]) == 0
    split = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| split | 8 "))
    assert "| 1,2,3 / 1,2 |" in split and f"| {(80 * 45 * 1000) ** (1 / 3):.2f} |" in split


def test_not_a_span_folder_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert span_ratio.main([str(tmp_path / "nope")]) == 2
    assert span_ratio.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("span_ratio: ") for e in err)
