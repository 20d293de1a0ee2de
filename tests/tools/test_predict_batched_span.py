"""predict_batched.py predict --kv-copy span: a split row is simulated with upstream's streams (-c over the largest
-npl, padded to 256, times the row's -npl) and the span copy; unified rows and the streams model get neither."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("predict_batched", ROOT / "tools" / "llamacpp" / "predict_batched.py")
assert spec is not None and spec.loader is not None
pb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pb)


@pytest.mark.parametrize("kv_copy", ["span", "streams"])
def test_span_rows_get_upstreams_streams_and_the_span_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kv_copy: str) -> None:
    calls: list[tuple[int, int, bool, int, str]] = []

    def fake(profile: str, gguf: str, pp: int, tg: int, pl: int, unified: bool, ctx_size: int = 0,
             kv_copy: str = "streams") -> tuple[float, str]:
        calls.append((pp, pl, unified, ctx_size, kv_copy))
        return 10.0 * pl, "kvpipe simulate ..."

    monkeypatch.setattr(pb, "simulate_tps", fake)
    (tmp_path / "p.json").write_text("{}")
    args = argparse.Namespace(profile=str(tmp_path / "p.json"), gguf="m.gguf", pp="704,960", npl="1,2,4,8", tg=64,
                              ctx="960=16384", kv_copy=kv_copy, out=str(tmp_path / "o"))
    assert pb.predict(args) == 0
    assert len(calls) == 16 and all(c[4] == kv_copy for c in calls)
    split = {(pp, pl): size for pp, pl, unified, size, _ in calls if not unified}
    if kv_copy == "span":  # -npp 704: -c 6400 / 8 = 800 -> 1024 cells a stream; -npp 960: 16384 / 8 = 2048
        assert split == {(704, pl): 1024 * pl for pl in (1, 2, 4, 8)} | {(960, pl): 2048 * pl for pl in (1, 2, 4, 8)}
    else:
        assert set(split.values()) == {0}
    assert all(size == 0 for _, _, unified, size, _ in calls if unified)
    data = json.loads((tmp_path / "o" / "prediction.json").read_text())
    assert data["kv_copy"] == kv_copy and {(r["pp"], r["c"]) for r in data["held_out"]} == {(704, 6400), (960, 16384)}
    assert ("--kv-copy span" in (tmp_path / "o" / "prediction.md").read_text()) == (kv_copy == "span")
