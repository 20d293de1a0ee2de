#!/usr/bin/env python3
"""Write a random-weight llama-architecture GGUF shaped like a kvpipe model preset.

For llama-bench on the device (issue 19): the decode speed of llama.cpp depends on the tensor shapes and types, not on
the weight values, so random weights in the layout a user's ``llama-quantize`` would leave (q8_0 or f16 matrices, f32
norms) measure what a real file of that shape measures. The tokenizer is copied from a vocab GGUF (llama.cpp's
``models/ggml-vocab-llama-bpe.gguf``, 128256 tokens: llama 3's) because llama.cpp refuses a model without one.

Speed: fresh randomness for 8B parameters takes minutes in numpy on a slow core, so each tensor is tiled from a 64 MiB
pool of random q8_0 blocks (or f16 values) starting at a random block of it. The bytes repeat every 64 MiB; no kernel
llama.cpp runs can tell. Tensors are streamed to the file one at a time (memory: the pool plus the largest tensor).

    python3 tools/llamacpp/write_gguf.py --preset sim/presets/llama-3.1-8b.json --out /tmp/m.gguf --weights q8_0 \\
        --vocab-from models/ggml-vocab-llama-bpe.gguf [--layers 2] [--gguf-py /tmp/lcp/llama.cpp/gguf-py]

stdlib + numpy + gguf (the installed package, or the vendored gguf-py named by --gguf-py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

QK8_0 = 32            # q8_0: 32 int8 quants per block ...
Q8_0_BLOCK_BYTES = 34  # ... after one f16 scale
POOL_BYTES = 64 << 20
CONTEXT_LENGTH = 131072  # llama 3.1's trained context; llama-bench sizes its cache from -d/-n, not from this


def die(msg: str) -> None:
    sys.exit(f"write_gguf: {msg}")


def load_preset(path: Path) -> dict:
    try:
        d = json.loads(path.read_text())
    except OSError as exc:
        die(f"cannot read preset {str(path)!r}: {exc.strerror}")
    except json.JSONDecodeError as exc:
        die(f"preset {str(path)!r} is not JSON: {exc.msg} at line {exc.lineno}")
    need = ("n_layers", "n_head", "n_head_kv", "hidden", "ffn", "vocab")
    missing = [k for k in need if k not in d]
    if missing:
        die(f"preset {str(path)!r} lacks {', '.join(missing)}")
    if "full_attention_interval" in d or "attn_layers" in d:
        die(f"preset {str(path)!r} is a hybrid (full_attention_interval/attn_layers); this writer makes dense llama only")
    d.setdefault("head_dim", d["hidden"] // d["n_head"])
    for k in need + ("head_dim",):
        if not isinstance(d[k], int) or d[k] <= 0:
            die(f"preset {str(path)!r}: {k} = {d[k]!r}; expected a whole number > 0")
    return d


def copy_tokenizer(gguf, w, vocab_path: Path) -> int:
    """Copy every tokenizer.* field of the vocab GGUF into the writer; returns the token count."""
    try:
        src = gguf.GGUFReader(str(vocab_path))
    except Exception as exc:  # gguf raises ValueError/OSError on a bad file
        die(f"cannot read vocab GGUF {str(vocab_path)!r}: {exc}")
    n_tokens = 0
    for f in src.fields.values():
        if not f.name.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        val = f.contents()
        w.add_key_value(f.name, val, vtype, sub_type=sub)
        if f.name == "tokenizer.ggml.tokens":
            n_tokens = len(val)
    if n_tokens == 0:
        die(f"vocab GGUF {str(vocab_path)!r} has no tokenizer.ggml.tokens")
    return n_tokens


def tensor_list(p: dict, n_layers: int) -> list[tuple[str, tuple[int, int] | tuple[int]]]:
    """(name, numpy shape (rows, cols)) of each tensor, in llama.cpp's order; 1-D ones are the f32 norms."""
    E, H, KV, D, F, V = p["hidden"], p["n_head"], p["n_head_kv"], p["head_dim"], p["ffn"], p["vocab"]
    out: list = [("token_embd.weight", (V, E))]
    for i in range(n_layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (E,)), (b + "attn_q.weight", (H * D, E)), (b + "attn_k.weight", (KV * D, E)),
                (b + "attn_v.weight", (KV * D, E)), (b + "attn_output.weight", (E, H * D)), (b + "ffn_norm.weight", (E,)),
                (b + "ffn_gate.weight", (F, E)), (b + "ffn_up.weight", (F, E)), (b + "ffn_down.weight", (E, F))]
    out += [("output_norm.weight", (E,)), ("output.weight", (V, E))]
    return out


