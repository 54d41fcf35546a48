"""``torch-sentinel precision RUN_DIR``: each tensor's low-precision headroom, worst first.

Reads ``precision.jsonl`` from the run directory (the ``log_dir`` given to ``attach()``; see
``sinks/precision.py``) and prints, for every module output and gradient in every watched
format, its latest sampled step: the fractions that flush to zero, land in the subnormals and
saturate, the largest magnitude, the headroom in bits and the predicted steps to overflow.
``--json`` prints the same rows as a JSON list.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Optional

from ..precision.monitor import ROW_FIELDS
from ..sinks.precision import PRECISION_FILE

__all__ = ["latest_rows", "register", "render", "worst_first"]

_NO_ROWS = (
    "holds no {file}: the run watched no format (a float32 run watches none by default); "
    "pass attach(..., precision=('bf16', 'fp16', 'e4m3', 'e5m2')) to measure the headroom"
)


class RunDirError(Exception):
    """RUN_DIR is missing or holds no precision rows; the message says which."""


def read_rows(run_dir: str) -> list[dict[str, Any]]:
    """Every row of ``run_dir/precision.jsonl`` (a line cut short by a crash is skipped)."""
    if not os.path.isdir(run_dir):
        what = "is a file, not a directory" if os.path.exists(run_dir) else "does not exist"
        raise RunDirError(f"{run_dir} {what}; pass the log_dir given to torch_sentinel.attach()")
    path = os.path.join(run_dir, PRECISION_FILE)
    if not os.path.isfile(path):
        raise RunDirError(f"{run_dir} " + _NO_ROWS.format(file=PRECISION_FILE))
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict) or any(k not in row for k in ROW_FIELDS):
                    raise ValueError("not a precision row")
                rows.append({k: row[k] for k in ROW_FIELDS})
            except ValueError as exc:
                print(f"torch-sentinel: skipping {path}:{lineno}: {exc}", file=sys.stderr)
    return rows


def latest_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest sampled step of each (module, tensor, format)."""
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["module"], row["tensor"], row["format"])
        if key not in latest or row["step"] >= latest[key]["step"]:
            latest[key] = row
    return list(latest.values())


def worst_first(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Saturated first, then the nearest predicted overflow, then the most flushed, then the
    least headroom."""

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        ahead = r["steps_to_overflow"]
        headroom = r["headroom_bits"]
        return (-r["saturated"], math.inf if ahead is None else ahead, -r["flushed"], -r["subnormal"],
                math.inf if headroom is None else headroom, r["module"], r["tensor"], r["format"])

    return sorted(rows, key=key)


def _percent(value: float) -> str:
    return "0" if value == 0 else f"{value * 100:.3g}%"


def _number(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(run_dir: str, rows: list[dict[str, Any]]) -> str:
    """The table, one line per row, in the order given."""
    header = ("module", "tensor", "format", "step", "flushed", "subnormal", "saturated", "amax",
              "headroom", "overflow in")
    table = [header]
    for r in rows:
        ahead = r["steps_to_overflow"]
        table.append((
            r["module"] or "<model>", r["tensor"], r["format"], str(r["step"]), _percent(r["flushed"]),
            _percent(r["subnormal"]), _percent(r["saturated"]), _number(r["amax"], ".4g"),
            _number(r["headroom_bits"], "+.1f"),
            "-" if ahead is None else ("now" if ahead == 0 else f"{ahead} steps"),
        ))
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    numeric = set(range(3, len(header)))
    lines = [f"run: {run_dir} ({len(rows)} tensor x format rows at their latest sampled step, worst first)"]
    for line in table:
        cells = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))]
        lines.append("  ".join(cells).rstrip())
    lines.append("flushed, subnormal, saturated: fractions of the tensor's elements; headroom: log2(format max / amax)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        rows = worst_first(latest_rows(read_rows(args.run_dir)))
    except RunDirError as exc:
        print(f"torch-sentinel precision: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(render(args.run_dir, rows))
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "precision",
        help="print each tensor's low-precision headroom, worst first",
        description="Print, from a run's precision.jsonl, each module output's and gradient's "
        "figures in every watched format (bf16, fp16, e4m3, e5m2) at its latest sampled step: "
        "fractions flushed to zero, subnormal and saturated, the largest magnitude, the headroom "
        "in bits and the predicted steps to overflow, worst first.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the log_dir given to attach()")
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    parser.set_defaults(func=run)
