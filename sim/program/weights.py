"""The decode program's weights: which matrices, their GGUF-style storage, and how they are drawn.

Every matrix is stored as GGUF stores a weight tensor: ``rows`` output rows of
``cols`` input elements, each row whole blocks of the weight type (``q8_0``:
34 B per 32 elements; ``f16``: 2 B per element). Per layer a SwiGLU FFN
(``gu<l>``: the gate rows then the up rows, ``down<l>``); per attention layer
``wq<j>``, ``wkv<j>`` (the K rows then the V rows) and ``wo<j>``; and the
token embedding and output head, one row per vocabulary entry.

Weights are drawn where the executor computes (NumPy on the host, CuPy on the
device: a GPU would wait minutes for the host's generator at full size): a
normal matrix of standard deviation ``1 / sqrt(cols)`` (every matrix is
applied to an RMS-normed input), encoded by the cache codecs' q8_0 or f16. Only their determinism matters: the exactness gate runs
every depth on the same weights, and the executors' agreement test uploads one
set to both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.program.codecs import encode_rows
from sim.workload import CACHE_TYPES

WEIGHT_TYPES = ("q8_0", "f16")


def row_bytes(cols: int, wtype: str) -> int:
    """Bytes of one stored row of ``cols`` elements."""
    return cols // 32 * 34 if wtype == "q8_0" else cols * 2


def weight_shapes(n_layers: int, attn: int, hidden: int, ffn: int, vocab: int, q_out: int, kv_out: int,
                  o_in: int) -> dict[str, tuple[int, int]]:
    """Name -> (rows, cols) of every matrix: output rows of input elements."""
    shapes: dict[str, tuple[int, int]] = {"embed": (vocab, hidden), "out": (vocab, hidden)}
    for layer in range(n_layers):
        shapes[f"gu{layer}"] = (2 * ffn, hidden)
        shapes[f"down{layer}"] = (hidden, ffn)
    for j in range(attn):
        shapes[f"wq{j}"] = (q_out, hidden)
        shapes[f"wkv{j}"] = (kv_out, hidden)
        shapes[f"wo{j}"] = (hidden, o_in)
    return shapes


def randn(xp: Any, seed: int, shape: tuple[int, ...]) -> Any:
    """Seeded standard normal float32 numbers made where ``xp`` computes. Blocks on the host for NumPy only."""
    if xp is np:
        return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    return xp.random.RandomState(seed).standard_normal(shape, dtype=xp.float32)


def draw(xp: Any, seed: int, shape: tuple[int, int], wtype: str) -> Any:
    """A (rows, row_bytes) uint8 matrix of ``wtype`` with entries of std ``1/sqrt(cols)``.

    Drawn by ``xp``'s generator from ``seed``. Does not block (CuPy computes asynchronously).
    """
    rows, cols = shape
    if wtype not in WEIGHT_TYPES:
        raise ValueError(f"weight type {wtype!r} not supported; allowed: {', '.join(WEIGHT_TYPES)}")
    w = randn(xp, seed, (rows, cols)) * xp.float32(1.0 / np.sqrt(cols))
    return encode_rows(xp, w, CACHE_TYPES[wtype])


def dequantize(xp: Any, raw: Any, cols: int, wtype: str) -> Any:
    """(rows, cols) float32 from stored rows. Does not block."""
    rows = raw.shape[0]
    if wtype == "q8_0":
        blocks = xp.ascontiguousarray(raw).reshape(rows, cols // 32, 34)
        d = xp.ascontiguousarray(blocks[:, :, :2]).view(xp.float16).astype(xp.float32)
        q = xp.ascontiguousarray(blocks[:, :, 2:]).view(xp.int8).astype(xp.float32)
        return (q * d).reshape(rows, cols)
    return xp.ascontiguousarray(raw).view(xp.float16).astype(xp.float32).reshape(rows, cols)