class Pool:
    """A pool of random rows (q8_0 blocks or f16 values) tiled into tensors from a random start."""

    def __init__(self, weights: str, rng: np.random.Generator):
        self.weights = weights
        self.rng = rng
        self.scratch: np.ndarray | None = None
        if weights == "q8_0":
            n = POOL_BYTES // Q8_0_BLOCK_BYTES
            blocks = np.empty((n, Q8_0_BLOCK_BYTES), np.uint8)
            # int8 quants uniform in -127..127 and a scale of 0.02/127: weights of magnitude <= 0.02, as in a real model
            blocks[:, 2:] = rng.integers(-127, 128, (n, QK8_0), dtype=np.int8).view(np.uint8)
            blocks[:, :2] = np.full((n, 1), 0.02 / 127, np.float16).view(np.uint8)
            self.items = blocks
        else:
            n = POOL_BYTES // 2
            self.items = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(np.float16)

    def tensor(self, shape: tuple[int, int]) -> np.ndarray:
        rows, cols = shape
        if self.weights == "q8_0":
            if cols % QK8_0:
                die(f"a q8_0 row needs a multiple of {QK8_0} columns; got shape {shape}")
            n, item_shape = rows * cols // QK8_0, (rows, cols // QK8_0 * Q8_0_BLOCK_BYTES)
        else:
            n, item_shape = rows * cols, shape
        # one scratch buffer, grown to the largest tensor and reused: page faults once, not once a tensor
        if self.scratch is None or len(self.scratch) < n:
            self.scratch = np.empty((n,) + self.items.shape[1:], self.items.dtype)
        out = self.scratch[:n]
        pos, start = 0, int(self.rng.integers(len(self.items)))
        while pos < n:  # contiguous copies: memcpy speed
            k = min(n - pos, len(self.items) - start)
            out[pos:pos + k] = self.items[start:start + k]
            pos, start = pos + k, 0
        return out.reshape(item_shape)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", required=True, type=Path, help="kvpipe model preset JSON (sim/presets/*.json)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--weights", choices=("q8_0", "f16"), default="q8_0")
    ap.add_argument("--vocab-from", required=True, type=Path, help="GGUF whose tokenizer.* fields are copied")
    ap.add_argument("--layers", type=int, help="override n_layers (a tiny file for a local test)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gguf-py", type=Path, help="use this gguf-py tree (llama.cpp's vendored one) instead of the installed gguf")
    a = ap.parse_args(argv)
    if a.gguf_py is not None:
        if not (a.gguf_py / "gguf" / "__init__.py").is_file():
            die(f"--gguf-py {str(a.gguf_py)!r} holds no gguf/__init__.py")
        sys.path.insert(0, str(a.gguf_py))
    import gguf

    p = load_preset(a.preset)
    n_layers = p["n_layers"] if a.layers is None else a.layers
    if n_layers <= 0:
        die(f"--layers {n_layers}; expected >= 1")
    t0 = time.time()
    w = gguf.GGUFWriter(str(a.out), "llama")
    name = f"{p.get('name', a.preset.stem)}-random-{a.weights}" + (f"-{n_layers}l" if n_layers != p["n_layers"] else "")
    w.add_name(name)
    w.add_context_length(CONTEXT_LENGTH)
    w.add_embedding_length(p["hidden"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(p["ffn"])
    w.add_head_count(p["n_head"])
    w.add_head_count_kv(p["n_head_kv"])
    w.add_key_length(p["head_dim"])
    w.add_value_length(p["head_dim"])
    w.add_rope_dimension_count(p["head_dim"])
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(p["vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if a.weights == "q8_0" else gguf.LlamaFileType.MOSTLY_F16)
    n_tokens = copy_tokenizer(gguf, w, a.vocab_from)
    if n_tokens != p["vocab"]:
        die(f"vocab GGUF {str(a.vocab_from)!r} has {n_tokens} tokens, preset vocab is {p['vocab']}; they must agree")

    qtype = gguf.GGMLQuantizationType.Q8_0 if a.weights == "q8_0" else gguf.GGMLQuantizationType.F16
    tensors = tensor_list(p, n_layers)
    # Announce every tensor first, then stream the data: no tensor is held in memory past its own write.
    for tname, shape in tensors:
        if len(shape) == 1:
            w.add_tensor_info(tname, shape, np.dtype(np.float32), shape[0] * 4)
        elif a.weights == "q8_0":
            byte_shape = (shape[0], shape[1] // QK8_0 * Q8_0_BLOCK_BYTES)
            w.add_tensor_info(tname, byte_shape, np.dtype(np.uint8), byte_shape[0] * byte_shape[1], raw_dtype=qtype)
        else:
            w.add_tensor_info(tname, shape, np.dtype(np.float16), shape[0] * shape[1] * 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pool = Pool(a.weights, np.random.default_rng(a.seed))
    total = 0
    for _name, shape in tensors:
        arr = np.ones(shape, np.float32) if len(shape) == 1 else pool.tensor(shape)  # norms: ones, as after init
        w.write_tensor_data(arr)
        total += arr.nbytes
    w.close()
    print(f"write_gguf: {a.out} ({name}): {len(tensors)} tensors, {total / 2**30:.3f} GiB of weights, "
          f"{n_tokens} tokens, {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
