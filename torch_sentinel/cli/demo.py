"""``torch-sentinel demo [--out DIR]``: the seeds' lab as real small trainings.

Each case trains a tiny model with one planted bug and prints ``name -> diagnosis`` and a line
of evidence; each writes a TensorBoard run under ``DIR/<case>``. The last line is the command
that opens TensorBoard on all of them.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import shlex
import sys
import time
import warnings
from typing import Any, Optional

import torch

from ..diagnosis import Report
from ..sinks.jsonl import FINDINGS_FILE
from .demo_cases import CASES, Case

__all__ = ["evidence_line", "register", "run_case"]


def evidence_line(report: Report) -> str:
    """The first fault's symptom, where it was seen; for a healthy run, what was watched."""
    faults = [f for f in report.findings if f.is_fault]
    if not faults:
        return f"no fault in {report.steps} step(s); every rung of the ladder stayed quiet"
    f = faults[0]
    where = f.kind + (f" at step {f.step}" if f.step is not None else "")
    return f"{where}: {f.message.splitlines()[0]}"


def _clear(run_dir: str) -> None:
    """Remove what an earlier demo wrote here (only those files), so reruns do not pile up."""
    ours = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    ours += [os.path.join(run_dir, FINDINGS_FILE), os.path.join(run_dir, "manifest.json")]
    for path in ours:
        if os.path.isfile(path):
            os.remove(path)


def run_case(case: Case, out: str) -> Report:
    run_dir = os.path.join(out, case.name)
    os.makedirs(run_dir, exist_ok=True)
    _clear(run_dir)
    return case.train(run_dir)


def run(args: argparse.Namespace) -> int:
    cases = [c for c in CASES if not args.only or c.name in args.only]
    out = args.out
    width = max(len(c.name) for c in cases)
    print(
        f"torch-sentinel demo: {len(cases)} small trainings, one planted bug each; "
        f"TensorBoard runs go to {out}/",
        flush=True,
    )
    sentinel_logger = logging.getLogger("torch_sentinel")
    level: Optional[int] = sentinel_logger.level
    # The demo prints its own one-line diagnoses; the per-finding log lines would repeat them.
    sentinel_logger.setLevel(logging.CRITICAL)
    # Models this small only lose from intra-op threads, badly so on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    mismatches = 0
    started = time.perf_counter()
    try:
        for i, case in enumerate(cases, 1):
            print(
                f"[{i}/{len(cases)}] {case.name}: bug: {case.bug} ...", file=sys.stderr, flush=True
            )
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = run_case(case, out)
            took = time.perf_counter() - t0
            line = f"{case.name:<{width}} -> {report.next_check}"
            if report.next_check != case.expected:
                mismatches += 1
                line += f"   (the lab expects {case.expected})"
            print(line)
            print(f"{'':<{width}}    evidence: {evidence_line(report)}  [{took:.1f} s]", flush=True)
    finally:
        sentinel_logger.setLevel(level or logging.NOTSET)
        torch.set_num_threads(threads)
    print(
        f"\n{len(cases)} run(s) in {time.perf_counter() - started:.1f} s. "
        f"Details: torch-sentinel report {shlex.quote(out)}/<case>"
    )
    print("Open TensorBoard on them:")
    print(f"  tensorboard --logdir {shlex.quote(out)}")
    return 1 if mismatches else 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="diagnose the lab's cases as real small trainings",
        description="Train tiny models with one planted bug each (shape, dead_relu, no_update, "
        "overfit, nonfinite, and a healthy control), print each diagnosis with its evidence, "
        "and write one TensorBoard run per case.",
    )
    parser.add_argument(
        "--out",
        default="sentinel_demo",
        metavar="DIR",
        help="where the TensorBoard runs go (default: %(default)s)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=[c.name for c in CASES],
        metavar="CASE",
        help="run only these cases: " + ", ".join(c.name for c in CASES),
    )
    parser.set_defaults(func=run)
