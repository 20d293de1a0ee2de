"""The CUDA executor: each GPU split's kernels captured once as a CUDA graph, replayed with one launch.

The kernels (``kernels.cu``) are compiled once per program shape with NVRTC,
the shape as compile-time constants. A split's work -- the embedding or the
attention over the delivered window (fused dequantize + grouped-query
attention, split over the window, then merged), the FFN layers (fused RMS
norm + SwiGLU matrix-vector products on the stored q8_0/f16 weights), then
the next layer's K/V rows encoded in the cache type, or the logits, the greedy
token and the step's record -- is 4 to 8 + 2 per FFN layer kernels on the
executor's own stream, captured with ``Stream.begin_capture`` (CuPy refuses
cuBLAS inside a capture, so no CuPy array operation appears here).

A graph is keyed by the device addresses its plan touches (window slots, io,
graph inputs) and the number of window chunks; everything that changes with
the token is read from device memory by the kernels: the cells each sequence
attends (the graph inputs the scheduler copies with split 0), the current
tokens, the step counter. So a growing window re-captures only when its chunk
count doubles or its slot moves, and a token's host cost per split is one
graph launch (plus, once per token, nothing else).

Units: bytes and element counts; nothing here measures time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sim.program.codecs import TYPE_CODES
from sim.program.plan import PARAM_INTS, SplitPlan
from sim.program.shape import ProgramShape

SOURCE = Path(__file__).with_name("kernels.cu")
NWARP = 4
ROWS_PER_CHUNK = 128  # window rows a flash-decoding chunk takes before the window is split further
BLOCKS_PER_SM = 8
MAX_SEQ = 8
KERNELS = ("attn_partial", "attn_reduce", "mv_norm", "mv_resid", "mv_glu_norm", "embed", "encode_kv", "argmax_record", "bump")


def _ptr(a: Any) -> int:
    return int(a.data.ptr)


def _addr(binding: Any) -> int:
    buf, off, _ = binding
    return _ptr(buf.array) + int(off)


class CudaExecutor:
    """The decode program as CUDA graphs on CuPy arrays (one device)."""

    name = "cuda"

    def __init__(self, shape: ProgramShape, cp: Any) -> None:
        if shape.n_seq > MAX_SEQ:
            raise ValueError(f"the CUDA executor decodes up to {MAX_SEQ} sequences, got {shape.n_seq}")
        if shape.dk % 32 or shape.dv % 32:
            raise ValueError(f"the CUDA executor needs head dims in multiples of 32, got {shape.dk}/{shape.dv}")
        self.s, self.cp = shape, cp
        s = shape
        opts = ("-std=c++17", f"-DDK={s.dk}", f"-DDV={s.dv}", f"-DG={s.group}", f"-DNKV={s.n_kv}",
                f"-DKTYPE={TYPE_CODES[s.cache_k.name]}", f"-DVTYPE={TYPE_CODES[s.cache_v.name]}",
                f"-DWTYPE={TYPE_CODES[s.weight_type]}", f"-DKROW={s.kb}", f"-DVROW={s.vb}", f"-DMAXSEQ={s.n_seq}",
                f"-DPARAM_INTS={PARAM_INTS}")
        self.module = cp.RawModule(code=SOURCE.read_text(), options=opts)
        self.k = {name: self.module.get_function(name) for name in KERNELS}  # loads the module before any capture
        sms = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["multiProcessorCount"]
        self.max_chunks = max(1, sms * BLOCKS_PER_SM // (s.n_kv * s.n_seq))
        self.cap_stream = cp.cuda.Stream(non_blocking=True)
        self.graphs: dict[tuple[Any, ...], tuple[Any, Any]] = {}
        self.w: dict[str, Any] = {}
        self._bufs: dict[str, Any] = {}

    # ------------------------------------------------------------- state

    def bind(self, weights: dict[str, Any], x: Any, tok: Any, step: Any) -> None:
        """Use the stored ``weights`` (name -> device rows of bytes) and the state arrays. Allocates scratch. Blocks."""
        cp, s = self.cp, self.s
        self.w, self.x, self.tok, self.step = weights, x, tok, step
        f32 = cp.float32
        self._bufs = {
            "q": cp.zeros((s.n_seq, s.n_head * s.dk), f32),
            "attn": cp.zeros((s.n_seq, s.n_head * s.dv), f32),
            "part": cp.zeros(s.n_seq * s.n_kv * self.max_chunks * s.group * (s.dv + 2), f32),
            "h": cp.zeros((s.n_seq, s.ffn), f32),
            "kv": cp.zeros((s.n_seq, s.k_elems + s.v_elems), f32),
            "logits": cp.zeros((s.n_seq, s.vocab), f32),
            "hist": cp.zeros((s.max_steps, s.n_seq, s.vocab), f32),
        }
        cp.cuda.runtime.deviceSynchronize()

    def reset(self, token: int) -> None:
        """Zero the hidden states, give every sequence ``token``, zero the step counter. Blocks until done."""
        self.x[...] = 0
        self.tok[...] = token
        self.step[...] = 0
        self.cp.cuda.runtime.deviceSynchronize()

    def logits(self) -> list[np.ndarray]:
        """Each recorded step's logits (sequences, vocab) float32 on the host. Blocks until they are computed."""
        self.cp.cuda.runtime.deviceSynchronize()
        n = int(self.step.get()[0])
        if n > self.s.max_steps:
            raise ValueError(f"the program ran {n} steps; its logit record holds {self.s.max_steps}")
        return list(self._bufs["hist"][:n].get())

    # ------------------------------------------------------------ splits

    def split(self, plan: SplitPlan) -> Any:
        """The run callable of one GPU split: launch its graph (captured on first use) on the current stream."""
        nchunk = self._chunks(plan)
        key = (plan.index, plan.embed, plan.attn, plan.ffn_layers, plan.next_kv, _addr(plan.io),
               _addr(plan.inputs) if plan.inputs else 0, tuple((_addr(k), _addr(v)) for k, v in plan.windows), nchunk,
               tuple(_addr(b) for b in plan.store) if plan.store else ())

        def run(cp: Any) -> None:
            entry = self.graphs.get(key)
            if entry is None:
                entry = self.graphs[key] = self._capture(plan, nchunk)
            entry[0].launch(cp.cuda.get_current_stream())

        return run

    def _chunks(self, plan: SplitPlan) -> int:
        """Chunks of the flash-decoding split: a power of two from the window's capacity, capped by the device."""
        if plan.attn < 0:
            return 0
        rows = max(k[2] // self.s.kb for k, _ in plan.windows)
        want = -(-rows // ROWS_PER_CHUNK)
        return max(1, min(1 << max(0, (want - 1).bit_length()), self.max_chunks))

    def _capture(self, plan: SplitPlan, nchunk: int) -> tuple[Any, Any]:
        """Capture the split's kernels on the executor's stream; returns (graph, the arrays it points at). Blocks."""
        cp, st = self.cp, self.cap_stream
        ptrs = None
        if plan.attn >= 0:
            ptrs = cp.asarray(np.array([[_addr(k) for k, _ in plan.windows], [_addr(v) for _, v in plan.windows]], np.uint64))
        cp.cuda.runtime.deviceSynchronize()
        st.begin_capture()
        try:
            self._enqueue(plan, nchunk, ptrs, st)
        finally:
            graph = st.end_capture()
        return graph, ptrs

    def _enqueue(self, plan: SplitPlan, nchunk: int, ptrs: Any, st: Any) -> None:
        s, k, b, w = self.s, self.k, self._bufs, self.w
        n, h, i32 = s.n_seq, s.hidden, np.int32

        def mv(kern: str, wname: str, x: Any, y: Any, cols: int, rows: int) -> None:
            k[kern](((rows + 3) // 4,), (128,), (w[wname], x, y, i32(cols), i32(rows), i32(n)), stream=st)

        if plan.embed:
            k["embed"]((n,), (256,), (w["embed"], self.tok, self.x, i32(h)), stream=st)
        if plan.attn >= 0:
            j = plan.attn
            assert plan.inputs is not None
            mv("mv_norm", f"wq{j}", self.x, b["q"], h, s.n_head * s.dk)
            smem = NWARP * s.group * (s.dv + 2) * 4
            k["attn_partial"]((s.n_kv, nchunk, n), (NWARP * 32,),
                              (ptrs[0], ptrs[1], np.uint64(_addr(plan.inputs)), b["q"], b["part"], i32(nchunk)),
                              stream=st, shared_mem=smem)
            k["attn_reduce"]((s.n_head, n), (min(s.dv, 256),), (b["part"], b["attn"], i32(nchunk)), stream=st)
            mv("mv_resid", f"wo{j}", b["attn"], self.x, s.n_head * s.dv, h)
        for layer in plan.ffn_layers:
            mv("mv_glu_norm", f"gu{layer}", self.x, b["h"], h, s.ffn)
            mv("mv_resid", f"down{layer}", b["h"], self.x, s.ffn, h)
        if plan.next_kv >= 0:
            mv("mv_norm", f"wkv{plan.next_kv}", self.x, b["kv"], h, s.k_elems + s.v_elems)
            blocks = n * (s.k_elems + s.v_elems) // 32
            kres, vres = (np.uint64(_addr(x)) for x in plan.store) if plan.store else (np.uint64(0), np.uint64(0))
            assert plan.inputs is not None
            k["encode_kv"](((blocks + 127) // 128,), (128,), (b["kv"], np.uint64(_addr(plan.io)), i32(n), kres, vres,
                                                             np.uint64(_addr(plan.inputs)), i32(s.cells_per_stream)), stream=st)
        else:
            mv("mv_norm", "out", self.x, b["logits"], h, s.vocab)
            k["argmax_record"]((n,), (1024,), (b["logits"], self.tok, b["hist"], self.step, i32(s.vocab), i32(s.max_steps),
                                               i32(n)), stream=st)
            k["bump"]((1,), (1,), (self.step,), stream=st)
