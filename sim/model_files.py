"""Model shapes, and the files they come from.

A :class:`ModelShape` is what the KV transport needs to know about a
decoder-only model: how many layers, which of them attend over the whole
cache (every layer of a dense model; every fourth of the reference hybrid),
the KV heads and head dims that size a cache row, and the weight bytes the
non-attention compute streams once a token. Shapes come from presets (JSON in
``sim/presets``), from a GGUF file's header (the ``gguf`` package, tensors
not read) or from a Hugging Face ``config.json`` (weights estimated from the
parameter count). Every loader raises ValueError with a one-line message that
names the bad value. ``sim.workload`` re-exports what is public here.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from backends.files import load_json_object, note_input, number, shown, whole, whole_value
from sim.errors import InputError

PRESET_DIR = Path(__file__).with_name("presets")
MAX_WEIGHT_GIB = 1 << 20  # 1 PiB of weights: past it a typo, not a model


@dataclass(frozen=True)
class ModelShape:
    """The shape of a decoder-only model, as far as the KV transport cares.

    ``attn_layers`` lists the full-attention layers (every layer for a dense
    model). ``weight_bytes`` is the size of the weights on the device (the
    non-attention compute reads them once per token). ``small_inputs_bytes``
    are the graph inputs copied host->device with blocking copies at the first
    split (token ids, positions, rotation inputs such as the reference's
    256 KiB ``attn_inp_k_rot``); the KQ mask (one f16 per window row) is added
    to them.
    """

    name: str
    n_layers: int
    attn_layers: tuple[int, ...]
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    hidden: int
    ffn: int
    vocab: int
    weight_bytes: int
    small_inputs_bytes: tuple[int, ...] = (4, 16)
    source: str = ""
    n_params: int = 0  # parameters, where the file says (0: estimated from the shape when needed)

    def __post_init__(self) -> None:
        for f in ("n_layers", "n_head", "n_head_kv", "head_dim_k", "head_dim_v", "hidden"):
            if getattr(self, f) <= 0:
                raise ValueError(f"model {self.name!r}: {f} must be > 0, got {getattr(self, f)}")
        if not self.attn_layers:
            raise ValueError(f"model {self.name!r}: no full-attention layer")
        if any(not 0 <= a < self.n_layers for a in self.attn_layers) or list(self.attn_layers) != sorted(set(self.attn_layers)):
            raise ValueError(f"model {self.name!r}: attn_layers must be ascending layer indices in 0..{self.n_layers - 1}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"model {self.name!r}: n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}")
        if self.weight_bytes < 0:
            raise ValueError(f"model {self.name!r}: weight_bytes must be >= 0")

    @property
    def n_attn(self) -> int:
        return len(self.attn_layers)

    @property
    def k_elems(self) -> int:
        return self.n_head_kv * self.head_dim_k

    @property
    def v_elems(self) -> int:
        return self.n_head_kv * self.head_dim_v

    @property
    def layer_weight_bytes(self) -> float:
        return self.weight_bytes / self.n_layers


# ------------------------------------------------------------------ loading



#: Upper bounds of a model's counts (a value past them is a typo or a hostile file, not a model).
COUNT_BOUNDS = {"layers": 4096, "heads": 4096, "head_dim": 65536, "hidden": 1 << 20, "ffn": 1 << 23, "vocab": 1 << 24}


def count(value: Any, key: str, where: str, bound: str) -> int:
    """``value`` as a count of ``key`` in ``where``: an integer in 1..COUNT_BOUNDS[bound]; a bool, a fraction,
    text or anything out of range is refused with one line naming the file, the key and the range."""
    hi = COUNT_BOUNDS[bound]
    boolean = type(value).__name__ in ("bool", "bool_")
    ok = not boolean and (isinstance(value, numbers.Integral) or isinstance(value, float) and value.is_integer())
    if not ok or not 1 <= int(value) <= hi:
        raise InputError(f"{where}: {key} = {value!r}; allowed: a whole number 1..{hi:,}")
    return int(value)

def interval(value: Any, key: str, where: str, n_layers: int) -> int:
    """A ``full_attention_interval``: a whole number 1..n_layers (0, null, NaN, text refused in one line)."""
    return whole_value(value, key, where, 1, n_layers)


def _shape_from_dict(d: dict[str, Any], where: str) -> ModelShape:
    try:
        n_layers = count(d["n_layers"], "n_layers", where, "layers")
        if "attn_layers" in d:
            if not isinstance(d["attn_layers"], list):
                raise InputError(f"{where}: attn_layers must be a list of layer indices")
            attn = tuple(whole_value(a, "attn_layers", where, 0, n_layers - 1) for a in d["attn_layers"])
        else:
            every = interval(d.get("full_attention_interval", 1), "full_attention_interval", where, n_layers)
            attn = tuple(layer for layer in range(n_layers) if layer % every == every - 1)
        n_head = count(d["n_head"], "n_head", where, "heads")
        hidden = count(d["hidden"], "hidden", where, "hidden")
        head_dim = count(d.get("head_dim", hidden // n_head), "head_dim", where, "head_dim")
        small = d.get("small_inputs_bytes", [4, 16])
        if not isinstance(small, list):
            raise InputError(f"{where}: small_inputs_bytes must be a list of byte counts")
        return ModelShape(
            name=str(d["name"]),
            n_layers=n_layers,
            attn_layers=attn,
            n_head=n_head,
            n_head_kv=count(d["n_head_kv"], "n_head_kv", where, "heads"),
            head_dim_k=count(d.get("head_dim_k", head_dim), "head_dim_k", where, "head_dim"),
            head_dim_v=count(d.get("head_dim_v", head_dim), "head_dim_v", where, "head_dim"),
            hidden=hidden,
            ffn=count(d["ffn"], "ffn", where, "ffn"),
            vocab=count(d.get("vocab", 32000), "vocab", where, "vocab"),
            weight_bytes=int(number(d, "weight_gib", where, 0.0, MAX_WEIGHT_GIB, default=0.0) * 2**30)
            or whole(d, "weight_bytes", where, 0, MAX_WEIGHT_GIB << 30, default=0),
            small_inputs_bytes=tuple(whole_value(x, "small_inputs_bytes", where, 0, 1 << 30) for x in small),
            source=str(d.get("source", where)),
        )
    except KeyError as exc:
        raise ValueError(f"{where}: missing field {exc}") from exc
    except InputError:
        raise
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from exc


def model_preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_model(spec: str) -> ModelShape:
    """A model shape from a preset name, a ``.gguf`` file or a ``config.json``.

    Raises ValueError with a one-line message naming the bad value.
    """
    path = Path(spec)
    if spec.endswith(".gguf"):
        return _from_gguf(path)
    if path.suffix == ".json" or path.name == "config.json":
        data = load_json_object(path, "model config")
        if "num_hidden_layers" in data or isinstance(data.get("text_config"), dict):  # a multimodal config: its text_config
            return _from_hf_config(data, spec)
        return _shape_from_dict(data, spec)
    preset = PRESET_DIR / f"{spec}.json"
    if not preset.exists():
        raise ValueError(f"unknown model {spec!r}; presets: {', '.join(model_preset_names())}, or a .gguf / config.json file")
    return _shape_from_dict(load_json_object(preset, "model preset"), str(preset))


def _hf_attn_layers(cfg: dict[str, Any], n_layers: int, where: str) -> tuple[int, ...]:
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n_layers:
        return tuple(i for i, t in enumerate(types) if "full" in str(t) or str(t) == "attention")
    every = interval(cfg.get("full_attention_interval", 1), "full_attention_interval", where, n_layers)
    return tuple(i for i in range(n_layers) if i % every == every - 1)


def _from_hf_config(cfg: dict[str, Any], where: str) -> ModelShape:
    if "text_config" in cfg and isinstance(cfg["text_config"], dict):
        cfg = {**cfg, **cfg["text_config"]}
    try:
        n_layers = count(cfg["num_hidden_layers"], "num_hidden_layers", where, "layers")
        hidden = count(cfg["hidden_size"], "hidden_size", where, "hidden")
        n_head = count(cfg["num_attention_heads"], "num_attention_heads", where, "heads")
        n_head_kv = count(cfg.get("num_key_value_heads", n_head), "num_key_value_heads", where, "heads")
        head_dim = count(cfg.get("head_dim") or hidden // n_head, "head_dim", where, "head_dim")
        ffn = count(cfg["intermediate_size"], "intermediate_size", where, "ffn")
        vocab = count(cfg.get("vocab_size", 32000), "vocab_size", where, "vocab")
    except KeyError as exc:
        raise ValueError(f"config {where!r}: missing field {exc}") from exc
    attn = _hf_attn_layers(cfg, n_layers, where)
    per_layer = hidden * (n_head * head_dim) * 2 + hidden * (n_head_kv * head_dim) * 2 + 3 * hidden * ffn
    params = n_layers * per_layer + 2 * vocab * hidden
    dtype_bytes = {"float32": 4, "float16": 2, "bfloat16": 2}.get(str(cfg.get("torch_dtype", "bfloat16")), 2)
    return ModelShape(
        name=str(cfg.get("_name_or_path") or cfg.get("model_type") or Path(where).parent.name or "config"),
        n_layers=n_layers,
        attn_layers=attn,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim,
        head_dim_v=head_dim,
        hidden=hidden,
        ffn=ffn,
        vocab=vocab,
        weight_bytes=params * dtype_bytes,
        source=f"Hugging Face config {where} (weights estimated at {dtype_bytes} B/parameter; --weights-type for a quantized file)",
        n_params=params,
    )


def _gguf_header(path: Path) -> Any:
    """The file's header (``sim.gguf_header``: metadata and tensor sizes, a tokenizer's strings skipped; blocks on the
    read, ~0.1-0.2 s for a 128k-token vocabulary); a bad file: ValueError naming it."""
    from sim.gguf_header import read_header

    if not path.is_file():
        raise ValueError(f"cannot read GGUF file {shown(path)}: no such file")
    note_input(path)
    try:
        return read_header(path)
    except Exception as exc:  # a bad file: ValueError, struct.error, OSError, MemoryError, UnicodeError
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ValueError(f"cannot read GGUF file {shown(path)}: {reason}; allowed: a GGUF file llama.cpp can load") from exc


def _gguf_attention(field_value: Callable[[str], Any], kv: Any, arch: str, where: str,
                    n_layers: int) -> tuple[int, tuple[int, ...]]:
    """(KV heads, attention layers): ``head_count_kv`` per layer (0: no attention) or one count with an optional
    ``full_attention_interval``."""
    kv_key = f"{arch}.attention.head_count_kv"
    if isinstance(kv, list):
        if len(kv) != n_layers:
            raise InputError(f"{where}: {kv_key} lists {len(kv):,} layers; allowed: one per layer ({n_layers})")
        heads = [whole_value(h, kv_key, where, 0, COUNT_BOUNDS["heads"]) for h in kv]
        return count(max(heads), kv_key, where, "heads"), tuple(i for i, h in enumerate(heads) if h > 0)
    every = field_value(f"{arch}.full_attention_interval")
    every = 1 if every is None else interval(every, f"{arch}.full_attention_interval", where, n_layers)
    return count(kv, kv_key, where, "heads"), tuple(i for i in range(n_layers) if i % every == every - 1)


def _from_gguf(path: Path) -> ModelShape:
    """The shape in a GGUF file's header, read once per process for a file of the same size and modification time
    (a plan names its model once per grid). Blocks on the first read."""
    st = path.stat() if path.is_file() else None
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns) if st else None
    got = _GGUF_SHAPES.get(key) if key else None
    if got is None:
        got = _read_gguf_shape(path)
        if key:
            _GGUF_SHAPES[key] = got
    else:
        note_input(path)
    return got


_GGUF_SHAPES: dict[tuple[str, int, int], ModelShape] = {}  # _from_gguf's shapes by (file, size, mtime)


def _read_gguf_shape(path: Path) -> ModelShape:
    header = _gguf_header(path)
    where = str(path)

    def field_value(key: str) -> Any:
        return header.fields.get(key)

    arch = field_value("general.architecture")
    if not arch:
        raise ValueError(f"GGUF file {where!r} has no general.architecture")

    def need(key: str, bound: str) -> int:
        v = field_value(f"{arch}.{key}")
        if v is None:
            raise ValueError(f"GGUF file {where!r} lacks {arch}.{key}")
        return count(v, f"{arch}.{key}", where, bound)

    n_layers, n_head = need("block_count", "layers"), need("attention.head_count", "heads")
    kv = field_value(f"{arch}.attention.head_count_kv")
    if kv is None:
        raise ValueError(f"GGUF file {where!r} lacks {arch}.attention.head_count_kv")
    n_head_kv, attn = _gguf_attention(field_value, kv, arch, where, n_layers)
    hidden = need("embedding_length", "hidden")
    head_k = count(field_value(f"{arch}.attention.key_length") or hidden // n_head, f"{arch}.attention.key_length", where,
                   "head_dim")
    head_v = count(field_value(f"{arch}.attention.value_length") or head_k, f"{arch}.attention.value_length", where,
                   "head_dim")
    ffn_v = field_value(f"{arch}.feed_forward_length") or 0
    ffn = count(max(ffn_v) if isinstance(ffn_v, list) else ffn_v, f"{arch}.feed_forward_length", where, "ffn")
    vocab = field_value(f"{arch}.vocab_size")
    if vocab is None:
        tokens = header.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens) if tokens is not None else 32000
    vocab = count(vocab, f"{arch}.vocab_size", where, "vocab")
    weight_bytes = sum(t.n_bytes for t in header.tensors)
    if weight_bytes <= 0:
        raise ValueError(f"GGUF file {where!r} holds no tensors, so its weights' size is unknown; "
                         "give the whole file, or the model's config.json")
    return ModelShape(name=str(field_value("general.name") or path.stem), n_layers=n_layers, attn_layers=attn,
                      n_head=n_head, n_head_kv=n_head_kv, head_dim_k=head_k, head_dim_v=head_v, hidden=hidden, ffn=ffn,
                      vocab=vocab, weight_bytes=weight_bytes, source=f"GGUF header {path}",
                      n_params=sum(t.n_elements for t in header.tensors))


#: Bits per weight of llama.cpp's weight types (the mixes' averages as llama.cpp's quantize reports them for a Llama).
WEIGHT_BITS = {"f32": 32.0, "f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q6_k": 6.5625, "q5_k_m": 5.69, "q5_k_s": 5.54,
               "q5_0": 5.5, "q4_k_m": 4.85, "q4_k_s": 4.58, "q4_0": 4.5, "q3_k_m": 3.91, "iq4_xs": 4.25, "q2_k": 2.96,
               "iq2_m": 2.7}


def estimated_params(m: ModelShape) -> int:
    """Parameters of ``m``: the file's count, else the dense decoder's from its shape (attention, a gated FFN, the
    embeddings and the output head)."""
    if m.n_params:
        return m.n_params
    attn = m.hidden * m.n_head * m.head_dim_k * 2 + m.hidden * m.n_head_kv * (m.head_dim_k + m.head_dim_v)
    return m.n_layers * (attn + 3 * m.hidden * m.ffn) + 2 * m.vocab * m.hidden


def with_weights_type(m: ModelShape, weights_type: str) -> ModelShape:
    """``m`` with its weights in ``weights_type`` (a llama.cpp type name of WEIGHT_BITS, or bits per weight): the
    weights' bytes from the parameter count. Raises ValueError naming the value and what is allowed."""
    key = weights_type.strip().lower()
    try:
        bits = WEIGHT_BITS[key] if key in WEIGHT_BITS else float(key)
    except ValueError:
        raise ValueError(f"--weights-type {weights_type!r} unknown; allowed: {', '.join(WEIGHT_BITS)}, "
                         "or bits per weight (1..32)") from None
    if not 1 <= bits <= 32:
        raise ValueError(f"--weights-type {weights_type!r}: {bits:g} bits per weight out of range; allowed: 1..32")
    params = estimated_params(m)
    return replace(m, weight_bytes=int(params * bits / 8), n_params=params,
                   source=f"{m.source}; weights as {weights_type} ({bits:g} bits per weight, {params / 1e9:.2f} B parameters)")
