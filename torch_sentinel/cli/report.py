"""``torch-sentinel report RUN_DIR``: the diagnosis of a finished (or running) job, from its files.

A run directory is the ``log_dir`` given to ``attach()``: ``findings.jsonl`` (always created,
empty when the run stayed healthy), ``manifest.json`` when recorded, and TensorBoard event
files, read for the number of steps and the final losses. A directory that holds several runs
(``torch-sentinel demo``'s output) is reported run by run.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import sys
from typing import Any, Optional

from .._findings import Finding
from ..diagnosis import Report
from ..sinks.jsonl import FINDINGS_FILE

__all__ = ["RunDirError", "RunFiles", "find_runs", "load_run", "register", "render"]

MANIFEST_FILE = "manifest.json"
_LOSS_TAGS = ("loss/train", "loss/validation")


class RunDirError(Exception):
    """RUN_DIR is missing or holds no torch_sentinel run; the message says which."""


@dataclasses.dataclass
class RunFiles:
    """What a run directory says about its run."""

    path: str
    report: Report
    manifest: dict[str, Any]
    #: Last logged value of each loss tag: ``{tag: (step, value)}``.
    final: dict[str, tuple[int, float]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": self.path,
            **self.report.to_dict(),
            "final": {tag: {"step": s, "value": v} for tag, (s, v) in self.final.items()},
            "manifest": self.manifest,
        }


def find_runs(run_dir: str) -> list[str]:
    """The run directories at or directly under ``run_dir``, sorted."""
    if not os.path.isdir(run_dir):
        what = "is a file, not a directory" if os.path.exists(run_dir) else "does not exist"
        raise RunDirError(f"{run_dir} {what}; pass the log_dir given to torch_sentinel.attach()")
    if os.path.isfile(os.path.join(run_dir, FINDINGS_FILE)):
        return [run_dir]
    runs = sorted(
        os.path.join(run_dir, d)
        for d in os.listdir(run_dir)
        if os.path.isfile(os.path.join(run_dir, d, FINDINGS_FILE))
    )
    if not runs:
        raise RunDirError(
            f"{run_dir} holds no torch_sentinel run: no {FINDINGS_FILE} in it or in its "
            "subdirectories; pass the log_dir given to torch_sentinel.attach()"
        )
    return runs


def _read_jsonl(path: str) -> tuple[list[Finding], list[dict[str, Any]]]:
    findings, notes = [], []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if row.get("kind") == "note":
                    notes.append(row)
                else:
                    findings.append(Finding.from_dict(row))
            except (ValueError, TypeError) as exc:
                # A line cut short by a crash must not hide the rest of the run.
                print(f"torch-sentinel: skipping {path}:{lineno}: {exc}", file=sys.stderr)
    return findings, notes


def _read_events(path: str) -> tuple[Optional[int], dict[str, tuple[int, float]]]:
    """The last step logged and the final losses, from the event files directly in ``path``."""
    if not glob.glob(os.path.join(path, "events.out.tfevents.*")):
        return None, {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 1, "images": 1})
    acc.Reload()
    last_step: Optional[int] = None
    final: dict[str, tuple[int, float]] = {}
    for tag in acc.Tags().get("scalars", []):
        events = acc.Scalars(tag)
        if not events:
            continue
        step = max(e.step for e in events)
        last_step = step if last_step is None else max(last_step, step)
        if tag in _LOSS_TAGS:
            last = max(events, key=lambda e: (e.step, e.wall_time))
            final[tag] = (int(last.step), float(last.value))
    return last_step, final


def load_run(path: str) -> RunFiles:
    findings, notes = _read_jsonl(os.path.join(path, FINDINGS_FILE))
    manifest: dict[str, Any] = {}
    manifest_path = os.path.join(path, MANIFEST_FILE)
    if os.path.isfile(manifest_path):
        with open(manifest_path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    last_step, final = _read_events(path)
    result = manifest.get("result")
    recorded = result.get("steps") if isinstance(result, dict) else None
    if isinstance(recorded, int):
        steps = recorded  # written at detach: exact
    else:  # a run still going, or killed: what its files show so far
        seen = [s for s in [last_step, *(f.step for f in findings)] if s is not None]
        steps = max(seen) + 1 if seen else 0
    if (
        not final
        and isinstance(result, dict)
        and isinstance(result.get("final_loss"), (int, float))
    ):
        step = result.get("final_loss_step")
        final["loss/train"] = (
            step if isinstance(step, int) else steps - 1,
            float(result["final_loss"]),
        )
    report = Report(findings=findings, steps=steps, notes=notes)
    return RunFiles(path=path, report=report, manifest=manifest, final=final)


def _seed(manifest: dict[str, Any]) -> Optional[Any]:
    if "seed" in manifest:
        return manifest["seed"]
    for value in manifest.values():
        if isinstance(value, dict) and "seed" in value:
            return value["seed"]
    return None


def render(run: RunFiles) -> str:
    """The text report: where the run is, what it ended at, then the ladder and findings."""
    lines = [f"run: {run.path}"]
    if run.manifest:
        seed = _seed(run.manifest)
        lines.append(f"manifest: {MANIFEST_FILE}" + (f" (seed {seed})" if seed is not None else ""))
    if run.final:
        ends = [
            f"{tag.split('/')[1]} {value:.4g} at step {step}"
            for tag, (step, value) in sorted(
                run.final.items(), key=lambda kv: _LOSS_TAGS.index(kv[0])
            )
        ]
        lines.append("final loss: " + ", ".join(ends))
    lines.append(str(run.report))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        runs = [load_run(p) for p in find_runs(args.run_dir)]
    except RunDirError as exc:
        print(f"torch-sentinel report: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        payload: Any = runs[0].to_dict() if len(runs) == 1 else [r.to_dict() for r in runs]
        print(json.dumps(payload, indent=2, sort_keys=False))
    else:
        print("\n\n".join(render(r) for r in runs))
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="print the diagnosis of a run from its log_dir",
        description="Print the diagnosis of a run from its log_dir: the evidence ladder, the "
        "findings with their evidence, and the next check.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the log_dir given to attach()")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.set_defaults(func=run)
