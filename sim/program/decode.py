"""The decode program: the scheduler's ``Program``, a seeded transformer behind the decode graph's splits.

The transport scheduler moves bytes; this program gives them meaning, so that
a schedule that races produces a wrong answer. It is shaped like llama.cpp's
decode: K/V rows exactly the workload's (every staged byte is a real cache
byte), weights stored as a GGUF file stores them (q8_0 by default), hidden,
FFN and vocabulary capped by :class:`~sim.program.shape.ProgramConfig`. It
decodes the workload's ``n_parallel`` sequences together, one new row each per
graph. One token, split by split (``sim.graph`` builds the splits):

* **GPU split 0**: embeds each sequence's current token (kept on the device),
  runs the layers before the first attention layer, and writes that layer's
  new K and V rows, encoded in the cache type, to the device ``io`` buffer (the
  K rows of all sequences from byte 0, then their V rows). Its graph inputs
  (``kq_mask``, :func:`sim.program.plan.encode_inputs`: which cells each
  sequence attends this token) reach the device with its small-input copy.
* **CPU split**: the scheduler copied the new rows back to the host ``io``
  buffer; the split writes each sequence's row into the host cache row it
  names (``cache:k_cur_l<a>``, or ``cache:k_cur_l<a>#<t>`` for sequence t).
* **Attention split** of layer ``a``: attention over the cells the graph
  inputs name, read from ``window:cache_k_l<a>`` / ``window:cache_v_l<a>``
  (``#<stream>`` per stream of a split cache) -- a ring slot when pipelined,
  the graph's own memory when ordered -- then its FFN layers, then the next
  attention layer's K/V rows, or, in the last split, the logits, the greedy
  token of every sequence and the step's record.

Two executors compute a split: :class:`~sim.program.numpy_exec.NumpyExecutor`
(the reference; functional simulation) and
:class:`~sim.program.cuda_exec.CudaExecutor` (CUDA kernels captured as one
graph per split). Both read the same bytes through the same
:class:`~sim.program.plan.SplitPlan`. Weights and state live in buffers from
``backend.alloc`` on device 0, so the device memory ledger holds them.

``setup`` fills the host cache (``fill="host"``: each sequence's rows keyed by
(seed, layer, K/V, sequence), so a read of another sequence's cells changes
the output; ``fill="device"``: every cell, made by the array module, once per
buffer). ``host_update_run(graph)`` rewrites ``graph.host_writes_at_start``
with content keyed by (seed, token, first cell). Results, after a run:
``step_hashes()``, ``tokens(s)``, ``output_hash()``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from backends.base import Backend, Buffer
from sim.bindings import IO, RESIDENT_CACHE, cache_input, cache_rows, fresh, host_input, small, window
from sim.graph import CacheLayout, DecodeGraph, Split, layout_of
from sim.program.codecs import encode_rows
from sim.program.numpy_exec import NumpyExecutor
from sim.program.plan import INPUT_NAME, Binding, SplitPlan, encode_inputs
from sim.program.shape import ProgramConfig, ProgramShape, shape_of
from sim.program.weights import draw, randn, row_bytes
from sim.sequences import SequenceCells
from sim.workload import Workload

RunFn = Callable[[Any], None]
FILL_CHUNK_ROWS = 16384


@dataclass
class WeightStore:
    """Device weights per (model, sizes, weight type), shared by the programs of every context of that model."""

    weights: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    buffers: dict[tuple[Any, ...], list[Buffer]] = field(default_factory=dict)

    def release(self, backend: Backend, keep: tuple[Any, ...] = ()) -> None:
        """Free every stored set of weights except ``keep``'s. Does not block."""
        for key in [k for k in self.buffers if k != keep]:
            for b in self.buffers.pop(key):
                backend.free(b)
            self.weights.pop(key, None)


def make_executor(shape: ProgramShape, xp: Any, kind: str) -> Any:
    """The executor ``kind`` names (``auto``: CUDA when ``xp`` is CuPy with a device, else the NumPy reference)."""
    if kind == "auto":
        kind = "cuda" if hasattr(xp, "RawModule") and hasattr(getattr(xp, "cuda", None), "graph") else "numpy"
    if kind == "cuda":
        from sim.program.cuda_exec import CudaExecutor

        return CudaExecutor(shape, xp)
    return NumpyExecutor(shape, xp)


