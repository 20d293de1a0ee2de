"""The floors hold in the import graph: machines, then the model and transport, then validation, then the application.

Read from the source (``ast``), not by importing. Floors, bottom up: ``backends`` < ``sim`` < ``validate`` < ``kvpipe``
(< ``tools``, outside the installed packages). A module imports only its own floor and the floors below it, lazy
imports inside functions included; no two modules of the packages import each other, directly or around a circle;
and the transport scheduler imports ``backends.base`` and no machine.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ("backends", "sim", "validate", "kvpipe")


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at top level or inside a function; ``from pkg import mod`` counts as ``pkg.mod``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    files = [p for pkg in FLOORS for p in (ROOT / pkg).rglob("*.py") if "results" not in p.parts]
    names = {_module_name(p) for p in files}
    return {_module_name(p): {m for m in _imports(p) if m in names and m != _module_name(p)} for p in files}


def test_each_floor_imports_only_itself_and_the_floors_below() -> None:
    up = {}
    for mod, deps in _graph().items():
        floor = FLOORS.index(mod.split(".")[0])
        bad = sorted(d for d in deps if FLOORS.index(d.split(".")[0]) > floor)
        if bad:
            up[mod] = bad
    assert up == {}


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each circle met by a depth-first walk, as the modules around it."""
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(edges.get(m, ())):
            if state.get(d) == 1:
                circles.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    return circles


def test_no_import_circle() -> None:
    # a package's __init__ importing its own submodules is not a circle between modules
    edges = {m: {d for d in deps if not m.startswith(d + ".") and not d.startswith(m + ".")} for m, deps in _graph().items()}
    assert _circles(edges) == []


def test_the_circle_check_finds_circles() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _circles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []




def test_the_scheduler_sees_no_machine() -> None:
    for f in sorted((ROOT / "sim" / "transport").glob("*.py")):
        mods = _imports(f)
        assert not [m for m in mods if m.startswith("backends.") and not m.startswith("backends.base")], f
        assert "simpy" not in mods and "cupy" not in mods, f


def _modules() -> list[Path]:
    return [p for pkg in FLOORS for p in (ROOT / pkg).rglob("*.py") if "results" not in p.parts]


def test_no_module_is_over_400_lines() -> None:
    files = _modules() + [p for p in (ROOT / "tools").rglob("*.py")]
    over = {p.relative_to(ROOT).as_posix(): n for p in files if (n := len(p.read_text().splitlines())) > 400}
    assert over == {}


def test_the_design_names_every_module() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    missing = [p.relative_to(ROOT).as_posix() for p in _modules() if f"`{p.relative_to(ROOT).as_posix()}`" not in design]
    assert missing == [], "regenerate docs/design.md's module map: python tools/module_map.py"
