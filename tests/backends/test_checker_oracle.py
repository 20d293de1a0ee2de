"""The race checker against a brute-force oracle, over random host programs.

The checker keeps only the operations the host has not synchronized past and
compares an operation only with the in-flight ones it does not know of. The
oracle keeps everything: a full vector clock per operation (every enqueue
joins the host's clock into the stream, as CUDA orders it) and every pair of
accesses of different actors to overlapping bytes with a write, unordered when
the later operation's clock does not cover the earlier one's tick. Over random
programs of copies (pinned and pageable, 1D and 2D), kernels, CPU work,
records, event waits, host waits and synchronizes on three streams, both must
name the same pairs of operations.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from backends.base import Access, CopyRange, HostOp, Work
from backends.checked import CheckedBackend
from backends.profile import load_profile
from backends.simpy_machine import SimMachine

SIZE = 64  # bytes of every buffer (small, so that ranges meet often)
HOST_BUFS = ("h0", "h1", "pageable")
DEV_BUFS = ("d0", "d1")
N_STREAMS, N_EVENTS = 3, 2

span = st.tuples(st.integers(0, SIZE - 1), st.integers(1, 24)).map(lambda t: (t[0], min(t[1], SIZE - t[0])))
rw = st.tuples(st.sampled_from(DEV_BUFS), span, st.booleans())
ops = st.one_of(
    st.tuples(
        st.just("h2d"), st.integers(0, N_STREAMS - 1), st.sampled_from(HOST_BUFS), st.sampled_from(DEV_BUFS), span, st.integers(0, 1)
    ),
    st.tuples(
        st.just("d2h"), st.integers(0, N_STREAMS - 1), st.sampled_from(DEV_BUFS), st.sampled_from(HOST_BUFS), span, st.integers(0, 1)
    ),
    st.tuples(st.just("kernel"), st.integers(0, N_STREAMS - 1), st.lists(rw, min_size=1, max_size=3)),
    st.tuples(st.just("cpu"), st.lists(st.tuples(st.sampled_from(HOST_BUFS), span, st.booleans()), min_size=1, max_size=2)),
    st.tuples(st.just("record"), st.integers(0, N_STREAMS - 1), st.integers(0, N_EVENTS - 1)),
    st.tuples(st.just("wait"), st.integers(0, N_STREAMS - 1), st.integers(0, N_EVENTS - 1)),
    st.tuples(st.just("wait_host"), st.integers(0, N_EVENTS - 1)),
    st.tuples(st.just("sync"), st.integers(0, N_STREAMS - 1)),
)


def copy_ranges(lo: int, n: int, two_d: int) -> list[CopyRange]:
    """One range of ``n`` bytes at ``lo`` (both sides), or a 2D piece: 2 rows a byte apart in the source, packed in the destination."""
    w = n // 2
    if two_d and w >= 1 and lo + (w + 1) + w <= SIZE:
        return [CopyRange(lo, lo, 2 * w, rows=2, src_pitch=w + 1)]
    return [CopyRange(lo, lo, n)]


def accesses_of(op: tuple[Any, ...]) -> list[tuple[str, int, int, bool]]:
    """(buffer, lo, hi, write) of an operation, as the oracle sees it."""
    kind = op[0]
    if kind in ("h2d", "d2h"):
        _, _, src, dst, (lo, n), two_d = op
        out = []
        for r in copy_ranges(lo, n, two_d):
            out += [(src, o, o + w, False) for o, w in r.src_rows()]
            out.append((dst, r.dst_offset, r.dst_offset + r.nbytes, True))
        return out
    if kind == "kernel":
        return [(b, lo, lo + n, w) for b, (lo, n), w in op[2]]
    return [(b, lo, lo + n, w) for b, (lo, n), w in op[1]]


def oracle(program: list[tuple[Any, ...]]) -> set[tuple[str, str]]:
    """Every unordered conflicting pair (earlier op's name, later op's name), by brute force over all operations."""
    n = N_STREAMS + 1  # actor 0 is the host
    host = [0] * n
    streams = [[0] * n for _ in range(N_STREAMS)]
    events: dict[int, list[int]] = {}
    done: list[tuple[str, int, list[int], list[tuple[str, int, int, bool]]]] = []  # name, actor, clock, accesses
    found: set[tuple[str, str]] = set()

    def enqueue(s: int) -> list[int]:
        clock = streams[s]
        clock[:] = map(max, clock, host)
        clock[s + 1] += 1
        return clock

    for i, op in enumerate(program):
        kind, name = op[0], f"op{i}"
        if kind in ("h2d", "d2h", "kernel"):
            actor = op[1] + 1
            clock = list(enqueue(op[1]))
        elif kind == "cpu":
            actor = 0
            host[0] += 1
            clock = list(host)
        elif kind == "record":
            events[op[2]] = list(enqueue(op[1]))
            continue
        elif kind == "wait":
            clock = enqueue(op[1])
            if op[2] in events:
                clock[:] = map(max, clock, events[op[2]])
            continue
        elif kind == "wait_host":
            if op[1] in events:
                host[:] = map(max, host, events[op[1]])
            continue
        else:  # sync
            host[:] = map(max, host, streams[op[1]])
            continue
        mine = accesses_of(op)
        for other, o_actor, o_clock, theirs in done:
            if o_actor == actor or clock[o_actor] >= o_clock[o_actor]:
                continue  # same actor (program or stream order) or ordered
            if any(b == ob and lo < ohi and olo < hi and (w or ow) for b, lo, hi, w in mine for ob, olo, ohi, ow in theirs):
                found.add((other, name))
        done.append((name, actor, clock, mine))
        if kind in ("h2d", "d2h") and "pageable" in (op[2], op[3]):
            host[:] = map(max, host, streams[op[1]])  # a pageable copy blocks the host until it is done
    return found


def checked(program: list[tuple[Any, ...]]) -> set[tuple[str, str]]:
    machine = SimMachine(load_profile("rtx4070-gen4x16"), trace=False)
    checker = CheckedBackend(machine, max_examples=10**6)

    def run(be: CheckedBackend) -> HostOp:
        bufs = {b: be.alloc_host(SIZE, b, pinned=b != "pageable") for b in HOST_BUFS}
        bufs.update({b: be.alloc(0, SIZE, b) for b in DEV_BUFS})
        streams = [be.create_stream(0, f"s{i}") for i in range(N_STREAMS)]
        events = [be.create_event(0, f"e{i}") for i in range(N_EVENTS)]
        for i, op in enumerate(program):
            kind, name = op[0], f"op{i}"
            if kind in ("h2d", "d2h"):
                _, s, src, dst, (lo, n), two_d = op
                yield from be.copy(streams[s], bufs[dst], bufs[src], copy_ranges(lo, n, two_d), tag=name)
            elif kind == "kernel":
                accesses = tuple(Access(bufs[b], lo, n, w) for b, (lo, n), w in op[2])
                yield from be.launch(streams[op[1]], Work(name, 1e-6, 1, None, accesses))
            elif kind == "cpu":
                yield from be.run_host(Work(name, 1e-6, 0, None, tuple(Access(bufs[b], lo, n, w) for b, (lo, n), w in op[1])))
            elif kind == "record":
                yield from be.record(events[op[2]], streams[op[1]])
            elif kind == "wait":
                yield from be.wait_event(streams[op[1]], events[op[2]])
            elif kind == "wait_host":
                yield from be.wait_host(events[op[1]])
            else:
                yield from be.synchronize(streams[op[1]])

    machine.run(run(checker))
    pairs = {(h.first.name, h.second.name) for h in checker.examples}
    assert len(pairs) == checker.hazard_count  # one example per pair, none twice
    return pairs


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=8, max_size=60))
# The host learns s0's copy through s1's wait on s0's event and a sync of s1: the CPU write is ordered.
@example([("d2h", 0, "d0", "h0", (0, 8), 0), ("record", 0, 0), ("wait", 1, 0), ("sync", 1), ("cpu", [("h0", (0, 8), True)])])
# Two CPU reads under one in-flight copy out: two pairs, not one.
@example([("d2h", 0, "d0", "h0", (0, 8), 0), ("cpu", [("h0", (0, 8), False)]), ("cpu", [("h0", (0, 8), False)])])
def test_the_checker_names_exactly_the_pairs_a_brute_force_oracle_finds(program: list[tuple[Any, ...]]) -> None:
    expected = oracle(program)
    assert checked(program) == expected
    event(f"hazards: {'none' if not expected else '1-3' if len(expected) <= 3 else 'more'}")


def test_the_oracle_and_the_checker_agree_on_a_known_race() -> None:
    program = [
        ("h2d", 0, "h0", "d0", (0, 32), 0),
        ("kernel", 1, [("d0", (16, 32), False)]),
        ("sync", 0),
        ("kernel", 1, [("d0", (0, 8), False)]),
    ]
    assert oracle(program) == checked(program) == {("op0", "op1")}
