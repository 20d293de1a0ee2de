"""Shared fixtures: the reference preset, a recording backend wrapper, toy shapes, the scripts of tools/."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from backends.base import Buffer, CopyRange, Event, HostOp, Stream, Work
from backends.profile import HardwareProfile, load_profile
from sim.workload import ModelShape, Workload, cache_type, load_model

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def tool(name: str) -> ModuleType:
    """``tools/<name>.py`` as a module: the preset builders live there, outside the installed package."""
    if str(TOOLS) not in sys.path:
        sys.path.append(str(TOOLS))  # the tools import each other by module name, as they do when run as scripts
    return importlib.import_module(name)


def bench_dry_run(tmp_path: Path, phase: str, env_extra: dict[str, str] | None = None) -> tuple[str, str]:
    """``tools/llamacpp/h200_bench.sh phase`` with stub llama-bench and llama-batched-bench binaries (each
    llama-batched-bench call prints rows for -npl 1, 2, 4, 8): the summary it wrote and its commands.txt. Blocks (a
    bash run, seconds)."""
    lcp = tmp_path / "lcp"
    (lcp / "build" / "bin").mkdir(parents=True, exist_ok=True)
    (lcp / "llama-3.1-8b-q8_0.gguf").write_text("")
    for name, body in (("llama-bench", "echo '[]'"),
                       ("llama-batched-bench", 'for p in 1 2 4 8; do echo "{\\"pl\\": $p, \\"speed_tg\\": 1.0}"; done')):
        stub = lcp / "build" / "bin" / name
        stub.write_text(f"#!/bin/bash\n{body}\n")
        stub.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "LCP": str(lcp), "OUT": str(tmp_path / "out"), "HOME": str(tmp_path), **(env_extra or {})}
    subprocess.run(["bash", str(TOOLS / "llamacpp" / "h200_bench.sh"), phase], cwd=TOOLS.parent, env=env, check=True,
                   capture_output=True, timeout=120)
    commands = (next(lcp.glob(f"out-{phase}-*")) / "commands.txt").read_text()
    return (tmp_path / "out" / f"summary-{phase}.txt").read_text(), commands


def alternating_rounds(tag: str, pps: tuple[int, ...], rounds: int = 6) -> list[str]:
    """The call names of a run of ``rounds`` rounds over ``pps`` (each split then unified), odd rounds in that order and
    even rounds reversed (runs 9-10's design). Pure."""
    odd = [f"{kvu}-pp{pp}" for pp in pps for kvu in ("split", "unified")]
    return [f"{tag}-batched-{c}-r{k}" for k in range(1, rounds + 1) for c in (odd if k % 2 else odd[::-1])]


def assert_held_out_hidden(names: list[str], summary: str, held: tuple[int, ...]) -> None:
    """Held-out calls (their -npp in ``held``) show no figure in the summary, calibration calls do."""
    for n in names:
        line = next(x for x in summary.splitlines() if f"] {n}: rc=" in x)
        is_held = re.search(rf"pp({'|'.join(map(str, held))})-", n) is not None
        assert ("held out: figures not shown" in line) == is_held and ("t/s" in line) == (not is_held), line


@pytest.fixture(scope="session")
def rtx4070() -> HardwareProfile:
    return load_profile("rtx4070-gen4x16")


@pytest.fixture(scope="session")
def qwen() -> ModelShape:
    return load_model("qwen3.8-27b")


def reference_workload(context: int, tokens: int = 2, **kw: Any) -> Workload:
    q = cache_type("q8_0")
    return Workload(load_model("qwen3.8-27b"), q, q, (context,), tokens=tokens, **kw)


def toy_model(n_layers: int = 4, every: int = 1, **kw: Any) -> ModelShape:
    base = dict(
        name="toy",
        n_layers=n_layers,
        attn_layers=tuple(i for i in range(n_layers) if i % every == every - 1),
        n_head=8,
        n_head_kv=2,
        head_dim_k=64,
        head_dim_v=64,
        hidden=512,
        ffn=1024,
        vocab=1000,
        weight_bytes=n_layers * 1_000_000,
        small_inputs_bytes=(4, 16, 4096),
    )
    base.update(kw)
    return ModelShape(**base)  # type: ignore[arg-type]


@dataclass
class Call:
    """One backend call as the host made it."""

    index: int
    time_s: float
    op: str
    target: str
    detail: Any = None


@dataclass
class Recorder:
    """Wraps a backend and logs every host call in order, with its simulated time."""

    inner: Any
    calls: list[Call] = field(default_factory=list)
    name: str = "recorder"

    def _log(self, op: str, target: str, detail: Any = None) -> None:
        self.calls.append(Call(len(self.calls), self.inner.now_s(), op, target, detail))

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def create_stream(self, device: int, name: str) -> Stream:
        self._log("create_stream", name)
        return self.inner.create_stream(device, name)

    def create_event(self, device: int, name: str) -> Event:
        self._log("create_event", name)
        return self.inner.create_event(device, name)

    def record(self, event: Event, stream: Stream) -> HostOp:
        self._log("record", event.name, stream.name)
        yield from self.inner.record(event, stream)

    def wait_event(self, stream: Stream, event: Event) -> HostOp:
        self._log("wait_event", event.name, stream.name)
        yield from self.inner.wait_event(stream, event)

    def copy(self, stream: Stream, dst: Buffer, src: Buffer, ranges: Any, tag: str = "") -> HostOp:
        self._log("copy", tag, (stream.name, dst, src, tuple(ranges)))
        yield from self.inner.copy(stream, dst, src, ranges, tag)

    def launch(self, stream: Stream, work: Work) -> HostOp:
        self._log("launch", work.name, (stream.name, work))
        yield from self.inner.launch(stream, work)

    def synchronize(self, stream: Stream) -> HostOp:
        self._log("synchronize", stream.name)
        yield from self.inner.synchronize(stream)

    def wait_host(self, event: Event) -> HostOp:
        self._log("wait_host", event.name)
        yield from self.inner.wait_host(event)

    def alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        self._log("alloc", name, nbytes)
        return self.inner.alloc(device, nbytes, name)

    def free(self, buffer: Buffer) -> None:
        self._log("free", buffer.name, buffer.nbytes)
        self.inner.free(buffer)

    # Under the race checker (a machine that reaches the one it wraps through its hooks) the calls come to the hooks.

    def _create_stream(self, device: int, name: str) -> Stream:
        self._log("create_stream", name)
        return self.inner._create_stream(device, name)

    def _create_event(self, device: int, name: str) -> Event:
        self._log("create_event", name)
        return self.inner._create_event(device, name)

    def _record(self, event: Event, stream: Stream) -> HostOp:
        self._log("record", event.name, stream.name)
        yield from self.inner._record(event, stream)

    def _wait_event(self, stream: Stream, event: Event) -> HostOp:
        self._log("wait_event", event.name, stream.name)
        yield from self.inner._wait_event(stream, event)

    def _copy(self, stream: Stream, dst: Buffer, src: Buffer, ranges: Any, plan: Any, tag: str) -> HostOp:
        self._log("copy", tag, (stream.name, dst, src, tuple(ranges)))
        yield from self.inner._copy(stream, dst, src, ranges, plan, tag)

    def _synchronize(self, stream: Stream) -> HostOp:
        self._log("synchronize", stream.name)
        yield from self.inner._synchronize(stream)

    def _wait_host(self, event: Event) -> HostOp:
        self._log("wait_host", event.name)
        yield from self.inner._wait_host(event)

    def _alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        self._log("alloc", name, nbytes)
        return self.inner._alloc(device, nbytes, name)

    def _free(self, buffer: Buffer) -> None:
        self._log("free", buffer.name, buffer.nbytes)
        self.inner._free(buffer)

    def of(self, op: str) -> list[Call]:
        return [c for c in self.calls if c.op == op]


def ranges_cover(ranges: list[CopyRange]) -> list[tuple[int, int]]:
    return sorted((r.src_offset, r.src_offset + r.nbytes) for r in ranges if r.nbytes)


def fast_profile(base: HardwareProfile, h2d_gbps: float, memory_free_mib: float | None = None) -> HardwareProfile:
    """``base`` with zero host costs, zero latencies, a flat H2D link, an instant D2H link and engines in arrival order."""
    from backends.profile import LinkCurve

    dev = base.devices[0]
    h2d = LinkCurve((1.0,), (h2d_gbps * 1e9,), 0.0)
    d2h = LinkCurve((1.0,), (1e18,), 0.0)
    dev = replace(dev, h2d_pinned=h2d, h2d_pageable=h2d, d2h_pinned=d2h, d2h_pageable=d2h, copy_engine_drains_stream=False)
    if memory_free_mib is not None:
        dev = replace(dev, memory_used_bytes=dev.memory_total_bytes - int(memory_free_mib * 2**20))
    return replace(base, devices=(dev,), host=base.host.zero())
