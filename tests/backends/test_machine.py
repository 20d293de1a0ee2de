"""The machine base (``backends.machine``): the checks it keeps once for every machine, and the race checker as a
machine that wraps another through its hooks."""

from __future__ import annotations

import pytest

from backends.base import Backend, BackendError, CopyRange, Event, HostOp, Stream
from backends.checked import CheckedBackend
from backends.machine import Machine
from backends.profile import load_profile
from backends.simpy_machine import SimMachine

PROFILE = load_profile("rtx4070-gen4x16")


class Counted(SimMachine):
    """A SimPy machine that counts how often its stream and event hooks are reached."""

    def __init__(self) -> None:
        super().__init__(PROFILE, trace=False)
        self.hooks: list[str] = []

    def _create_stream(self, device: int, name: str) -> Stream:
        self.hooks.append("stream")
        return super()._create_stream(device, name)

    def _create_event(self, device: int, name: str) -> Event:
        self.hooks.append("event")
        return super()._create_event(device, name)


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_bad_device_is_refused_at_the_base_before_any_hook(wrapped: bool) -> None:
    inner = Counted()
    m: Machine = CheckedBackend(inner) if wrapped else inner
    for make in (m.create_stream, m.create_event):
        with pytest.raises(BackendError, match="device 1 out of range; this machine has 1"):
            make(1, "x")
    assert inner.hooks == []
    m.create_stream(0, "s"), m.create_event(0, "e")
    assert inner.hooks == ["stream", "event"]  # the checker reaches the inner machine through its hooks


def test_the_checker_is_a_machine_and_its_hooks_reach_the_inner_ones() -> None:
    inner = SimMachine(PROFILE, trace=False)
    c = CheckedBackend(inner)
    assert isinstance(c, Machine) and isinstance(c, Backend)
    assert c.now_s == inner.now_s and c.free_bytes == inner.free_bytes  # the unwatched members are the inner's own
    before = inner.free_bytes(0)
    buf = c.alloc(0, 1 << 20, "b")
    assert inner.free_bytes(0) == before - (1 << 20)
    c.free(buf)
    assert inner.free_bytes(0) == before and buf.array is None


@pytest.mark.parametrize("ordered", [False, True])
def test_a_free_while_a_copy_into_the_buffer_is_in_flight_is_a_hazard(ordered: bool) -> None:
    inner = SimMachine(PROFILE, trace=False)
    c = CheckedBackend(inner)

    def prog() -> HostOp:
        s = c.create_stream(0, "s")
        host, dev = c.alloc_host(4096, "host"), c.alloc(0, 4096, "dev")
        ev = c.create_event(0, "done")
        yield from c.copy(s, dev, host, [CopyRange(0, 0, 4096)], tag="fill")
        if ordered:
            yield from c.record(ev, s)
            yield from c.wait_host(ev)
        c.free(dev)

    inner.run(prog())
    assert c.hazard_count == (0 if ordered else 1)
    if not ordered:
        h = c.examples[0]
        assert (h.buffer, h.first.name, h.second.kind, h.second.name) == ("dev", "fill", "free", "dev")


def test_record_marks_the_event_through_the_base_for_the_checker_and_the_machine() -> None:
    for m in (SimMachine(PROFILE, trace=False), CheckedBackend(SimMachine(PROFILE, trace=False))):
        s, ev = m.create_stream(0, "s"), m.create_event(0, "e")
        assert not ev.recorded

        def prog(m: Machine = m, s: Stream = s, ev: Event = ev) -> HostOp:
            yield from m.record(ev, s)
            yield from m.wait_host(ev)

        m.run(prog())
        assert ev.recorded
