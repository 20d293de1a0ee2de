"""Run 8 of issues 30 and 28 (tools/llamacpp/README-run8.md): the cache types interleaved in time (round A, the resident
processes, round A reversed), two processes per ordered configuration, held-out depths and contexts no earlier run used."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LCP = ROOT / "tools" / "llamacpp"
RESULTS = ROOT / "validate" / "results" / "h200-llamacpp"
SCRIPT = (LCP / "run8.sh").read_text()


def _ordered() -> list[tuple[str, str, str, int, str]]:
    block = SCRIPT.split("R8_ORD=(", 1)[1].split(")", 1)[0]
    return [(n, k, v, int(d), r) for n, k, v, d, r in re.findall(r'"(\S+) (\S+) (\S+) (\d+) (cal|held)"', block)]


def _dry_run(tmp_path: Path) -> list[str]:
    """The process names the run8 phase runs, in order, with stub llama-bench and llama-batched-bench binaries."""
    lcp = tmp_path / "lcp"
    (lcp / "build" / "bin").mkdir(parents=True)
    (lcp / "llama-3.1-8b-q8_0.gguf").write_text("")
    for name, body in (("llama-bench", "echo '[]'"), ("llama-batched-bench", "echo '{}'")):
        stub = lcp / "build" / "bin" / name
        stub.write_text(f"#!/bin/bash\n{body}\n")
        stub.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "LCP": str(lcp), "OUT": str(tmp_path / "out"), "HOME": str(tmp_path)}
    subprocess.run(["bash", str(LCP / "h200_bench.sh"), "run8"], cwd=ROOT, env=env, check=True, capture_output=True, timeout=120)
    summary = (tmp_path / "out" / "summary-run8.txt").read_text()
    return re.findall(r"\] (r8-\S+): rc=", summary)


def test_the_types_interleave_in_time_and_round_b_is_round_a_reversed(tmp_path: Path) -> None:
    names = _dry_run(tmp_path)
    ordered = [n for n in names if n.startswith("r8-ord-")]
    a, b = ordered[:16], ordered[16:]
    assert len(ordered) == 32 and [n[:-3] for n in b] == [n[:-3] for n in reversed(a)]
    assert all(n.endswith("-p1") for n in a) and all(n.endswith("-p2") for n in b)
    # every four consecutive processes of round A are the four types, one slot each; held out between calibration ones
    types = [re.match(r"r8-ord-(\S+?)-d", n).group(1) for n in a]  # type: ignore[union-attr]
    assert all(sorted(types[i:i + 4]) == ["f16", "mixed", "q4_0", "q8_0"] for i in range(0, 16, 4))
    roles = ["held" if "-held-" in n else "cal" for n in a]
    assert roles == ["cal"] * 4 + ["held"] * 4 + ["cal"] * 4 + ["held"] * 4
    # the resident processes between the rounds, then llama-batched-bench (held-out -npp between calibration ones)
    assert names[16:20] == [f"r8-res-{t}-all" for t in ("f16", "q8_0", "q4_0", "mixed")]
    batched = [re.search(r"pp(\d+)", n).group(1) for n in names if n.startswith("r8-batched-")]  # type: ignore[union-attr]
    assert batched == ["512", "512", "640", "640", "1088", "1088", "1280", "1280"] * 3
    starts = (next((tmp_path / "lcp").glob("out-run8-*")) / "starts.txt").read_text().split()
    assert starts[0::2][:32] == names[:16] + names[16:20] + names[20:32]  # every process's start is written


def test_each_held_out_depth_lies_inside_its_types_calibration_depths() -> None:
    rows = _ordered()
    for name in ("f16", "q8_0", "q4_0", "mixed"):
        cal = [d for n, _, _, d, r in rows if n == name and r == "cal"]
        held = [d for n, _, _, d, r in rows if n == name and r == "held"]
        assert len(cal) == 2 and len(held) == 2 and all(min(cal) < d < max(cal) for d in held)


def test_no_held_out_depth_or_prompt_was_used_by_an_earlier_run() -> None:
    earlier: set[int] = set()
    prompts: set[int] = set()
    for run in ("run1", "run2", "run3", "run4", "run5", "run6", "run7"):
        for f in (RESULTS / run).rglob("commands.txt"):
            text = f.read_text()
            for d in re.findall(r" -d (\S+)", text):
                earlier |= {int(x) for x in d.split(",") if x.isdigit()}
            prompts |= {int(x) for x in re.findall(r" -npp (\d+)", text)}
    held = {d for _, _, _, d, r in _ordered() if r == "held"}
    res = re.findall(r'"\S+ \S+ \S+ ([\d,]+) ([\d,]+)"', SCRIPT.split("R8_RES=(", 1)[1].split(")", 1)[0])
    held |= {int(d) for ds, cal in res for d in ds.split(",") if d not in cal.split(",")}
    assert len(held) == 10 and earlier and prompts and not held & earlier
    pp_held = re.search(r'LCP_R8_PP_HELD:-([\d ]+)\}', SCRIPT)
    assert pp_held is not None and pp_held.group(1).split() == ["640", "1088"] and not {640, 1088} & prompts


def test_the_committed_held_out_predictions_are_the_blind_ones() -> None:
    import json

    path = RESULTS / "prediction-types8"
    blind = {(r["cache"], r["nkvo"], r["depth"]): r["predicted_tps"] for r in json.loads((path / "blind.json").read_text())["rows"]}
    report = json.loads((path / "prediction.json").read_text())
    held = {(r["cache"], r["nkvo"], r["depth"]): r["predicted_tps"] for r in report["rows"] if r["role"] == "held out"}
    assert held == blind and len(held) == 16
    rule = json.loads((path / "blind.json").read_text())["staging_rule"]
    import sys

    if str(LCP) not in sys.path:
        sys.path.append(str(LCP))
    import staging_rule

    assert rule["chosen"] == staging_rule.choose(rule["scores_mse"])  # the committed choice is the rule's on its scores
    batched = RESULTS / "prediction-batched8"
    pred = {(r["layout"], r["pp"], r["pl"]): r["predicted_tps"] for r in json.loads((batched / "prediction.json").read_text())["held_out"]}
    rows = json.loads((batched / "comparison.json").read_text())["rows"]
    assert {(r["layout"], r["pp"], r["pl"]): r["predicted_tps"] for r in rows} == pred and len(pred) == 16
