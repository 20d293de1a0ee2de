"""The decode program's sizes, derived once from a workload and a ProgramConfig."""

from __future__ import annotations

from dataclasses import dataclass

from sim.program.weights import WEIGHT_TYPES, weight_shapes
from sim.workload import CacheType, Workload


@dataclass(frozen=True)
class ProgramConfig:
    """Sizes, seed and executor of the decode program.

    ``max_hidden`` / ``max_ffn`` / ``max_vocab`` cap the model's sizes (K/V
    rows are always the workload's); hidden and FFN are cut to whole 32-element
    blocks. ``weight_type`` is how the weights are stored (``q8_0`` or
    ``f16``, as a GGUF file holds them). ``executor``: ``numpy`` (the
    reference), ``cuda`` (CUDA kernels in graphs) or ``auto`` (``cuda`` when
    the array module is CuPy). ``fill``: ``host`` writes each sequence's first
    ``prefill_rows`` rows (-1: all) keyed by (seed, layer, K/V, sequence);
    ``device`` fills every cell with the array module, once per host buffer
    (full-size GPU runs).
    """

    seed: int = 0
    max_hidden: int = 64
    max_ffn: int = 128
    max_vocab: int = 256
    prefill_rows: int = -1
    weight_type: str = "q8_0"
    executor: str = "auto"
    fill: str = "host"

    def __post_init__(self) -> None:
        for name in ("max_hidden", "max_ffn"):
            if getattr(self, name) < 32:
                raise ValueError(f"ProgramConfig.{name} must be >= 32 (one block), got {getattr(self, name)}")
        if self.max_vocab < 2:
            raise ValueError(f"ProgramConfig.max_vocab must be >= 2, got {self.max_vocab}")
        if self.weight_type not in WEIGHT_TYPES:
            raise ValueError(f"ProgramConfig.weight_type {self.weight_type!r}; allowed: {', '.join(WEIGHT_TYPES)}")
        if self.executor not in ("auto", "numpy", "cuda"):
            raise ValueError(f"ProgramConfig.executor {self.executor!r}; allowed: auto, numpy, cuda")
        if self.fill not in ("host", "device"):
            raise ValueError(f"ProgramConfig.fill {self.fill!r}; allowed: host, device")


def full_size(seed: int = 0, scale: float = 1.0, model_hidden: int = 0, model_ffn: int = 0, model_vocab: int = 0,
              weight_type: str = "q8_0") -> ProgramConfig:
    """The config of a GPU run: the model's sizes times ``scale`` (1.0 = full size), the cache filled on the device."""
    cap = lambda n: max(32, int(n * scale))  # noqa: E731
    return ProgramConfig(seed=seed, max_hidden=cap(model_hidden), max_ffn=cap(model_ffn), max_vocab=max(2, int(model_vocab * scale)),
                         prefill_rows=0, weight_type=weight_type, fill="device")


@dataclass(frozen=True)
class ProgramShape:
    """Every size the executors need (elements unless named bytes)."""

    n_seq: int
    n_layers: int
    n_attn: int
    hidden: int
    ffn: int
    vocab: int
    n_head: int
    n_kv: int
    dk: int
    dv: int
    cache_k: CacheType
    cache_v: CacheType
    kb: int
    vb: int
    weight_type: str
    max_steps: int
    cells_per_stream: int = 0

    @property
    def group(self) -> int:
        return self.n_head // self.n_kv

    @property
    def k_elems(self) -> int:
        return self.n_kv * self.dk

    @property
    def v_elems(self) -> int:
        return self.n_kv * self.dv

    def weight_shapes(self) -> dict[str, tuple[int, int]]:
        return weight_shapes(self.n_layers, self.n_attn, self.hidden, self.ffn, self.vocab, self.n_head * self.dk,
                             self.k_elems + self.v_elems, self.n_head * self.dv)


def shape_of(wl: Workload, cfg: ProgramConfig) -> ProgramShape:
    """The program's shape for workload ``wl``. Raises ValueError for a model the program cannot hold."""
    m = wl.model
    block = lambda n, cap: max(32, min(n, cap) // 32 * 32)  # noqa: E731
    if (m.n_head * m.head_dim_v) % 32 or m.k_elems % 32 or m.v_elems % 32:
        raise ValueError(f"model {m.name!r}: the decode program needs K/V rows and n_head x head_dim_v in whole 32-element blocks")
    return ProgramShape(
        n_seq=wl.n_parallel, n_layers=m.n_layers, n_attn=m.n_attn, hidden=block(m.hidden, cfg.max_hidden),
        ffn=block(max(m.ffn, 32), cfg.max_ffn), vocab=min(max(m.vocab, 2), cfg.max_vocab), n_head=m.n_head, n_kv=m.n_head_kv,
        dk=m.head_dim_k, dv=m.head_dim_v, cache_k=wl.cache_k, cache_v=wl.cache_v, kb=wl.k_row_bytes, vb=wl.v_row_bytes,
        weight_type=cfg.weight_type, max_steps=max(64, 2 * wl.tokens + 16), cells_per_stream=wl.cells_per_stream,
    )
