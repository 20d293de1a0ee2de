"""Writing derived preset files, or checking that the committed ones match (``--check``), for the tools here."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(outputs: dict[Path, str], tool: str, check: bool) -> int:
    """Write every file of ``outputs`` (path -> text), or with ``check`` report the ones that differ (exit code 1)."""
    if check:
        stale = [str(p) for p, text in outputs.items() if not p.exists() or p.read_text() != text]
        if stale:
            print(f"{', '.join(stale)} differ(s) from what {tool} derives; rerun it", file=sys.stderr)
            return 1
        print(f"{', '.join(str(p) for p in outputs)} match(es) the derivation")
        return 0
    for p, text in outputs.items():
        p.write_text(text)
        print(f"wrote {p}")
    return 0
