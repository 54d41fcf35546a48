"""Run a realbugs program (buggy or fixed) and record what the sentinel said, and when.

A program is a module in ``programs/`` with:
- ``SOURCE``: where the bug was reported (URLs), and ``KIND`` / ``MODULE`` / ``CAUSE`` / ``ONSET``:
  the finding expected on the buggy run, the module it should name (``None`` when the bug has
  no place in the model), the likely cause a NonFiniteError should name first, and the
  optimizer step from which the fault is present;
- ``run(bug, watch)``: the training program. It calls ``watch(sentinel)`` after every
  optimizer step, so the harness sees the step at which each finding became visible to the
  user (``reported``), not only the step the detector concluded on.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import pathlib
import warnings
from types import ModuleType
from typing import Any, Optional

import torch_sentinel
from torch_sentinel import Finding
from torch_sentinel.detectors.base import RunContext
from torch_sentinel.detectors.nonfinite import NonFiniteDiagnosis

PROGRAMS = sorted(p for p in (pathlib.Path(__file__).parent / "programs").glob("*.py") if not p.name.startswith("_"))


def load(path: pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"realbugs_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclasses.dataclass
class Outcome:
    findings: list[Finding]
    #: (kind, module) -> the sentinel's step when that finding first became visible
    reported: dict[tuple[str, Optional[str]], int]
    error: Optional[torch_sentinel.NonFiniteError] = None

    @property
    def faults(self) -> list[Finding]:
        return [f for f in self.findings if f.is_fault]

    def first(self, kind: str) -> Optional[Finding]:
        hits = [f for f in self.findings if f.kind == kind]
        return hits[0] if hits else None

    def reported_step(self, f: Finding) -> Optional[int]:
        if f.kind == "non_finite":
            return f.step  # raised on the training thread at that step
        return self.reported.get((f.kind, f.module))


def execute(program: ModuleType, bug: bool) -> Outcome:
    reported: dict[tuple[str, Optional[str]], int] = {}
    last = [0]
    seen: list[Finding] = []

    def watch(sentinel: Any) -> None:
        last[0] = sentinel.step
        seen[:] = sentinel.findings
        for f in sentinel.findings:
            reported.setdefault((f.kind, f.module), sentinel.step - 1)

    error = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            report = program.run(bug, watch)
            findings = list(report.findings)
        except torch_sentinel.NonFiniteError as err:
            error = err
            # what the user had been told before the raise, then the raise itself
            findings = [*seen, NonFiniteDiagnosis(RunContext([], {}, [], {}, set(), list)).finding(err)]
        finally:
            logging.disable(logging.NOTSET)
    for f in findings:  # found only when the run ended (report() / finish())
        reported.setdefault((f.kind, f.module), last[0])
    return Outcome(findings, reported, error)
