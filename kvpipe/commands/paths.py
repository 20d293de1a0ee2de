"""The files a command line names, checked before the command runs: no output may be one of its inputs.

:func:`check_paths` notes every input file the parsed flags name
(``backends.files.note_input``: model and hardware files, ``--rows``,
``--from-llama-bench``, ``--from-batched-bench``, a study, ``report``'s inputs) and holds every output
flag (``--out``, ``--csv``, ``--trace``) to ``sim.safe_write.check_output``,
so ``kvpipe calibrate --from-llama-bench in.json --out in.json`` stops before
the fit with one line instead of replacing the measurements; two output flags
naming one file (``--trace x --csv x``) are refused too. The same check
runs again in the writer itself (``sim.safe_write``) for every file it writes,
the inputs the readers noted since included.
"""

from __future__ import annotations

import argparse
import os

from backends.files import note_input
from sim.safe_write import check_output, distinct_outputs

INPUT_FLAGS = ("model", "hardware", "rows", "from_llama_bench", "from_batched_bench", "study", "inputs")
OUTPUT_FLAGS = ("out", "csv", "trace", "json_out")


def _items(value: object) -> list[str]:
    values = value if isinstance(value, list) else [value]
    return [part for v in values if isinstance(v, str) and v for item in v.split(",") for part in item.split("+")]


def check_paths(args: argparse.Namespace) -> None:
    """Note the input files ``args`` names; refuse (InputError) an output flag naming one of them, or a file the user
    may not write. A folder output (``sweep --out DIR``) is checked file by file as it is written. Blocks on stats."""
    for name in INPUT_FLAGS:
        for path in _items(getattr(args, name, None)):
            if os.path.isfile(path) or os.path.isdir(path) and name == "inputs":
                note_input(path)
                if os.path.isdir(path):
                    for child in ("rows.json", "rows.jsonl", "report.json"):
                        note_input(os.path.join(path, child))
    outputs = [(f"--{name.replace('_', '-')}", v) for name in OUTPUT_FLAGS if isinstance(v := getattr(args, name, None), str) and v]
    distinct_outputs([v for _, v in outputs], [flag for flag, _ in outputs])
    for _, value in outputs:
        if not os.path.isdir(value):
            check_output(value)
