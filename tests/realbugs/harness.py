"""Run a realbugs program (buggy or fixed) and record what the sentinel said, and when.

A program is a module in ``programs/`` with:
- ``SOURCE``: where the bug was reported (URLs), and ``KIND`` / ``MODULE`` / ``CAUSE`` / ``ONSET``:
  the finding expected on the buggy run, the module it should name (``None`` when the bug has
  no place in the model), the likely cause a NonFiniteError should name first, and the
  optimizer step from which the fault is present;
- ``CLASS``: the mechanism the bug belongs to (a class is a mechanism, not a program: two
  reports of a missing ``zero_grad()`` are one class);
- optionally ``NEXT_CHECK``, the ``next_check`` the expected finding must carry where its kind
  can name opposite causes (``update_ratio``: "lower" or "raise" the learning rate), and
  ``contradicts(finding)``, which returns why the finding's stated cause contradicts the bug's
  ground truth (or None);
- ``run(bug, watch)``: the training program. It calls ``watch(sentinel)`` after every
  optimizer step, so the harness sees the step at which each finding became visible to the
  user (``reported``), not only the step the detector concluded on.

Expectations are written from the bug, not from what the sentinel says: a kind that no detector
has yet (``invalid_loss_input``, ``invalid_target``, ``shared_module``) is what a good diagnosis
of that bug names.
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

#: The corpus as issue 21 left it; the rest came with issue 25 (tables report them apart).
FIRST_CORPUS = frozenset({
    "eval_not_restored_after_validation", "head_replaced_after_optimizer", "layers_in_plain_list",
    "lbfgs_closure_without_zero_grad", "lr_too_high_nan", "missing_zero_grad", "mse_target_broadcast",
    "optimizer_over_frozen_layers", "relu_output_predicts_only_zeros", "sigmoid_before_bce_with_logits",
    "softmax_before_cross_entropy", "tensor_rebuilt_from_output", "wrong_lr_jumps_at_first_step",
})

#: At default settings a fault present from its onset is reported within this many steps.
LATENCY = 20


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


@dataclasses.dataclass
class Verdict:
    """How a buggy run's diagnosis compares with the bug's ground truth."""

    #: the first finding of the expected kind, or None
    finding: Optional[Finding]
    #: the sentinel step at which it became visible to the user
    reported: Optional[int]
    #: None where the program names no module; else whether the finding named it
    module_right: Optional[bool]
    #: None where the program states no cause; else whether the stated cause fits the bug
    cause_right: Optional[bool]
    #: each way the diagnosis falls short (empty: found, localised, right cause, in time)
    problems: list[str]

    @property
    def correct(self) -> bool:
        return not self.problems


def judge(program: ModuleType, out: Outcome) -> Verdict:
    """Judge a buggy run: the expected kind found, at the expected module, naming a cause its
    ground truth allows, within ``LATENCY`` steps of the onset."""
    f = out.first(program.KIND)
    if f is None:
        got = [(g.kind, g.module, g.step) for g in out.findings]
        return Verdict(None, None, None, None, [f"{program.KIND} not found; got {got}"])
    problems: list[str] = []
    module_right = None if program.MODULE is None else f.module == program.MODULE
    if module_right is False:
        problems.append(f"module {f.module!r}, want {program.MODULE!r}")
    causes: list[bool] = []
    nan = out.first("non_finite")
    if program.CAUSE is not None and nan is not None:  # the NaN, if it came, names the cause first
        got_cause = nan.evidence.get("likely_cause")
        causes.append(got_cause == program.CAUSE)
        if got_cause != program.CAUSE:
            problems.append(f"likely cause {got_cause!r}, want {program.CAUSE!r}")
    want_next = getattr(program, "NEXT_CHECK", None)
    if want_next is not None:
        causes.append(f.next_check == want_next)
        if f.next_check != want_next:
            problems.append(f"next check {f.next_check!r}, want {want_next!r}")
    contradicts = getattr(program, "contradicts", None)
    if contradicts is not None:
        reason = contradicts(f)
        causes.append(reason is None)
        if reason is not None:
            problems.append(reason)
    reported = out.reported_step(f)
    if reported is None or reported - program.ONSET > LATENCY:
        problems.append(f"reported at step {reported}, onset {program.ONSET} (latency limit {LATENCY})")
    if f.onset_step is None or (reported is not None and f.onset_step > reported):
        problems.append(f"onset_step {f.onset_step} after the reported step {reported}")
    return Verdict(f, reported, module_right, all(causes) if causes else None, problems)
