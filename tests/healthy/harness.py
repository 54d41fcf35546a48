"""Shared driver for the outside healthy corpus (issue 25): run one program, keep what it produced.

Each program in ``tests/healthy/programs/`` is a healthy training script modelled on public
training code. It defines:

- ``MODELLED_ON``: the URL of the public program it follows (its docstring says how and why
  the run is healthy);
- ``run(steps=300, log_dir=None, progress=None) -> torch_sentinel.Report``: seeds torch, builds
  its data synthetically, attaches the sentinel as a user would, trains ``steps`` optimizer
  steps and returns ``sentinel.report()``. When ``progress`` is a list, the program appends a
  measure of how well it is doing where lower is better (the loss, or minus the episode length
  for RL, or a distance to the data for a GAN): the "it learns" check reads it. Passing it never
  changes what the program or the sentinel does.

A finding of severity warning or error on any of them is a false alarm: info is allowed.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import pathlib
import time
import warnings
from types import ModuleType
from typing import Optional

import torch_sentinel
from torch_sentinel import Finding

PROGRAMS_DIR = pathlib.Path(__file__).parent / "programs"
STEPS = 300
#: the last tenth of the progress measure must sit this far (relative to the first tenth's
#: magnitude) below the first tenth: "it learns"
LEARNING_MARGIN = 0.1


@dataclasses.dataclass
class Outcome:
    """What one run produced."""

    report: Optional[torch_sentinel.Report]
    progress: list[float]
    error: Optional[BaseException]
    seconds: float

    @property
    def faults(self) -> list[Finding]:
        """Findings of severity warning or error (a healthy run must have none)."""
        return [] if self.report is None else [f for f in self.report.findings if f.is_fault]

    def learned(self) -> tuple[bool, str]:
        """The mean of the last tenth of ``progress`` against the mean of the first tenth."""
        k = max(1, len(self.progress) // 10)
        head = sum(self.progress[:k]) / k
        tail = sum(self.progress[-k:]) / k
        return tail < head - LEARNING_MARGIN * abs(head), f"{head:.4g} -> {tail:.4g} over {len(self.progress)} points"


def program_names() -> list[str]:
    return sorted(p.stem for p in PROGRAMS_DIR.glob("*.py") if not p.stem.startswith("_"))


def load(name: str) -> ModuleType:
    return importlib.import_module(f"healthy.programs.{name}")


def execute(name: str, log_dir: Optional[pathlib.Path] = None, steps: int = STEPS) -> Outcome:
    """Run one program in-process; an exception is captured (a healthy run must raise none)."""
    progress: list[float] = []
    report: Optional[torch_sentinel.Report] = None
    error: Optional[BaseException] = None
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        try:
            report = load(name).run(steps, None if log_dir is None else str(log_dir), progress)
        except Exception as exc:
            error = exc
        finally:
            logging.disable(logging.NOTSET)
    return Outcome(report, progress, error, time.perf_counter() - start)


def describe(finding: Finding) -> dict[str, object]:
    """One finding as a row of the first-run table."""
    return {"kind": finding.kind, "severity": finding.severity, "module": finding.module,
            "step": finding.step, "message": finding.message[:120]}


__all__ = ["LEARNING_MARGIN", "STEPS", "Outcome", "describe", "execute", "load", "program_names", "render_table"]


def render_table(rows: list[dict[str, object]]) -> str:
    """The markdown table of a run from the JSON lines the test writes (``HEALTHY_OUTSIDE_TABLE``):
    one row per program and mode, its warning/error findings or "quiet"."""
    lines = ["| program | mode | findings of severity warning or error (kind, module, step: message) |",
             "|---|---|---|"]
    flagged: dict[str, set[str]] = {}
    for row in sorted(rows, key=lambda r: (str(r["program"]), str(r["mode"]))):
        faults = row["faults"]
        assert isinstance(faults, list)
        cells = [f"**{f['kind']}** ({f['severity']}), module {_module(f['module'])}, step {f['step']}: "
                 f"{f['message']!s}".replace("|", "\\|").replace("<", "&lt;") for f in faults]
        if row.get("error"):
            cells.append(f"**raised** {row['error']}")
        if cells:
            flagged.setdefault(str(row["mode"]), set()).add(str(row["program"]))
        lines.append(f"| {row['program']} | {row['mode']} | {'<br>'.join(cells) or 'quiet'} |")
    programs = {str(r["program"]) for r in rows}
    either = set().union(*flagged.values()) if flagged else set()
    lines.append("")
    for mode in sorted({str(r["mode"]) for r in rows}):
        lines.append(f"- {mode}: {len(flagged.get(mode, set()))} / {len(programs)} programs with a warning or error")
    lines.append(f"- either mode: {len(either)} / {len(programs)} programs with a warning or error")
    return "\n".join(lines)


def _module(module: object) -> str:
    return "-" if module is None else "(root)" if module == "" else f"`{module}`"


if __name__ == "__main__":
    import json
    import sys

    text = pathlib.Path(sys.argv[1]).read_text()
    print(render_table([json.loads(line) for line in text.splitlines() if line.strip()]))
