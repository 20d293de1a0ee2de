"""The memory plan as a picture: t/s of the best way to run each context, and what the device holds for it.

Top: predicted t/s against context, one marker per context coloured by how it runs (the cache on the device, or
the host cache at a depth), with the calibrated band where the profile has one. Bottom: the device's memory per
context, stacked: the driver's reservation, the weights, llama.cpp's compute buffer (an estimate), the KV kept on
the device, the ring, and what is left, under the line of the memory the plan had to fit.
"""

from __future__ import annotations

from typing import Any

from kvpipe.capacity import FitPlan
from sim.memory import GIB

PARTS = (("reserved", "driver", "#999999"), ("weights", "weights", "#4c72b0"), ("compute_buffer", "compute buffer~", "#8172b2"),
         ("kv", "KV on the device", "#dd8452"), ("ring", "ring", "#c44e52"), ("free", "free", "#e8e8e8"))


def _how(c: Any) -> str:
    if c.resident:
        return "cache on the device"
    return f"host cache, depth {c.depth}" + (" + KV layers on GPU" if c.kv_gpu_layers else "")


def memory_plan(fp: FitPlan, cache_type: str) -> Any:
    """The figure of ``fp`` (contexts that fit; the others are named in the title). Does not block."""
    from matplotlib.figure import Figure

    fits = [f for f in fp.fits if f.best is not None]
    fig = Figure(figsize=(10, 7.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    xs = list(range(len(fits)))
    kinds: dict[str, str] = {}
    colours = ["#55a868", "#4c72b0", "#dd8452", "#c44e52", "#8172b2", "#937860"]
    for i, f in enumerate(fits):
        c = f.best
        assert c is not None
        kind = _how(c)
        colour = kinds.setdefault(kind, colours[len(kinds) % len(colours)])
        top.plot([i], [c.tokens_per_s], "o", color=colour, markersize=8, label=kind if list(kinds).index(kind) == len(kinds) - 1
                 and sum(1 for g in fits[:i] if _how(g.best) == kind) == 0 else None)
        if c.interval:
            top.vlines(i, c.interval[0], c.interval[1], color=colour, linewidth=2)
        label = f"{c.tokens_per_s:.3g}" + (f" (-ngl {c.n_gpu_layers})" if c.n_gpu_layers != 99 else "")
        top.annotate(label, (i, c.tokens_per_s), textcoords="offset points", xytext=(6, 4), fontsize=8)
    top.plot(xs, [f.best.tokens_per_s for f in fits if f.best], "-", color="#bbbbbb", zorder=0)
    top.set_ylabel("predicted t/s (best way to run)")
    top.set_ylim(0, 1.15 * max((f.best.tokens_per_s for f in fits if f.best), default=1.0))
    top.grid(alpha=0.3)
    top.legend(loc="lower left", fontsize=8)
    missing = [f"{f.context:,}" for f in fp.fits if f.best is None]
    title = f"{fp.model} ({cache_type} KV) on {fp.hardware}, {fp.limits.vram_bytes / GIB:.1f} GiB"
    if fp.ngl < fp.n_layers:
        title += ": the weights do not fit, the largest -ngl per context as marked"
    top.set_title(title + (f" (does not fit: {', '.join(missing)})" if missing else ""), fontsize=10)
    base = [0.0] * len(fits)
    for key, label, colour in PARTS:
        vals = [max(0.0, f.best.memory.as_gib()[key]) if f.best else 0.0 for f in fits]
        bottom.bar(xs, vals, bottom=base, color=colour, label=label, width=0.6, edgecolor="white", linewidth=0.5)
        base = [b + v for b, v in zip(base, vals, strict=True)]
    bottom.axhline(fp.limits.vram_bytes / GIB, color="black", linewidth=1, linestyle="--")
    bottom.set_ylabel("device memory, GiB")
    bottom.set_xticks(xs, [f"{f.context:,}" for f in fits], rotation=30 if len(fits) > 6 else 0)
    bottom.set_xlabel("context (tokens already cached)")
    bottom.legend(loc="upper left", fontsize=7, ncols=3)
    bottom.set_ylim(0, fp.limits.vram_bytes / GIB * 1.25)
    return fig
