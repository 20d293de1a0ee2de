"""The floors hold in the import graph: machines below the model, the model below validation, the CLI on top.

Read from the source (``ast``), not by importing: ``backends`` imports nothing of ``sim`` or ``validate``; no module
of ``sim`` imports ``validate`` except the command line (``sim/cli.py``, ``sim/commands/``), which sits above both;
and no library module of ``sim`` imports the command line's flag parsing.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def _modules(pkg: str) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): _imports(p) for p in (ROOT / pkg).rglob("*.py")}


def test_backends_import_nothing_above_them() -> None:
    bad = {f: sorted(m for m in mods if m.split(".")[0] in ("sim", "validate")) for f, mods in _modules("backends").items()}
    assert {f: m for f, m in bad.items() if m} == {}


def test_only_the_command_line_of_sim_imports_validate_or_the_flag_parser() -> None:
    cli = ("sim/cli.py", "sim/commands/")
    bad = {}
    for f, mods in _modules("sim").items():
        if f.startswith(cli):
            continue
        up = sorted(m for m in mods if m.split(".")[0] == "validate" or m.startswith("sim.commands") or m == "sim.cli")
        if up:
            bad[f] = up
    assert bad == {}


def test_the_scheduler_sees_no_machine() -> None:
    for f in ("sim/scheduler.py", "sim/deliveries.py", "sim/ring.py", "sim/ordered_path.py", "sim/transport_config.py"):
        mods = _imports(ROOT / f)
        assert not [m for m in mods if m.startswith("backends.") and m != "backends.base"], f
        assert "simpy" not in mods and "cupy" not in mods, f
