"""sim.gguf_header held to the gguf package's GGUFReader: every field's value (a skipped string array by its length)
and every tensor's name, elements and bytes, over files the package writes (both byte orders, every value type,
several tensor types, a tokenizer of a few thousand tokens); bad files raise ValueError; a model file is read once."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package is a declared dependency")

from sim import gguf_header, model_files  # noqa: E402
from sim.gguf_header import StringArray, read_header  # noqa: E402
from sim.model_files import load_model  # noqa: E402


def _write(path: Path, seed: int, endian: object = None, n_tokens: int = 3000) -> Path:
    rng = random.Random(seed)
    kw = {"endianess": endian} if endian is not None else {}
    w = gguf.GGUFWriter(str(path), "llama", **kw)
    w.add_block_count(4)
    w.add_head_count(8)
    w.add_head_count_kv([2, 0, 2, 2])
    w.add_embedding_length(256)
    w.add_feed_forward_length(512)
    w.add_name(f"model-{seed}")
    w.add_uint8("t.u8", rng.randrange(256))
    w.add_int8("t.i8", rng.randrange(-128, 128))
    w.add_uint16("t.u16", rng.randrange(1 << 16))
    w.add_int16("t.i16", rng.randrange(-(1 << 15), 1 << 15))
    w.add_int32("t.i32", rng.randrange(-(1 << 31), 1 << 31))
    w.add_uint64("t.u64", rng.randrange(1 << 64))
    w.add_int64("t.i64", rng.randrange(-(1 << 63), 1 << 63))
    w.add_float32("t.f32", rng.uniform(-1e6, 1e6))
    w.add_float64("t.f64", rng.uniform(-1e300, 1e300))
    w.add_bool("t.bool", rng.random() < 0.5)
    w.add_string("t.str", "é" * rng.randrange(0, 40))
    w.add_array("t.floats", [rng.uniform(-1, 1) for _ in range(rng.randrange(1, 500))])
    w.add_array("t.few_strings", [f"s{i}" for i in range(rng.randrange(1, 10))])
    w.add_token_list([f"tok{i}-" + "x" * rng.randrange(0, 9) for i in range(n_tokens)])
    w.add_token_scores([rng.uniform(-10, 0) for _ in range(n_tokens)])
    w.add_token_types([rng.randrange(1, 6) for _ in range(n_tokens)])
    w.add_tensor("a.f16", np.zeros((rng.randrange(1, 64), 32), dtype=np.float16))
    w.add_tensor("b.f32", np.zeros((3, rng.randrange(1, 50)), dtype=np.float32))
    q8 = gguf.GGMLQuantizationType.Q8_0
    w.add_tensor("c.q8_0", np.zeros((4, 34 * 2), dtype=np.uint8), raw_dtype=q8)  # 4 rows of 64 weights
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _same_as_reader(path: Path) -> None:
    ref = gguf.GGUFReader(str(path), "r")
    got = read_header(path)
    want = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(got.fields) == list(want)
    for key, value in want.items():
        if isinstance(got.fields[key], StringArray):
            assert len(got.fields[key]) == len(value) and len(value) > 64, key
        else:
            assert got.fields[key] == value and type(got.fields[key]) is type(value), key
    assert [(t.name, t.n_elements, t.n_bytes) for t in got.tensors] == \
        [(t.name, int(t.n_elements), int(t.n_bytes)) for t in ref.tensors]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_field_and_tensor_as_the_gguf_package_reads_them(tmp_path: Path, seed: int) -> None:
    _same_as_reader(_write(tmp_path / "m.gguf", seed))


def test_a_big_endian_file_too(tmp_path: Path) -> None:
    _same_as_reader(_write(tmp_path / "be.gguf", 4, endian=gguf.GGUFEndian.BIG))


def test_the_model_shape_is_the_one_the_gguf_package_gives(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.gguf", 5)
    m = load_model(str(path))
    ref = gguf.GGUFReader(str(path), "r")
    assert m.weight_bytes == sum(int(t.n_bytes) for t in ref.tensors)
    assert m.n_params == sum(int(t.n_elements) for t in ref.tensors)
    assert (m.n_layers, m.attn_layers, m.n_head_kv, m.vocab, m.name) == (4, (0, 2, 3), 2, 3000, "model-5")


@pytest.mark.parametrize("cut", ["tensor-data", "tokens", "header"])
def test_a_cut_file_is_refused(tmp_path: Path, cut: str) -> None:
    full = _write(tmp_path / "m.gguf", 6).read_bytes()
    keep = {"tensor-data": len(full) - 40,  # past the alignment padding, into the last tensor
             "tokens": len(full) // 3, "header": 20}[cut]
    (tmp_path / "cut.gguf").write_bytes(full[:keep])
    with pytest.raises(ValueError, match="past the end of the file"):
        read_header(tmp_path / "cut.gguf")


def test_a_hostile_string_array_length_is_refused_at_once(tmp_path: Path) -> None:
    body = struct.pack("<4sIQQ", b"GGUF", 3, 0, 1)
    key = b"tokenizer.ggml.tokens"
    body += struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, 2**60) + b"\0" * 64
    (tmp_path / "h.gguf").write_bytes(body)
    with pytest.raises(ValueError, match="past the end of the file"):
        read_header(tmp_path / "h.gguf")


@pytest.mark.parametrize("data,named", [(b"", "empty"), (b"GGUF" + struct.pack("<I", 7) + b"\0" * 32, "version 7"),
                                        (b"GGML" + b"\0" * 40, "magic")])
def test_not_a_gguf_is_refused(tmp_path: Path, data: bytes, named: str) -> None:
    (tmp_path / "x.gguf").write_bytes(data)
    with pytest.raises(ValueError, match=named):
        read_header(tmp_path / "x.gguf")


def test_a_model_file_is_read_once_until_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "m.gguf", 7)
    reads = []
    real = gguf_header.read_header
    monkeypatch.setattr(gguf_header, "read_header", lambda p: reads.append(p) or real(p))
    monkeypatch.setattr(model_files, "_GGUF_SHAPES", {})
    first = load_model(str(path))
    assert load_model(str(path)) is first and len(reads) == 1
    _write(path, 8)  # the same name, new contents
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    second = load_model(str(path))
    assert len(reads) == 2 and second.name == "model-8"
