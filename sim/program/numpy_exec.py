"""The reference executor: the decode program's splits computed with the array module, step by step.

It defines what the CUDA kernels (``kernels.cu``) must compute, on the same
bytes: weights as stored (dequantized once), the K/V window decoded from the
cells the graph inputs name, RMS norms applied where the kernels fuse them.
Contractions use ``einsum`` without BLAS, so the result does not depend on a
BLAS library's threads. It runs on NumPy (functional simulation) and on any
module with NumPy's interface (the tests' stand-in for CuPy). A run callable
reads its inputs when it is called: on enqueue on a GPU, at completion on the
SimPy machine; the scheduler's ordering makes both see the same bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.program.codecs import decode_rows, encode_rows
from sim.program.plan import SplitPlan, decode_inputs, new_cell
from sim.program.shape import ProgramShape
from sim.program.weights import dequantize

RunFn = Any


def _to_host(a: Any) -> np.ndarray:
    """A host NumPy copy of ``a`` (a CuPy array has ``.get()``). Blocks on a GPU until ``a`` is computed."""
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


class NumpyExecutor:
    """The decode program on ``xp`` arrays (NumPy, or a module with its interface)."""

    name = "numpy"

    def __init__(self, shape: ProgramShape, xp: Any = np) -> None:
        self.s, self.xp = shape, xp
        self.w: dict[str, Any] = {}
        self.x: Any = None
        self.tok: Any = None
        self.hist: list[Any] = []

    def bind(self, weights: dict[str, Any], x: Any, tok: Any, step: Any) -> None:
        """Use stored ``weights`` (name -> rows of bytes) and the state arrays ``x`` (seq, hidden) and ``tok`` (seq,)."""
        shapes = self.s.weight_shapes()
        self.w = {n: dequantize(self.xp, raw, shapes[n][1], self.s.weight_type) for n, raw in weights.items()}
        self.x, self.tok = x, tok

    def reset(self, token: int) -> None:
        """Zero the hidden states, give every sequence ``token``, forget the logits. Does not block."""
        self.x[...] = 0
        self.tok[...] = token
        self.hist = []

    def logits(self) -> list[np.ndarray]:
        """Each step's logits (sequences, vocab) float32 on the host."""
        return [_to_host(h) for h in self.hist]

    # ------------------------------------------------------------ splits

    def split(self, plan: SplitPlan) -> RunFn:
        """The run callable of one GPU split."""

        def run(xp: Any) -> None:
            x = xp.take(self.w["embed"], self.tok.astype(xp.int64), axis=0) if plan.embed else self.x.copy()
            params = self._params(plan)
            if plan.attn >= 0:
                x = x + self._mv(f"wo{plan.attn}", self._attention(xp, plan, self._mv(f"wq{plan.attn}", x, True), params))
            for layer in plan.ffn_layers:
                gu = self._mv(f"gu{layer}", x, True)
                g, u = gu[:, : self.s.ffn], gu[:, self.s.ffn :]
                x = x + self._mv(f"down{layer}", g / (np.float32(1.0) + xp.exp(-g)) * u)
            if plan.next_kv >= 0:
                kv = self._mv(f"wkv{plan.next_kv}", x, True)
                k = encode_rows(xp, kv[:, : self.s.k_elems], self.s.cache_k).reshape(-1)
                v = encode_rows(xp, kv[:, self.s.k_elems :], self.s.cache_v).reshape(-1)
                buf, off, _ = plan.io
                buf.array[off : off + k.size] = k
                buf.array[off + k.size : off + k.size + v.size] = v
                if plan.store is not None:
                    self._store(plan.store, params, k, v)
            else:
                logits = self._mv("out", x, True)
                self.hist.append(logits.copy())
                self.tok[...] = xp.argmax(logits, axis=-1).astype(self.tok.dtype)
            self.x[...] = x

        return run

    @staticmethod
    def _params(plan: SplitPlan) -> np.ndarray:
        """The graph inputs (sequences, PARAM_INTS) as the device holds them now."""
        assert plan.inputs is not None, "a split before the graph inputs were copied"
        buf, off, n = plan.inputs
        return decode_inputs(_to_host(buf.array[off : off + n]))

    def _store(self, store: tuple[Any, Any], params: np.ndarray, k: Any, v: Any) -> None:
        """Each sequence's new K and V row into the resident cache blocks, at the cell it attends last."""
        s = self.s
        for (buf, off, _), rows, rb in ((store[0], k, s.kb), (store[1], v, s.vb)):
            for seq in range(s.n_seq):
                stream, cell = new_cell(params, seq)
                at = off + (stream * s.cells_per_stream + cell) * rb
                buf.array[at : at + rb] = rows[seq * rb : (seq + 1) * rb]

    def _mv(self, name: str, x: Any, norm: bool = False) -> Any:
        """x @ W.T for every sequence's row; ``norm``: of the RMS-normed x. float32."""
        xp = self.xp
        if norm:
            x = x / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + np.float32(1e-6))
        return xp.einsum("sk,nk->sn", x.astype(xp.float32), self.w[name]).astype(xp.float32)

    def _attention(self, xp: Any, plan: SplitPlan, q: Any, params: np.ndarray) -> Any:
        """Each sequence's grouped-query attention over the cells its graph inputs name. (seq, n_head * dv)."""
        s = self.s
        qh = q.reshape(s.n_seq, s.n_kv, s.group, s.dk)
        outs = []
        for seq, ((kbuf, koff, kn), (vbuf, voff, vn)) in enumerate(plan.windows):
            start0, len0, start1, len1, step1 = (int(v) for v in params[seq, :5])
            cells = np.concatenate([np.arange(start0, start0 + len0), start1 + np.arange(len1) * step1]).astype(np.int64)
            if cells.size and (int(cells.max()) + 1) * s.kb > kn or (int(cells.max()) + 1) * s.vb > vn:
                raise ValueError(f"attention {plan.attn}: the window holds {kn // s.kb} rows, sequence {seq} needs {int(cells.max()) + 1}")
            idx = xp.asarray(cells)
            k = decode_rows(xp, kbuf.array[koff : koff + kn].reshape(-1, s.kb)[idx], s.cache_k, s.k_elems)
            v = decode_rows(xp, vbuf.array[voff : voff + vn].reshape(-1, s.vb)[idx], s.cache_v, s.v_elems)
            k = k.reshape(-1, s.n_kv, s.dk)
            v = v.reshape(-1, s.n_kv, s.dv)
            scores = xp.einsum("hgd,nhd->hgn", qh[seq], k) * np.float32(1.0 / np.sqrt(s.dk))
            scores = scores - scores.max(axis=-1, keepdims=True)
            p = xp.exp(scores)
            p = p / p.sum(axis=-1, keepdims=True)
            outs.append(xp.einsum("hgn,nhd->hgd", p, v).reshape(-1))
        return xp.stack(outs).astype(xp.float32)
