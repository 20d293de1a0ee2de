"""The data of one token's decode graph: its splits, the windows they read, the small inputs they copy, the layout.

Plain frozen values, built by ``sim.graph.decode_graph`` and read by the scheduler, the point planner and the
program: a :class:`DecodeGraph` is a tuple of :class:`Split` s; a GPU split reads :class:`StagedInput` windows
(each a tuple of :class:`WindowPiece` s, one per cache stream, with its stable prefix) and copies
:class:`SmallInput` s; :class:`CacheLayout` says where layer j's K and V rows of each stream live in the host
cache (K of all cells, then V of all cells, per attention layer). ``computed_once`` keeps a frozen value's
derived fields. Units: bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Generic, Literal, NamedTuple, TypeVar, overload

from sim.workload import Workload

T = TypeVar("T")


class computed_once(Generic[T]):  # noqa: N801 - used like functools.cached_property
    """``functools.cached_property`` without its lock (Python 3.11 takes an RLock on every first read, a third of the
    cost of a small graph's inputs): the value is computed on first read and kept in the instance's ``__dict__``,
    which later reads find first. For frozen dataclasses whose derived values are pure."""

    def __init__(self, fn: Callable[[Any], T]) -> None:
        self.fn, self.name = fn, fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, cls: type | None = None) -> computed_once[T]: ...

    @overload
    def __get__(self, obj: object, cls: type | None = None) -> T: ...

    def __get__(self, obj: object, cls: type | None = None) -> T | computed_once[T]:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


class _WindowPieceFields(NamedTuple):
    src_offset: int
    nbytes: int
    prefix_bytes: int
    rows: int = 1
    src_pitch: int = 0
    reserve_bytes: int = 0
    cell_bytes: int = 0


class WindowPiece(_WindowPieceFields):
    """One stream's part of a staged window: ``nbytes`` at ``src_offset``; the first ``prefix_bytes`` are stable.

    A piece is contiguous (``rows == 1``) or, for a head slice of a tensor
    split, ``rows`` blocks of ``nbytes // rows`` bytes ``src_pitch`` apart in
    the host cache (one 2D copy). ``reserve_bytes`` is what an *unpacked*
    slot reserves for it (the stream's whole stride); a packed slot reserves
    ``nbytes`` padded to the alignment. ``cell_bytes`` is one cache cell's
    share of the piece (a row, or a head slice's width of it; 0: unknown).
    Immutable (a tuple: a graph of many sequences holds thousands). Raises
    ValueError for a prefix outside the piece or rows that do not split it.
    """

    __slots__ = ()

    def __new__(cls, src_offset: int, nbytes: int, prefix_bytes: int, rows: int = 1, src_pitch: int = 0,
                reserve_bytes: int = 0, cell_bytes: int = 0) -> WindowPiece:
        if not 0 <= prefix_bytes <= nbytes:
            raise ValueError(f"prefix {prefix_bytes} outside 0..{nbytes}")
        if rows != 1 and (rows < 1 or nbytes % rows):
            raise ValueError(f"a strided piece needs whole rows: {nbytes} B in {rows} rows")
        return tuple.__new__(cls, (src_offset, nbytes, prefix_bytes, rows, src_pitch, reserve_bytes, cell_bytes))

    def __repr__(self) -> str:
        return "WindowPiece(" + ", ".join(f"{k}={v}" for k, v in zip(self._fields, self, strict=True)) + ")"

    @property
    def late_bytes(self) -> int:
        return self.nbytes - self.prefix_bytes

    @property
    def width(self) -> int:
        return self.nbytes // self.rows


@dataclass(frozen=True)
class StagedInput:
    """A host-resident window one attention split reads (K or V of one layer).

    ``layout_id`` names the pieces' layout: every field of every piece but its prefix. The graph builder gives
    equal layouts the same id (within a process; -1: none given), so what is derived from the layout alone (the
    ordered path's copy, the kernels' bindings) is worked out once per window size, not once per token.
    ``extent``: the window is copied as one extent from its first piece's start to its last piece's end, the gaps
    between the pieces included, and the pieces lie at their cache offsets within it (upstream llama.cpp's ordered
    copy of a split cache, ``Workload.copy_span``; contiguous pieces in ascending order).
    """

    name: str
    layer: int
    pieces: tuple[WindowPiece, ...]
    layout_id: int = field(default=-1, compare=False)
    extent: bool = False

    @property
    def extent_bytes(self) -> int:
        """Bytes from the first piece's start to the last piece's end (the copy of an ``extent`` window)."""
        first, last = self.pieces[0], self.pieces[-1]
        return last.src_offset + last.nbytes - first.src_offset

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)

    @property
    def early_bytes(self) -> int:
        return sum(p.prefix_bytes for p in self.pieces)

    @property
    def late_bytes(self) -> int:
        return self.nbytes - self.early_bytes


@dataclass(frozen=True)
class SmallInput:
    """A small tensor copied with a blocking copy (``to_device``: H2D, else D2H).

    ``src_device`` >= 0 marks an activation handed over from another device
    (layer split): it is first brought back from that device, then sent on.
    The cache rows a D2H input of several sequences lands in are
    ``row_offsets`` (one per sequence), or, evenly spaced, ``n_rows`` rows
    ``row_pitch`` apart from ``host_offset`` (one per stream of a split cache,
    or neighbouring cells: a description that does not grow with the sequences).
    """

    name: str
    nbytes: int
    to_device: bool
    host_offset: int = 0
    src_device: int = -1
    row_offsets: tuple[int, ...] = ()
    n_rows: int = 0
    row_pitch: int = 0

    @computed_once
    def rows(self) -> tuple[tuple[int, int], ...]:
        """(host offset, bytes) of each cache row a D2H input lands in (several sequences: one row each). Computed once."""
        if self.n_rows:
            return tuple((self.host_offset + i * self.row_pitch, self.nbytes // self.n_rows) for i in range(self.n_rows))
        offs = self.row_offsets or (self.host_offset,)
        return tuple((o, self.nbytes // len(offs)) for o in offs)

    @computed_once
    def row_spans(self) -> tuple[tuple[int, int], ...]:
        """:attr:`rows` with adjacent rows merged: (host offset, bytes) of each contiguous run (a unified cache's
        sequences write neighbouring cells). Computed once."""
        out: list[list[int]] = []
        for o, n in self.rows:
            if out and out[-1][0] + out[-1][1] == o:
                out[-1][1] += n
            else:
                out.append([o, n])
        return tuple((o, n) for o, n in out)

    @computed_once
    def row_pattern(self) -> tuple[tuple[int, int, int, int], ...]:
        """:attr:`row_spans` as (offset, bytes, count, pitch): one entry when they are equal and evenly spaced (one
        row per stream of a split cache), else one per span (count 1). Computed once."""
        if self.n_rows:
            row = self.nbytes // self.n_rows
            if self.n_rows == 1 or self.row_pitch == row:  # one row, or neighbouring cells: one range
                return ((self.host_offset, self.nbytes, 1, 0),)
            return ((self.host_offset, row, self.n_rows, self.row_pitch),)
        if not self.row_offsets:
            return ((self.host_offset, self.nbytes, 1, 0),)
        spans = self.row_spans
        if len(spans) > 2:
            o0, n = spans[0]
            pitch = spans[1][0] - o0
            if pitch >= n and all(o == o0 + i * pitch and b == n for i, (o, b) in enumerate(spans)):
                return ((o0, n, len(spans), pitch),)
        return tuple((o, b, 1, 0) for o, b in spans)


@dataclass(frozen=True)
class Split:
    """One split of the graph, run on one backend (``kind``) of one device."""

    index: int
    kind: Literal["gpu", "cpu"]
    device: int
    name: str
    compute_s: float
    layers: tuple[int, ...] = ()
    attn_layer: int = -1
    staged: tuple[StagedInput, ...] = ()
    ordered: tuple[SmallInput, ...] = ()
    n_launches: int = 1
    #: Windows of device-resident attention layers (``--kv-gpu-layers``) whose attention runs inside this split: read
    #: where the device's KV buffer holds them (its offsets are the host cache's), never delivered.
    resident: tuple[StagedInput, ...] = ()
    #: The new K/V rows this split writes into the device's KV buffer (one K and one V input per resident layer;
    #: ``host_offset``/``rows`` name the cells, at the host cache's offsets).
    resident_rows: tuple[SmallInput, ...] = ()
    #: A CPU split that stores the new K/V rows of a host-cache layer (the resident arm has none: its kernels write
    #: the device's cache); a CPU split that runs layers (``-ngl``) runs on every arm that runs kernels.
    stores_rows: bool = False


@dataclass(frozen=True)
class DecodeGraph:
    """The splits of one decode token, plus what the plan needs to know."""

    token: int
    splits: tuple[Split, ...]
    window_rows: int
    full_window_rows: int
    host_cache_bytes: int
    positions: tuple[int, ...]
    host_writes_at_start: tuple[tuple[int, int], ...] = field(default=())  # (offset, nbytes) written before split 0
    reads_output: bool = True  # False: an intermediate ubatch whose logits the loop does not read (no host sync at its end)
    device_kv_bytes: int = 0  # the host cache's first bytes a device keeps (--kv-gpu-layers: those layers' K and V blocks)
    #: The host cache's bytes of the attention layers that run on the CPU (-ngl: the first ones): the resident arm's
    #: device copy starts after them, as llama.cpp keeps a CPU layer's KV in host memory.
    host_only_kv_bytes: int = 0

    @computed_once
    def staged_splits(self) -> tuple[Split, ...]:
        """The splits that read staged windows, in graph order (computed once)."""
        return tuple(s for s in self.splits if s.staged)

    @computed_once
    def memo(self) -> dict[Any, Any]:
        """What readers derive from this graph and keep with it, by a key of their own (the graph is frozen and
        shared by every point that differs only in depth and budget): not a field, so no part of equality."""
        return {}


@dataclass(frozen=True)
class CacheLayout:
    """Where each layer's K and V rows of each stream live in the host cache buffer."""

    n_attn: int
    cells_per_stream: int
    n_streams: int
    k_row_bytes: int
    v_row_bytes: int
    copy_span: bool = False  # the ordered path copies a window of several streams as one extent (Workload.copy_span)

    @property
    def cells(self) -> int:
        return self.cells_per_stream * self.n_streams

    def k_offset(self, attn_index: int, stream: int = 0, row: int = 0) -> int:
        base = attn_index * self.cells * (self.k_row_bytes + self.v_row_bytes)
        return base + (stream * self.cells_per_stream + row) * self.k_row_bytes

    def v_offset(self, attn_index: int, stream: int = 0, row: int = 0) -> int:
        base = attn_index * self.cells * (self.k_row_bytes + self.v_row_bytes) + self.cells * self.k_row_bytes
        return base + (stream * self.cells_per_stream + row) * self.v_row_bytes

    @property
    def nbytes(self) -> int:
        return self.n_attn * self.cells * (self.k_row_bytes + self.v_row_bytes)


def layout_of(wl: Workload) -> CacheLayout:
    return CacheLayout(wl.model.n_attn, wl.cells_per_stream, wl.n_streams, wl.k_row_bytes, wl.v_row_bytes,
                       wl.copy_span and wl.n_streams > 1)


def head_ranges(n_head_kv: int, proportions: tuple[float, ...], n_devices: int) -> list[tuple[int, int]]:
    """Whole KV heads per device in ``proportions`` (tensor split); devices may get none."""
    props = list(proportions[:n_devices]) or [1.0] * n_devices
    props += [0.0] * (n_devices - len(props))
    total, acc, out, lo = sum(props), 0.0, [], 0
    for p in props:
        acc += p
        hi = round(acc / total * n_head_kv)
        out.append((lo, hi))
        lo = hi
    return out


# Fast construction. A graph of a 32-layer model holds ~260 of these values and the generated ``__init__`` of a frozen
# dataclass sets each field through ``object.__setattr__`` (a Split: ~4 us, most of a graph's build). These classes
# have no ``__post_init__`` and no factory defaults, so a function that fills ``__dict__`` with every field (its
# default where not given: keywords only, as the dataclass's own ``__init__`` is generated from its fields) builds the
# value the constructor would -- equal, with the same repr, hash and pickle -- at about a quarter of the cost.
def _filler(cls: type[T]) -> Callable[..., T]:
    fs = fields(cls)  # type: ignore[arg-type]
    assert all(f.default_factory is MISSING for f in fs) and "__post_init__" not in vars(cls), cls
    params = ", ".join(f.name if f.default is MISSING else f"{f.name}=_d_{f.name}" for f in fs)
    body = ", ".join(f"{f.name!r}: {f.name}" for f in fs)
    scope: dict[str, Any] = {f"_d_{f.name}": f.default for f in fs if f.default is not MISSING}
    scope.update(_cls=cls, _new=object.__new__, _set=object.__setattr__)
    exec(f"def make(*, {params}):\n    obj = _new(_cls)\n    _set(obj, '__dict__', {{{body}}})\n    return obj", scope)  # noqa: S102
    make = scope["make"]
    make.__doc__ = f"``{cls.__name__}(**values)``, built without its field-by-field ``__init__`` (see above). Pure."
    return make  # type: ignore[no-any-return]


#: ``Split(**values)`` (keywords only), fast. Pure.
new_split = _filler(Split)
#: ``SmallInput(**values)`` (keywords only), fast. Pure.
new_small_input = _filler(SmallInput)
#: ``StagedInput(**values)`` (keywords only), fast. Pure.
new_staged_input = _filler(StagedInput)
