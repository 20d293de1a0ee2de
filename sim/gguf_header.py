"""A GGUF file's header: its metadata values and its tensors' sizes, without its tokenizer's strings.

The ``gguf`` package's ``GGUFReader`` builds a NumPy view for every element of every array, which on a Llama-3 file
(128,256 tokens, 280,147 merges: ~3.2 M views) takes ~15 s before the first field can be read; a plan names its model
once per grid, so a three-context plan of a real GGUF took 95 s. This reader walks the same layout with ``struct``
over a memory map, using the package's own tables (value types, the quantisation block sizes), and keeps of a string
array only its length: ~0.1-0.2 s on that file (README "Dependencies"; docs/performance.md "Round 24").
``tests/sim/test_gguf_header.py`` holds it to ``GGUFReader`` field by field and tensor by tensor.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GGUFHeader", "StringArray", "TensorInfo", "read_header"]

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
#: struct codes of GGUF's scalar value types (``gguf.GGUFValueType``'s numbers).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class StringArray:
    """An array of strings whose contents were skipped (a tokenizer's tokens, merges): its length only."""

    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry: name, element count and bytes in the file (llama.cpp's type and block size)."""

    name: str
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """The metadata (``key -> value``: int, float, bool, str, a list of numbers or strings, or :class:`StringArray`)
    and the tensors, in file order."""

    fields: dict[str, Any]
    tensors: tuple[TensorInfo, ...]


class _Cursor:
    def __init__(self, buf: Any, order: str) -> None:
        self.buf, self.order, self.at, self.size = buf, order, 0, len(buf)

    def need(self, n: int) -> None:
        if n < 0 or self.at + n > self.size:
            raise ValueError(f"the header runs past the end of the file ({self.size:,} B) at byte {self.at:,}")

    def unpack(self, code: str) -> Any:
        fmt = self.order + code
        n = struct.calcsize(fmt)
        self.need(n)
        (v,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += n
        return v

    def string(self) -> str:
        n = self.unpack("Q")
        self.need(n)
        s = bytes(self.buf[self.at:self.at + n]).decode("utf-8", errors="replace")
        self.at += n
        return s

    def skip_strings(self, count: int) -> None:
        if count > (self.size - self.at) // 8:  # each string is at least its 8-byte length
            self.need(count * 8)
        unpack, order = struct.unpack_from, self.order + "Q"
        for _ in range(count):
            (n,) = unpack(order, self.buf, self.at)
            self.at += 8 + n
            if self.at > self.size:
                self.need(0)

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, count = self.unpack("I"), self.unpack("Q")
            if itype in _SCALARS:
                fmt = f"{self.order}{count}{_SCALARS[itype]}"
                self.need(count * struct.calcsize(self.order + _SCALARS[itype]))
                values = list(struct.unpack_from(fmt, self.buf, self.at))
                self.at += struct.calcsize(fmt)
                return values
            if itype == _STRING:
                if count <= 64:
                    return [self.string() for _ in range(count)]
                self.skip_strings(count)
                return StringArray(count)
            if itype == _ARRAY:
                if count > (self.size - self.at) // 12:  # each inner array is at least its type and count
                    self.need(count * 12)
                return [self.value(_ARRAY) for _ in range(count)]
            raise ValueError(f"unknown array item type {itype}")
        raise ValueError(f"unknown value type {vtype}")


def read_header(path: str | Path) -> GGUFHeader:
    """The header of the GGUF file at ``path`` (reads it through a memory map; blocks on the read, ~0.1-0.2 s for a
    128k-token vocabulary). Raises ValueError naming what is wrong (bad magic or version, a field or tensor running
    past the end of the file, a duplicate key or tensor, an unknown value or tensor type); OSError if it cannot be
    opened."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f:
        if Path(path).stat().st_size == 0:
            raise ValueError("the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != _MAGIC:
                raise ValueError("GGUF magic invalid")
            cur = _Cursor(buf, "<")
            cur.at = 4
            version = cur.unpack("I")
            if version & 0xFFFF == 0:  # written for the other byte order, as GGUFReader reads it
                cur.order, cur.at = ">", 4
                version = cur.unpack("I")
            if version not in _VERSIONS:
                raise ValueError(f"GGUF version {version}; allowed: {', '.join(map(str, _VERSIONS))}")
            n_tensors, n_kv = cur.unpack("Q"), cur.unpack("Q")
            fields: dict[str, Any] = {}
            for _ in range(n_kv):
                key = cur.string()
                if key in fields:
                    raise ValueError(f"duplicate key {key}")
                fields[key] = cur.value(cur.unpack("I"))
            infos = []
            for _ in range(n_tensors):
                name = cur.string()
                n_dims = cur.unpack("I")
                cur.need(8 * n_dims)
                dims = struct.unpack_from(f"{cur.order}{n_dims}Q", buf, cur.at)
                cur.at += 8 * n_dims
                raw_type, offset = cur.unpack("I"), cur.unpack("Q")
                infos.append((name, dims, raw_type, offset))
            align = fields.get("general.alignment", 32)
            if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
                raise ValueError(f"general.alignment {align!r}; allowed: a power of two")
            data_start = -(-cur.at // align) * align
            size = len(buf)
    tensors, names = [], set()
    for name, dims, raw_type, offset in infos:
        if name in names:
            raise ValueError(f"duplicate tensor {name}")
        names.add(name)
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(raw_type)]
        except (ValueError, KeyError):
            raise ValueError(f"tensor {name}: unknown type {raw_type}") from None
        n = 1
        for d in dims:
            n *= int(d)
        n_bytes = n * type_size // block
        if data_start + offset + n_bytes > size:
            raise ValueError(f"tensor {name}'s data runs past the end of the file ({size:,} B)")
        tensors.append(TensorInfo(name, n, n_bytes))
    return GGUFHeader(fields, tuple(tensors))
