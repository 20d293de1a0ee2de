"""The SimPy machine's copy path: copy engines, lanes, and what a copy call costs.

A *copy engine* per device and direction is a ``simpy.Resource`` shared by
every stream (:class:`_Engine`): copies in one direction run one at a time in
the order their streams reached them. A *lane* (:class:`_Lane`) is one
device's path in one direction from pinned or pageable host memory: its
engine, the engine of the other direction (full duplex, with the profile's
slowdown while both are busy), its link curve and the rule whether the engine
drains a stream's queued copies first; every copy on it reads these, so they
are looked up once per lane.

A copy's engine time is the link time of each call it is made of
(:func:`copy_seconds`): the calls are ``backends.base.copy_calls``, the rule
every machine shapes its copies by, so ranges that go as one 2D copy on a GPU
cost one link time of their bytes here, and a strided range (one 2D call)
costs one link time of its bytes too.

Units: seconds and bytes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Sequence
from typing import Any, Protocol

import simpy

from backends.base import CopyCall, CopyRange, copy_calls
from backends.profile import HardwareProfile, LinkCurve
from backends.simpy_env import FastEnvironment


class _Engine(simpy.Resource):
    """A copy engine: a ``simpy.Resource`` whose request and release take the short way through its queue.

    The events are SimPy's own, triggered exactly when ``simpy.Resource`` triggers them: a request is
    granted when it is made if it heads the queue and an engine is free, else when the release event of
    a user is processed (each such moment grants at most the head of the queue, as SimPy's does). What is
    skipped is the generic put/get bookkeeping around them (a release always succeeds at once).
    """

    def request(self) -> simpy.Event:  # type: ignore[override]
        req = simpy.Event(self._env)
        self.put_queue.append(req)  # type: ignore[arg-type]
        self._grant(None)
        return req

    def take(self) -> simpy.Event | None:
        """The engine granted in place, on a ``FastEnvironment`` (``backends.simpy_env``), where a request would be
        granted at once and its grant would be the next event processed, resuming only the caller: the request
        (a user, never triggered), or None where the caller must :meth:`request` and wait."""
        env = self._env
        if self.put_queue or len(self.users) >= self._capacity or not isinstance(env, FastEnvironment) or not env.advance(0.0):
            return None
        req = simpy.Event(env)
        self.users.append(req)  # type: ignore[arg-type]
        return req

    def release(self, request: simpy.Event) -> simpy.Event | None:  # type: ignore[override]
        """Release ``request``; the next waiting request is granted when the returned event is processed. One engine
        with no request waiting, on a ``FastEnvironment``: no event (None; counted as taken in place), since no
        request can be left waiting when it would be processed (one made meanwhile finds the engine free)."""
        if request in self.users:
            self.users.remove(request)  # type: ignore[arg-type]
            env = self._env
            if self._capacity == 1 and not self.put_queue and isinstance(env, FastEnvironment):
                env.advanced += 1  # the grant's event SimPy would process, which would find no request
                return None
        done = simpy.Event(self._env)
        done.callbacks.append(self._grant)  # type: ignore[union-attr]
        return done.succeed()

    def _grant(self, _: simpy.Event | None) -> None:
        if self.put_queue and len(self.users) < self._capacity:
            req = self.put_queue.pop(0)
            self.users.append(req)
            req.succeed()


class _Seconds(Protocol):
    def seconds(self, nbytes: float) -> float: ...


class _Lane:
    """One device's copy path in one direction from pinned or pageable host memory: what every copy on it reads."""

    __slots__ = ("device", "to_device", "engine", "other", "link", "slowdown", "drains", "track", "_memo", "pinned_link",
                 "chunk_bytes", "pinned")

    def __init__(self, device: int, to_device: bool, pinned: bool, h2d: simpy.Resource, d2h: simpy.Resource,
                 profile: HardwareProfile) -> None:
        dev = profile.devices[device]
        self.device = device
        self.to_device = to_device
        self.engine, self.other = (h2d, d2h) if to_device else (d2h, h2d)
        self.link = dev.link(to_device, pinned)
        self.slowdown = dev.duplex_slowdown
        self.drains = dev.copy_engine_drains_stream
        self.track = f"{'h2d' if to_device else 'd2h'}{device}"
        self._memo: dict[float, float] = {}
        self.pinned = pinned
        self.pinned_link = dev.link(to_device, True)
        self.chunk_bytes = dev.pageable_chunk_bytes

    def staging(self, nbytes: int) -> list[tuple[float, int, float]]:
        """A pageable H2D copy as the driver performs it: (host staging seconds, DMA bytes) per chunk.

        The driver copies the pageable source into a pinned staging buffer chunk
        by chunk, on the calling thread, and DMAs each staged chunk at the pinned
        link's rate while the next is staged. A pageable copy measured whole (the
        ``h2d_pageable`` curve: the host-blocked time of one call, which ends when
        the last chunk is staged) is therefore the staging of every chunk plus
        the DMA of the last one; the staging time is the curve's time less the
        pinned time of one chunk, spread evenly. Returns (staging seconds, DMA
        bytes, DMA seconds) per chunk. A copy the curve says is faster than a
        pinned DMA of it (small copies: the H200 probe timed 256 B pageable in
        3.3 us against 13.8 us pinned) goes inline: the host spends the whole
        measured time and no DMA follows.
        """
        whole = self.link.seconds(nbytes)
        chunk = max(1, min(self.chunk_bytes, nbytes))
        dma = self.pinned_link.seconds(chunk)
        if whole <= dma:
            return [(whole, nbytes, 0.0)]
        n = -(-nbytes // chunk)
        stage = whole - dma
        sizes = [chunk] * (n - 1) + [nbytes - chunk * (n - 1)]
        return [(stage / n, b, self.pinned_link.seconds(b)) for b in sizes]

    def seconds(self, nbytes: float) -> float:
        """``link.seconds(nbytes)``, memoized (the same few sizes recur every token)."""
        s = self._memo.get(nbytes)
        if s is None:
            s = self._memo[nbytes] = self.link.seconds(nbytes)
        return s


def calls_seconds(link: LinkCurve | _Seconds, calls: Sequence[CopyCall]) -> float:
    """Engine seconds of a copy made of ``calls``: one link time per call, of its bytes."""
    if len(calls) == 1:
        c = calls[0]
        return link.seconds(c.width * c.height)
    return sum(link.seconds(c.width * c.height) for c in calls)


def copy_seconds(link: LinkCurve | _Seconds, ranges: Sequence[CopyRange]) -> float:
    """Engine seconds of one copy call of ``ranges``: one 2D copy when they form one (``copy_calls``), else one per range."""
    return calls_seconds(link, copy_calls(ranges))


def dram_stretch(env: simpy.Environment, copies: deque[tuple[float, float, int]], dram_bytes_per_s: float,
                 start: float) -> Generator[simpy.Timeout, Any, None]:
    """Stretch the kernel that ran from ``start`` to now by the DRAM time of the copies it overlapped (a SimPy process
    step: yields the extra time). ``copies`` are the device's (start_s, end_s, bytes), oldest first.

    Every byte a copy engine moves through the device's memory while the
    kernel runs costs the (memory-bound) kernel ``1 / dram_bytes_per_s``
    seconds; a copy that overlaps part of the kernel counts pro rata. The
    stretch may overlap further copies: up to three rounds, each charging
    the bytes of the time just added.
    """
    while copies and copies[0][1] <= start:  # one kernel stream per device: older copies can no longer overlap
        copies.popleft()
    t0 = start
    for _ in range(3):
        t1 = env.now
        moved = 0.0
        for s, e, n in copies:
            if s < t1 and e > t0 and e > s:
                moved += n * (min(e, t1) - max(s, t0)) / (e - s)
        extra = moved / dram_bytes_per_s
        if extra <= 1e-12:
            return
        yield env.timeout(extra)
        t0 = t1


def next_copy_on(queue: Sequence[tuple[str, str, Any]], to_device: bool, device: int) -> bool:
    """Whether a stream's next queued item past records and fired waits is a copy on the engine of ``device`` and
    this direction (the drain rule's test). Pure."""
    for kind, _, payload in queue:
        if kind == "record" or (kind == "wait" and payload.triggered):
            continue
        if kind != "copy":
            return False
        dst, src = payload[0], payload[1]
        return bool(src.on_host == to_device and (dst if to_device else src).device == device)
    return False
