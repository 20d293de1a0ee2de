"""A headless figure and its files: matplotlib's Agg canvas (no pyplot state), PNG and SVG bytes, written all or none.

Every plot of the application draws on :func:`new_figure` and leaves through :func:`save` (or :func:`rendered` for
callers that write the bytes themselves). Blocks only on the file writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sim.errors import InputError

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn, not when a command starts (0.3 s of every start)
    from matplotlib.figure import Figure

FORMATS = ("png", "svg")


def new_figure(size: tuple[float, float] = (9, 5.5)) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (for notebooks: ``IPython.display.Image(png_bytes(fig))``). Does not block on I/O."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def rendered(fig: Figure, prefix: str | Path, formats: Sequence[str] = FORMATS) -> list[tuple[Path, bytes]]:
    """``prefix.png`` / ``prefix.svg`` as (path, bytes), nothing written yet. Raises InputError on an unknown format."""
    import io

    prefix = Path(prefix)
    out = []
    for fmt in formats:
        if fmt not in FORMATS:
            raise InputError(f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt)
        out.append((prefix.with_name(f"{prefix.name}.{fmt}"), buf.getvalue()))
    return out


def save(fig: Figure, prefix: str | Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write ``prefix.png`` / ``prefix.svg`` (all or none: ``sim.safe_write.write_outputs``); returns the paths.
    Blocks on the writes."""
    from sim.safe_write import write_outputs

    files = rendered(fig, prefix, formats)
    write_outputs(list(files))
    return [path for path, _ in files]
