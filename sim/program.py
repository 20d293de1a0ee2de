"""The decode program: the real work behind the splits, written once for NumPy and CuPy.

The transport scheduler moves bytes; this module gives those bytes meaning so
that a schedule that races produces a wrong answer. It implements the
scheduler's ``Program`` hook (``sim.scheduler.Program``) as a small
transformer-like model with seeded random weights, shaped from a
``ModelShape`` (K/V row widths exactly the workload's, so every staged byte is
a real cache byte; hidden, FFN and vocabulary capped by ``ProgramConfig`` so CI
runs in seconds). Every numeric operation takes the array module ``xp`` as an
argument (``numpy`` in the functional simulation, ``cupy`` on a GPU) and uses
only operations both offer; this module never imports CuPy.

It decodes the workload's ``n_parallel`` sequences together, one new row each
per graph (the batching schedule of ``Workload.writes`` and of
``sim.functional``): every activation is one row per sequence, in sequence
order. One decode token, split by split (``sim.graph`` builds the splits):

* **GPU split 0** (``attn_layer < 0``): embeds each sequence's current token
  (kept on the device, never read by the host), runs its non-attention layers,
  and projects the new K and V rows of the first attention layer. Rows are
  *encoded in the cache type* (f32, f16, bf16 or q8_0: 34 B per 32 elements, an
  f16 scale and 32 int8; q8_0 is quantized here, on the device, because the
  device->host copy the graph prescribes carries exactly one cache-type row
  per sequence) and written to the device ``io`` buffer: the K rows of all
  sequences from byte 0, then their V rows.
* **CPU split** (``kind == "cpu"``): the scheduler copied those rows back into
  the host ``io`` buffer (bindings ``k_cur_l<a>`` / ``v_cur_l<a>``); the split
  writes each sequence's row into the host cache row it names
  (``cache:k_cur_l<a>``, or ``cache:k_cur_l<a>#<t>`` for sequence t of
  several). This is the write that a delivery of the same rows must not
  overtake.
* **Attention split** (``attn_layer = a``): reads layer ``a``'s K and V window
  from its binding ``window:cache_k_l<a>`` / ``window:cache_v_l<a>`` (with
  several streams, stream s at ``window:cache_k_l<a>#<s>``) -- a ring slot when
  pipelined, the graph's own memory when ordered. Each sequence decodes only
  its own rows 0..position -- the cells ``sim.sequences`` assigns it: its
  stream's window over a split cache, its prompt block and interleaved rows
  over a unified one (llama.cpp's per-sequence KQ mask) -- and runs softmax
  attention (grouped heads) for its query, then the following non-attention
  layers, then the next attention layer's K/V rows into ``io``; the last split
  computes the logits of every sequence, records them and stores each
  sequence's greedy next token on the device.

Bindings (``name -> (buffer, byte offset, nbytes)``), as the scheduler passes
them: ``window:<staged input>`` (read), ``small:<ordered input>`` (read, not
used by this model), ``io`` (the device's io buffer, written), and for a CPU
split ``<ordered input>`` (host io rows, read) with ``cache:<ordered input>``
(host cache rows, written). Each sequence's position -- which of its rows are
valid -- is a kernel argument taken from the row the CPU split writes for it.

State (hidden vectors, current tokens, logits) and weights live in device
buffers allocated through ``backend.alloc`` on device 0, so the same code holds
on a GPU. Run callables are called at enqueue time on a GPU and at completion
time on the SimPy machine; they capture only constants (positions, offsets),
never values another callable computes, so both orders give the same result.

``setup`` fills each sequence's rows of the host cache (0..``prefill_rows``)
with deterministic content keyed by (seed, layer, K/V, sequence): every
sequence has its own prompt, so a read of another sequence's cells changes
the output. ``host_update_run(graph)`` writes ``graph.host_writes_at_start``
(cells reused after a context shift or a sequence reset: new rows) with
content keyed by (seed, token, first cell), the same at every depth. Per-step
output: ``step_hashes()`` (sha256 of each step's float32 logits of all
sequences; ``step_hashes(s)``: of sequence s), ``tokens(s)`` (greedy tokens
of sequence s) and ``output_hash()`` (sha256 over the step hashes); call them
after the run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from backends.base import Backend, Buffer
from sim.graph import CacheLayout, DecodeGraph, Split, layout_of
from sim.sequences import CellSlice, SequenceCells
from sim.workload import CacheType, Workload

Binding = tuple[Buffer, int, int]
PROGRAM_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0")
RunFn = Callable[[Any], None]


@dataclass(frozen=True)
class ProgramConfig:
    """Sizes and seed of the decode program. Caps apply to hidden/FFN/vocab only (K/V rows are the workload's)."""

    seed: int = 0
    max_hidden: int = 64
    max_ffn: int = 128
    max_vocab: int = 256
    prefill_rows: int = -1  # rows of every sequence (every layer) filled by setup; -1: every cell

    def __post_init__(self) -> None:
        for name in ("max_hidden", "max_ffn", "max_vocab"):
            if getattr(self, name) < 2:
                raise ValueError(f"ProgramConfig.{name} must be >= 2, got {getattr(self, name)}")


# --------------------------------------------------------------- cache codecs


def encode_rows(xp: Any, x: Any, ctype: CacheType) -> Any:
    """Encode float32 rows ``x`` (rows, elems) into cache bytes (rows, row_bytes) uint8. Does not block."""
    rows, elems = x.shape
    if ctype.name == "f32":
        return xp.ascontiguousarray(x.astype(xp.float32)).view(xp.uint8).reshape(rows, -1)
    if ctype.name == "f16":
        return xp.ascontiguousarray(x.astype(xp.float16)).view(xp.uint8).reshape(rows, -1)
    if ctype.name == "bf16":
        u = xp.ascontiguousarray(x.astype(xp.float32)).view(xp.uint32) >> 16
        return xp.ascontiguousarray(u.astype(xp.uint16)).view(xp.uint8).reshape(rows, -1)
    if ctype.name == "q8_0":
        b = x.reshape(-1, 32).astype(xp.float32)
        d = xp.abs(b).max(axis=1) / 127.0
        q = xp.rint(b / xp.maximum(d, 1e-30)[:, None]).astype(xp.int8)
        out = xp.empty((b.shape[0], 34), dtype=xp.uint8)
        out[:, :2] = xp.ascontiguousarray(d.astype(xp.float16)).view(xp.uint8).reshape(-1, 2)
        out[:, 2:] = q.view(xp.uint8)
        return out.reshape(rows, -1)
    raise ValueError(f"the decode program supports cache types f32, f16, bf16, q8_0; got {ctype.name}")


def decode_rows(xp: Any, raw: Any, ctype: CacheType, elems: int) -> Any:
    """Decode cache bytes (rows, row_bytes) uint8 into float32 rows (rows, elems). Does not block."""
    rows = raw.shape[0]
    raw = xp.ascontiguousarray(raw)
    if ctype.name == "f32":
        return raw.view(xp.float32).reshape(rows, elems)
    if ctype.name == "f16":
        return raw.view(xp.float16).astype(xp.float32).reshape(rows, elems)
    if ctype.name == "bf16":
        u = raw.view(xp.uint16).astype(xp.uint32) << 16
        return u.view(xp.float32).reshape(rows, elems)
    if ctype.name == "q8_0":
        blocks = raw.reshape(-1, 34)
        d = xp.ascontiguousarray(blocks[:, :2]).view(xp.float16).astype(xp.float32)
        q = xp.ascontiguousarray(blocks[:, 2:]).view(xp.int8).astype(xp.float32)
        return (q * d).reshape(rows, elems)
    raise ValueError(f"the decode program supports cache types f32, f16, bf16, q8_0; got {ctype.name}")


def _to_host(a: Any) -> np.ndarray:
    """A host NumPy copy of ``a`` (a CuPy array has ``.get()``). Blocks on a GPU until ``a`` is computed."""
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


# ------------------------------------------------------------------ program


class DecodeProgram:
    """A seeded small transformer behind the decode graph's splits (the scheduler's ``Program``)."""

    def __init__(self, workload: Workload, config: ProgramConfig | None = None, xp: Any = None) -> None:
        self.wl = workload
        self.cfg = config or ProgramConfig()
        self.xp = xp if xp is not None else np
        m = workload.model
        self.model = m
        self.layout: CacheLayout = layout_of(workload)
        self.seqs: SequenceCells = workload.sequence_cells
        self.n_seq = workload.n_parallel
        self.hidden = min(m.hidden, self.cfg.max_hidden)
        self.ffn = min(max(m.ffn, 2), self.cfg.max_ffn)
        self.vocab = min(max(m.vocab, 2), self.cfg.max_vocab)
        self.group = m.n_head // m.n_head_kv
        self.kb, self.vb = workload.k_row_bytes, workload.v_row_bytes
        self._w: dict[str, Any] = {}
        self._bufs: list[Buffer] = []
        self._rows: dict[int, dict[int, int]] = {}  # attention index -> sequence -> row written this token (kernel argument)
        self._logits: list[Any] = []
        self.host_cache: Buffer | None = None

    # ---------------------------------------------------------- setup

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every weight matrix."""
        m, h = self.model, self.hidden
        shapes: dict[str, tuple[int, ...]] = {"embed": (self.vocab, h), "out": (h, self.vocab)}
        for layer in range(m.n_layers):
            shapes[f"up{layer}"] = (h, self.ffn)
            shapes[f"down{layer}"] = (self.ffn, h)
        for j in range(m.n_attn):
            shapes[f"wq{j}"] = (h, m.n_head * m.head_dim_k)
            shapes[f"wk{j}"] = (h, m.k_elems)
            shapes[f"wv{j}"] = (h, m.v_elems)
            shapes[f"wo{j}"] = (m.n_head * m.head_dim_v, h)
        return shapes

    @property
    def state_shape(self) -> tuple[int, int]:
        """One row per sequence: its hidden vector, then its current token (as a float, exact below 2**24)."""
        return (self.n_seq, self.hidden + 1)

    def setup(self, backend: Backend, host_cache: Buffer) -> None:
        """Allocate and upload weights and state on device 0; fill the host cache. Blocks for the upload."""
        self.host_cache = host_cache
        rng = np.random.RandomState(self.cfg.seed)
        for name, shape in self.weight_shapes().items():
            scale = 1.0 if name == "embed" else 1.0 / np.sqrt(shape[0])
            self._w[name] = self._upload(backend, name, (rng.standard_normal(shape) * scale).astype(np.float32))
        self._w["state"] = self._upload(backend, "state", np.zeros(self.state_shape, np.float32))
        self.reset()
        if host_cache.array is not None:
            for seq in range(self.n_seq):
                cap = self.seqs.capacity(seq)
                rows = cap if self.cfg.prefill_rows < 0 else min(self.cfg.prefill_rows, cap)
                for j in range(self.model.n_attn):
                    for kv in (0, 1):
                        self._write_prompt(host_cache.array, j, kv, seq, rows)

    def reset(self) -> None:
        """Zero the hidden states, give every sequence the first token, forget the results. Does not block."""
        self._logits = []
        self._rows = {}
        state = self._w.get("state")
        if state is not None:
            state[...] = 0
            state[:, self.hidden] = self.cfg.seed % self.vocab

    def _upload(self, backend: Backend, name: str, host: np.ndarray) -> Any:
        buf = backend.alloc(0, max(host.nbytes, 1), f"prog_{name}")
        self._bufs.append(buf)
        if buf.array is None:
            return None
        buf.array[: host.nbytes] = self.xp.asarray(host.view(np.uint8).reshape(-1))
        return buf.array[: host.nbytes].view(self.xp.float32).reshape(host.shape)

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

    def _write_prompt(self, cache: np.ndarray, j: int, kv: int, seq: int, rows: int) -> None:
        """Rows 0..rows of sequence ``seq`` (its prompt and beyond), keyed by (seed, layer, kv, sequence)."""
        enc, block = self._rows_content(kv, rows, [self.cfg.seed, 0, j, kv, seq]), self._block(cache, j, kv)
        cps, i = self.layout.cells_per_stream, 0
        for sl in self.seqs.cells_of(seq, rows):
            base = sl.stream * cps
            block[base + sl.start : base + sl.stop : sl.step] = enc[i : i + len(sl)]
            i += len(sl)

    def _write_cells(self, cache: np.ndarray, j: int, kv: int, row0: int, row1: int, token: int) -> None:
        """Deterministic content of cells row0..row1 (of all streams) of layer j's K or V, keyed by (seed, token, cell)."""
        if row1 > row0:
            self._block(cache, j, kv)[row0:row1] = self._rows_content(kv, row1 - row0, [self.cfg.seed, token + 1, j, kv, row0])

    def host_update_run(self, graph: DecodeGraph) -> RunFn:
        """The run of the graph-start host writes: rewrite the named cells (row-aligned ranges) with fresh content."""
        regions = [self._region(o, n) for o, n in graph.host_writes_at_start]

        def run(xp: Any) -> None:
            assert self.host_cache is not None
            for j, kv, r0, r1 in regions:
                self._write_cells(self.host_cache.array, j, kv, r0, r1, token=graph.token)

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
            src = bindings.get(inp.name)
            for t, (_, nbytes) in enumerate(inp.rows):
                dst = bindings.get(f"cache:{inp.name}" if len(inp.rows) == 1 else f"cache:{inp.name}#{t}")
                if src is not None and dst is not None:
                    moves.append((src[0], src[1] + t * nbytes, dst, nbytes))
        lay = self.layout
        k_rows = [(j, (off - lay.k_offset(j)) // self.kb) for j, off in split.row_writes if off < lay.v_offset(j)]
        for j, _ in k_rows:
            self._rows[j] = {}
        for j, cell in k_rows:  # which sequence's row each new K row is
            seq, row = self.seqs.owner(*divmod(cell, lay.cells_per_stream))
            self._rows[j][seq] = row

        def run(xp: Any) -> None:
            for sb, so, (db, do, _), n in moves:
                db.array[do : do + n] = sb.array[so : so + n]

        return run

    def gpu_run(self, split: Split, bindings: dict[str, Binding]) -> RunFn | None:
        """A GPU split: attention of ``split.attn_layer`` (if any), its layers, next K/V rows or the logits."""
        m, h = self.model, self.hidden
        attn = m.attn_layers.index(split.attn_layer) if split.attn_layer >= 0 else -1
        reads = self._reads(attn, split.attn_layer, bindings) if attn >= 0 else []
        ffn_layers = [layer for layer in split.layers if layer not in m.attn_layers or layer == split.attn_layer]
        nxt = attn + 1
        io = bindings.get("io")

        def run(xp: Any) -> None:
            w = self._w
            state = w["state"]
            if attn < 0:
                x = xp.take(w["embed"], state[:, h].astype(xp.int32), axis=0)
            else:
                x = state[:, :h] + self._attention(xp, attn, state[:, :h], reads)
            for layer in ffn_layers:
                x = x + xp.tanh(_norm(xp, x) @ w[f"up{layer}"]) @ w[f"down{layer}"]
            if nxt < m.n_attn:
                assert io is not None
                self._store_kv(xp, nxt, x, io)
            else:
                logits = _norm(xp, x) @ w["out"]
                self._logits.append(logits.copy())
                state[:, h] = xp.argmax(logits, axis=-1).astype(xp.float32)
            state[:, :h] = x

        return run

    def _reads(self, j: int, layer: int, bindings: dict[str, Binding]) -> list[list[tuple[Binding, Binding, CellSlice]]]:
        """Per sequence, the window slices its attention reads: its own rows 0..position (the KQ mask)."""
        rows = self._rows.get(j, {})
        if sorted(rows) != list(range(self.n_seq)):
            raise ValueError(f"layer {layer}: the decode program needs one new row per sequence, got sequences {sorted(rows)}")
        several = self.layout.n_streams > 1
        out = []
        for seq in range(self.n_seq):
            reads = []
            for sl in self.seqs.cells_of(seq, rows[seq] + 1):
                k, v = (bindings[f"window:cache_{kv}_l{layer}" + (f"#{sl.stream}" if several else "")] for kv in "kv")
                if sl.stop * self.kb > k[2] or sl.stop * self.vb > v[2]:
                    raise ValueError(f"window of layer {layer} holds {k[2] // self.kb} rows, sequence {seq} needs {sl.stop}")
                reads.append((k, v, sl))
            out.append(reads)
        return out

    def _store_kv(self, xp: Any, j: int, x: Any, io: Binding) -> None:
        """The new K rows of every sequence from byte 0 of ``io``, then their V rows."""
        buf, off, _ = io
        xn = _norm(xp, x)
        k = encode_rows(xp, xn @ self._w[f"wk{j}"], self.wl.cache_k).reshape(-1)
        v = encode_rows(xp, xn @ self._w[f"wv{j}"], self.wl.cache_v).reshape(-1)
        buf.array[off : off + k.size] = k
        buf.array[off + k.size : off + k.size + v.size] = v

    def _attention(self, xp: Any, j: int, x: Any, reads: list[list[tuple[Binding, Binding, CellSlice]]]) -> Any:
        """Each sequence's attention over the cells it reads; one output row per sequence."""
        m = self.model
        q = (_norm(xp, x) @ self._w[f"wq{j}"]).reshape(self.n_seq, m.n_head_kv, self.group, m.head_dim_k)
        outs = []
        for seq, slices in enumerate(reads):
            k = xp.concatenate([self._cells(xp, kb, sl, self.kb, self.wl.cache_k, m.k_elems) for kb, _, sl in slices])
            v = xp.concatenate([self._cells(xp, vb, sl, self.vb, self.wl.cache_v, m.v_elems) for _, vb, sl in slices])
            rows = k.shape[0]
            kt = xp.ascontiguousarray(k.reshape(rows, m.n_head_kv, m.head_dim_k).transpose(1, 2, 0))  # (kv, d, rows)
            scores = (q[seq] @ kt) / np.float32(np.sqrt(m.head_dim_k))  # (kv, group, rows)
            scores = scores - scores.max(axis=-1, keepdims=True)
            p = xp.exp(scores)
            p = p / p.sum(axis=-1, keepdims=True)
            out = p @ xp.ascontiguousarray(v.reshape(rows, m.n_head_kv, m.head_dim_v).transpose(1, 0, 2))  # (kv, group, dv)
            outs.append(out.reshape(-1))
        return xp.stack(outs) @ self._w[f"wo{j}"]

    @staticmethod
    def _cells(xp: Any, win: Binding, sl: CellSlice, rb: int, ctype: CacheType, elems: int) -> Any:
        """The cells ``sl`` of a window binding (rows of ``rb`` bytes), decoded to float32."""
        buf, off, n = win
        return decode_rows(xp, buf.array[off : off + n].reshape(n // rb, rb)[sl.start : sl.stop : sl.step], ctype, elems)

    # ----------------------------------------------------------- results

    def step_hashes(self, seq: int | None = None) -> list[str]:
        """sha256 (hex) of each step's float32 logits: of every sequence, or of sequence ``seq``. Blocks on a GPU."""
        rows = slice(None) if seq is None else seq
        return [hashlib.sha256(_to_host(lg)[rows].astype(np.float32).tobytes()).hexdigest() for lg in self._logits]

    def tokens(self, seq: int = 0) -> list[int]:
        """The greedy token of sequence ``seq`` at each step. Blocks on a GPU until they are computed."""
        return [int(np.argmax(_to_host(lg)[seq])) for lg in self._logits]

    def output_hash(self) -> str:
        """sha256 (hex) over the per-step hashes: one value for the whole run."""
        return hashlib.sha256("".join(self.step_hashes()).encode()).hexdigest()

    def release(self, backend: Backend) -> None:
        """Free the program's device buffers. Does not block."""
        for buf in self._bufs:
            backend.free(buf)
        self._bufs.clear()


def _norm(xp: Any, x: Any) -> Any:
    """RMS norm of each row (float32)."""
    return x / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + np.float32(1e-6))
