"""Cache and weight codecs: float32 rows <-> the bytes a GGUF cache or weight tensor holds.

A *row* is one K or V row of the cache (``n_head_kv * head_dim`` elements) or
one output row of a weight matrix (its input dimension). Rows are encoded in
whole blocks, as ggml lays them out:

* ``f32`` / ``f16`` / ``bf16``: one element after another;
* ``q8_0``: 34 B per 32 elements, an f16 scale ``d = max|x| / 127`` then 32
  int8 ``round(x / d)``;
* ``q4_0``: 18 B per 32 elements, an f16 scale ``d = m / -8`` (``m`` the
  element of largest magnitude, signed) then 16 bytes: element ``i`` in the
  low nibble of byte ``i`` and element ``i + 16`` in its high nibble, each
  stored as ``min(15, int(x / d + 8.5))`` and read back as ``(q - 8) * d``.

Every function takes the array module ``xp`` (NumPy or CuPy) and uses only what
both offer, so the same codec encodes the host cache on the host and on a GPU.
The CUDA kernels (``kernels.cu``) decode the same bytes; a ``gpu`` test keeps
them in agreement. Nothing here blocks except where CuPy computes lazily.
"""

from __future__ import annotations

from typing import Any

from sim.workload import CacheType

#: Cache and weight types the decode program reads and writes (both executors).
PROGRAM_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")
#: Type codes shared with the CUDA kernels (``TYPE_*`` in kernels.cu).
TYPE_CODES = {"f32": 0, "f16": 1, "bf16": 2, "q8_0": 3, "q4_0": 4}


def _refuse(name: str) -> ValueError:
    return ValueError(f"the decode program supports cache types {', '.join(PROGRAM_CACHE_TYPES)}; got {name}")


def encode_rows(xp: Any, x: Any, ctype: CacheType) -> Any:
    """Encode float32 rows ``x`` (rows, elems) into bytes (rows, row_bytes) uint8. Does not block."""
    rows, _ = x.shape
    name = ctype.name
    if name == "f32":
        return xp.ascontiguousarray(x.astype(xp.float32)).view(xp.uint8).reshape(rows, -1)
    if name == "f16":
        return xp.ascontiguousarray(x.astype(xp.float16)).view(xp.uint8).reshape(rows, -1)
    if name == "bf16":
        u = xp.ascontiguousarray(x.astype(xp.float32)).view(xp.uint32) >> 16
        return xp.ascontiguousarray(u.astype(xp.uint16)).view(xp.uint8).reshape(rows, -1)
    if name == "q8_0":
        b = x.reshape(-1, 32).astype(xp.float32)
        d = xp.abs(b).max(axis=1) / xp.float32(127.0)
        inv = xp.where(d > 0, xp.float32(1.0) / xp.where(d > 0, d, xp.float32(1.0)), xp.float32(0.0))
        q = xp.rint(b * inv[:, None]).astype(xp.int8)
        out = xp.empty((b.shape[0], 34), dtype=xp.uint8)
        out[:, :2] = xp.ascontiguousarray(d.astype(xp.float16)).view(xp.uint8).reshape(-1, 2)
        out[:, 2:] = q.view(xp.uint8)
        return out.reshape(rows, -1)
    if name == "q4_0":
        b = x.reshape(-1, 32).astype(xp.float32)
        idx = xp.abs(b).argmax(axis=1)
        m = xp.take_along_axis(b, idx[:, None], axis=1)[:, 0]
        d = m / xp.float32(-8.0)
        inv = xp.where(d != 0, xp.float32(1.0) / xp.where(d != 0, d, xp.float32(1.0)), xp.float32(0.0))
        q = xp.minimum(xp.float32(15.0), xp.floor(b * inv[:, None] + xp.float32(8.5))).astype(xp.uint8)
        out = xp.empty((b.shape[0], 18), dtype=xp.uint8)
        out[:, :2] = xp.ascontiguousarray(d.astype(xp.float16)).view(xp.uint8).reshape(-1, 2)
        out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
        return out.reshape(rows, -1)
    raise _refuse(name)


def decode_rows(xp: Any, raw: Any, ctype: CacheType, elems: int) -> Any:
    """Decode bytes (rows, row_bytes) uint8 into float32 rows (rows, elems). Does not block."""
    rows = raw.shape[0]
    raw = xp.ascontiguousarray(raw)
    name = ctype.name
    if name == "f32":
        return raw.view(xp.float32).reshape(rows, elems)
    if name == "f16":
        return raw.view(xp.float16).astype(xp.float32).reshape(rows, elems)
    if name == "bf16":
        u = raw.view(xp.uint16).astype(xp.uint32) << 16
        return u.view(xp.float32).reshape(rows, elems)
    if name == "q8_0":
        blocks = raw.reshape(-1, 34)
        d = xp.ascontiguousarray(blocks[:, :2]).view(xp.float16).astype(xp.float32)
        q = xp.ascontiguousarray(blocks[:, 2:]).view(xp.int8).astype(xp.float32)
        return (q * d).reshape(rows, elems)
    if name == "q4_0":
        blocks = raw.reshape(-1, 18)
        d = xp.ascontiguousarray(blocks[:, :2]).view(xp.float16).astype(xp.float32)
        qs = blocks[:, 2:]
        q = xp.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(xp.float32) - xp.float32(8.0)
        return (q * d).reshape(rows, elems)
    raise _refuse(name)
