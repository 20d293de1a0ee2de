"""Print the package map docs/design.md holds: every module of the four floors, its lines and its concept.

The concept is the first line of the module's docstring, so the map is drawn from the code; ``tests/test_layers.py``
fails when docs/design.md leaves a module out. Usage: ``python tools/module_map.py`` (Markdown on stdout). Reads
the source only; imports nothing of the project.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ("kvpipe", "validate", "sim", "backends")  # top floor first, as the map is read


def modules(floor: str) -> list[Path]:
    """The floor's modules, packages' ``__init__`` files included, results folders excluded, sorted by path."""
    return sorted(p for p in (ROOT / floor).rglob("*.py") if "results" not in p.parts)


def concept(path: Path) -> str:
    """The first line of the module's docstring ('' if it has none)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def main() -> int:
    for floor in FLOORS:
        print(f"\n**{floor}/**\n\n| module | lines | what it is |\n|---|---:|---|")
        for p in modules(floor):
            rel = p.relative_to(ROOT).as_posix()
            print(f"| `{rel}` | {len(p.read_text().splitlines())} | {concept(p).replace('|', '/')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