class DecodeProgram:
    """The decode program behind a workload's splits (the scheduler's ``Program``)."""

    def __init__(self, workload: Workload, config: ProgramConfig | None = None, xp: Any = None,
                 store: WeightStore | None = None) -> None:
        if workload.gpu_layer_start:
            raise ValueError(f"the decode program runs every layer on the GPU; got -ngl {workload.n_gpu_layers} of "
                             f"{workload.model.n_layers} layers")
        self.wl = workload
        self.cfg = config or ProgramConfig()
        self.xp = xp if xp is not None else np
        self.model = workload.model
        self.shape = shape_of(workload, self.cfg)
        s = self.shape
        self.hidden, self.ffn, self.vocab, self.kb, self.vb = s.hidden, s.ffn, s.vocab, s.kb, s.vb
        self.layout: CacheLayout = layout_of(workload)
        self.seqs: SequenceCells = workload.sequence_cells
        self.n_seq = workload.n_parallel
        self.store = store if store is not None else WeightStore()
        self.exec: Any = None
        self._state: list[Buffer] = []
        self._inputs: Binding | None = None
        self._filled: Buffer | None = None
        self.host_cache: Buffer | None = None

    # ---------------------------------------------------------- setup

    def _store_key(self) -> tuple[Any, ...]:
        s = self.shape
        return (self.model.name, s.n_layers, s.n_attn, s.hidden, s.ffn, s.vocab, s.weight_type, self.cfg.seed)

    def setup(self, backend: Backend, host_cache: Buffer) -> None:
        """Make weights (once per model), state and executor (once), fill the host cache (once per buffer), reset.

        Blocks until the device has the weights.
        """
        self.host_cache = host_cache
        if self.exec is None:
            self._make(backend)
        self.reset()
        if host_cache.array is not None and self._filled is not host_cache:
            (self._fill_host if self.cfg.fill == "host" else self._fill_device)(host_cache.array)
            self._filled = host_cache

    def _make(self, backend: Backend) -> None:
        xp, s, key = self.xp, self.shape, self._store_key()
        if key not in self.store.weights:
            self.store.release(backend)
            bufs: list[Buffer] = []
            w: dict[str, Any] = {}
            for i, (name, (rows, cols)) in enumerate(s.weight_shapes().items()):
                rb = row_bytes(cols, s.weight_type)
                buf = backend.alloc(0, rows * rb, f"w_{name}")
                bufs.append(buf)
                if buf.array is not None:
                    view = buf.array[: rows * rb].reshape(rows, rb)
                    view[...] = draw(xp, self.cfg.seed * 100003 + i, (rows, cols), s.weight_type)
                    w[name] = view
            self.store.weights[key], self.store.buffers[key] = w, bufs
        weights = self.store.weights[key]
        x = self._state_array(backend, "x", (s.n_seq, s.hidden), xp.float32)
        tok = self._state_array(backend, "tok", (s.n_seq,), xp.int32)
        step = self._state_array(backend, "step", (1,), xp.int32)
        if weights and x is not None:
            self.exec = make_executor(s, xp, self.cfg.executor)
            self.exec.bind(weights, x, tok, step)

    def _state_array(self, backend: Backend, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        buf = backend.alloc(0, n, f"prog_{name}")
        self._state.append(buf)
        return None if buf.array is None else buf.array[:n].view(dtype).reshape(shape)

    def reset(self) -> None:
        """Zero the hidden states, give every sequence the first token, forget the results. Does not block."""
        if self.exec is not None:
            self.exec.reset(self.cfg.seed % self.vocab)

    def _block(self, cache: Any, j: int, kv: int) -> Any:
        """Layer j's K (kv=0) or V (kv=1) cells of every stream, as a (cells, row bytes) view of ``cache``."""
        lay, rb = self.layout, (self.kb if kv == 0 else self.vb)
        base = lay.k_offset(j) if kv == 0 else lay.v_offset(j)
        return cache[base : base + lay.cells * rb].reshape(lay.cells, rb)

    def _rows_content(self, kv: int, rows: int, key: list[int]) -> np.ndarray:
        """``rows`` deterministic K (kv=0) or V rows keyed by ``key``, encoded in the cache type."""
        elems = self.model.k_elems if kv == 0 else self.model.v_elems
        x = np.random.default_rng(key).standard_normal((rows, elems), dtype=np.float32)
        return encode_rows(np, x, self.wl.cache_k if kv == 0 else self.wl.cache_v)

    def _fill_host(self, cache: np.ndarray) -> None:
        for seq in range(self.n_seq):
            cap = self.seqs.capacity(seq)
            rows = cap if self.cfg.prefill_rows < 0 else min(self.cfg.prefill_rows, cap)
            for j in range(self.model.n_attn):
                for kv in (0, 1):
                    self._write_prompt(cache, j, kv, seq, rows)

    def _write_prompt(self, cache: np.ndarray, j: int, kv: int, seq: int, rows: int) -> None:
        """Rows 0..rows of sequence ``seq`` (its prompt and beyond), keyed by (seed, layer, kv, sequence)."""
        enc, block = self._rows_content(kv, rows, [self.cfg.seed, 0, j, kv, seq]), self._block(cache, j, kv)
        cps, i = self.layout.cells_per_stream, 0
        for sl in self.seqs.cells_of(seq, rows):
            base = sl.stream * cps
            block[base + sl.start : base + sl.stop : sl.step] = enc[i : i + len(sl)]
            i += len(sl)

    def _fill_device(self, cache: np.ndarray) -> None:
        """Every cell of every layer's K and V: seeded rows encoded in the cache type, made by ``xp``. Blocks."""
        xp, m, lay = self.xp, self.model, self.layout
        for j in range(m.n_attn):
            for kv, elems, ctype, rb in ((0, m.k_elems, self.wl.cache_k, self.kb), (1, m.v_elems, self.wl.cache_v, self.vb)):
                base = lay.k_offset(j) if kv == 0 else lay.v_offset(j)
                for r0 in range(0, lay.cells, FILL_CHUNK_ROWS):
                    r1 = min(lay.cells, r0 + FILL_CHUNK_ROWS)
                    seed = (self.cfg.seed * 1_000_003 + j * 4099 + kv * 131 + r0) & 0x7FFFFFFF
                    x = randn(xp, seed, (r1 - r0, elems))
                    enc = encode_rows(xp, x, ctype).reshape(-1)
                    dst = cache[base + r0 * rb : base + r1 * rb]
                    if hasattr(enc, "get") and not isinstance(enc, np.ndarray):
                        enc.get(out=dst)
                    else:
                        dst[:] = enc

    # ------------------------------------------------------ graph start

    def graph_inputs(self, graph: DecodeGraph) -> dict[str, np.ndarray]:
        """Bytes of the graph's inputs the program defines (``kq_mask``: the cells each sequence attends)."""
        several = self.layout.n_streams > 1
        rows: dict[int, int] = {}
        for i, cell in enumerate(graph.positions):
            seq, row = self.seqs.owner(i if several else 0, cell)
            rows[seq] = row
        if sorted(rows) != list(range(self.n_seq)):
            raise ValueError(f"the decode program needs one new row per sequence, got sequences {sorted(rows)}")
        return {INPUT_NAME: encode_inputs(self.seqs, rows)}

    def host_update_run(self, graph: DecodeGraph) -> RunFn:
        """The run of the graph-start host writes: rewrite the named cells (row-aligned ranges) with fresh content."""
        regions = [self._region(o, n) for o, n in graph.host_writes_at_start]

        def run(xp: Any) -> None:
            assert self.host_cache is not None
            for j, kv, r0, r1 in regions:
                if r1 > r0:
                    key = [self.cfg.seed, graph.token + 1, j, kv, r0]
                    self._block(self.host_cache.array, j, kv)[r0:r1] = self._rows_content(kv, r1 - r0, key)

        return run

    def _region(self, offset: int, nbytes: int) -> tuple[int, int, int, int]:
        """(attention index, kv, first cell, end cell) of a row-aligned host-cache range inside one K or V block."""
        lay = self.layout
        for j in range(self.model.n_attn):
            for kv, base, rb in ((0, lay.k_offset(j), self.kb), (1, lay.v_offset(j), self.vb)):
                end = base + lay.cells * rb
                if base <= offset < end:
                    if (offset - base) % rb or nbytes % rb or offset + nbytes > end:
                        raise ValueError(f"host write ({offset}, {nbytes}) is not whole rows of one K/V block")
                    r0 = (offset - base) // rb
                    return j, kv, r0, r0 + nbytes // rb
        raise ValueError(f"host write at {offset} lies outside the cache")

    # ------------------------------------------------------------ splits

    def cpu_run(self, split: Split, bindings: dict[str, Binding]) -> RunFn | None:
        """The CPU split: copy each sequence's new rows from the host io buffer into the host cache rows it names."""
        moves = []
        for inp in split.ordered:
            src = bindings.get(host_input(inp.name))
            for t, (_, nbytes) in enumerate(inp.rows):
                dst = bindings.get(cache_rows(inp.name, None if len(inp.rows) == 1 else t))
                if src is not None and dst is not None:
                    moves.append((src[0], src[1] + t * nbytes, dst, nbytes))

        def run(xp: Any) -> None:
            for sb, so, (db, do, _), n in moves:
                db.array[do : do + n] = sb.array[so : so + n]

        return run

    def gpu_run(self, split: Split, bindings: dict[str, Binding]) -> RunFn | None:
        """A GPU split's run callable (None before setup made an executor).

        A split through device-resident attention layers (``Split.resident``, --kv-gpu-layers) is one
        :class:`SplitPlan` per attention layer it starts at or passes, run in order on the split's stream: each
        plan's attention reads its window where the bindings put it, and a plan whose next layer the device keeps
        writes that layer's new rows there (:meth:`_store_of`).
        """
        if self.exec is None:
            return None
        m = self.model
        inputs = bindings.get(small(INPUT_NAME))
        if inputs is not None:
            self._inputs = inputs
        starts = ([split.attn_layer] if split.attn_layer >= 0 else [-1]) + sorted({w.layer for w in split.resident})
        runs = []
        for i, layer in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else m.n_layers
            layers = tuple(x for x in split.layers if layer <= x < end)
            runs.append(self.exec.split(self._plan(split, bindings, i == 0 and split.index == 0, layer, layers)))
        if len(runs) == 1:
            return runs[0]  # type: ignore[no-any-return]

        def run(xp: Any) -> None:
            for r in runs:
                r(xp)

        return run

    def _plan(self, split: Split, bindings: dict[str, Binding], embed: bool, layer: int, layers: tuple[int, ...]) -> SplitPlan:
        """The plan of the part of ``split`` from attention layer ``layer`` (-1: the split's start) over ``layers``."""
        m = self.model
        attn = m.attn_layers.index(layer) if layer >= 0 else -1
        windows: tuple[tuple[Binding, Binding], ...] = ()
        if attn >= 0:
            several = self.layout.n_streams > 1
            tag = lambda kv, seq: window(cache_input(kv, layer), seq if several else None)  # noqa: E731
            windows = tuple((bindings[tag("k", seq)], bindings[tag("v", seq)]) for seq in range(self.n_seq))
        nxt = attn + 1
        return SplitPlan(
            index=split.index,
            embed=embed,
            attn=attn,
            windows=windows,
            ffn_layers=tuple(x for x in layers if x not in m.attn_layers or x == layer),
            next_kv=nxt if nxt < m.n_attn else -1,
            io=bindings[IO],
            inputs=self._inputs,
            store=self._store_of(bindings.get(RESIDENT_CACHE), nxt) or self._fresh_of(bindings, nxt),
        )

    def _fresh_of(self, bindings: dict[str, Binding], j: int) -> tuple[Binding, Binding] | None:
        """The staged slot windows of attention layer ``j`` the scheduler asks this split to write its new rows into
        (``fresh:cache_k_l<a>``: the fresh-rows schedule, one-stream windows, a row at its cell), or None. Pure."""
        if j >= self.model.n_attn:
            return None
        a = self.model.attn_layers[j]
        k, v = bindings.get(fresh(cache_input("k", a))), bindings.get(fresh(cache_input("v", a)))
        return (k, v) if k is not None and v is not None else None

    def _store_of(self, resident: Binding | None, j: int) -> tuple[Binding, Binding] | None:
        """Where attention layer ``j``'s K and V blocks lie in the device's KV buffer (``resident:cache``), or None
        when the device keeps none or keeps only layers below ``j`` (a --kv-gpu-layers prefix): its rows then reach
        the host cache through a CPU split. Pure."""
        if resident is None or j >= self.model.n_attn:
            return None
        buf, off, nbytes = resident
        lay, cells = self.layout, self.layout.cells
        if lay.v_offset(j) + cells * self.vb > nbytes:
            return None
        return (buf, off + lay.k_offset(j), cells * self.kb), (buf, off + lay.v_offset(j), cells * self.vb)

    # ----------------------------------------------------------- results

    def step_hashes(self, seq: int | None = None) -> list[str]:
        """sha256 (hex) of each step's float32 logits: of every sequence, or of sequence ``seq``. Blocks on a GPU."""
        rows = slice(None) if seq is None else seq
        logits = self.exec.logits() if self.exec is not None else []
        return [hashlib.sha256(np.ascontiguousarray(lg[rows], dtype=np.float32).tobytes()).hexdigest() for lg in logits]

    def tokens(self, seq: int = 0) -> list[int]:
        """The greedy token of sequence ``seq`` at each step. Blocks on a GPU until they are computed."""
        logits = self.exec.logits() if self.exec is not None else []
        return [int(np.argmax(lg[seq])) for lg in logits]

    def output_hash(self) -> str:
        """sha256 (hex) over the per-step hashes: one value for the whole run."""
        return hashlib.sha256("".join(self.step_hashes()).encode()).hexdigest()

    def release(self, backend: Backend) -> None:
        """Free the program's state buffers and its stored weights. Does not block."""
        for buf in self._state:
            backend.free(buf)
        self._state.clear()
        self.store.release(backend, keep=("",))
        self.exec = None


def gpu_program(workload: Workload, xp: Any, store: WeightStore, seed: int = 0, scale: float = 1.0,
                weight_type: str = "q8_0") -> DecodeProgram:
    """The program of a GPU run: the model's sizes times ``scale``, weights and cache made by ``xp``. Does not block."""
    from sim.program.shape import full_size

    m = workload.model
    return DecodeProgram(workload, full_size(seed, scale, m.hidden, m.ffn, m.vocab, weight_type), xp, store)
