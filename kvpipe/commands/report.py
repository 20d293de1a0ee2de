"""``kvpipe report INPUT... --out report.html``: one self-contained HTML page from kvpipe's outputs.

Each INPUT is a sweep folder (``kvpipe sweep --out DIR``) or its rows.json,
``kvpipe simulate --json`` or ``kvpipe plan --json`` saved to a file, a
validation report.json (or its folder) or a Chrome trace; the kind is read
from the content. See ``kvpipe/html_report.py`` for the page.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

#: The input kinds (``kvpipe.html_report.ALLOWED``, which a test holds this to; not imported at parser build).
ALLOWED = ("result rows (kvpipe sweep --out DIR, its rows.json, kvpipe simulate --json); a capacity plan (kvpipe plan --json); "
           "a validation report (kvpipe validate's report.json, or its folder); a Chrome trace (kvpipe simulate/validate --trace, "
           ".json or .json.gz)")


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="one self-contained HTML page (inline SVG plots, tables, commands) from kvpipe outputs")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help=f"files or folders, any of: {ALLOWED}")
    p.add_argument("--out", default="report.html", help="the HTML file to write (default report.html; - = standard output)")
    p.add_argument("--title", default="kvpipe report", help="the page's title")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvpipe.html_report import load_inputs, page
    from sim.safe_write import write_output

    inputs = [x for path in args.inputs for x in load_inputs(path)]
    command = shlex.join(["kvpipe", "report", *args.inputs, "--out", args.out]
                         + (["--title", args.title] if args.title != "kvpipe report" else []))
    text = page(inputs, command, args.title)
    write_output(args.out, text)
    if args.out != "-":
        kinds = ", ".join(f"{i.path} ({i.kind})" for i in inputs)
        print(f"wrote {args.out}: {text.count('<figure')} figures, {len(text) // 1024} KiB, from {kinds}")
    return 0
