"""Run one loss case with the one-line attach, and say whether the sentinel said what it should.

A case trains its small model for ``STEPS`` optimizer steps with Adam, the sentinel attached in
the usual one line, and reads the findings from ``report()``. A finding *matches* a misuse when
its kind is the expected one and its ``evidence["clause"]`` names the expected clause; a healthy
case must produce no finding about the loss (none of :data:`LOSS_KINDS`, whatever its severity)
and no fault at all. (An info finding of another kind is allowed: issue 25 asks for one at attach
on every embedding with a ``padding_idx``, e.g. BERT's word embeddings; before that rule this
harness asked for no finding at all.)
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Optional

import torch
from losses.cases import CASES, Case
from losses.tasks import criterion

import torch_sentinel
from torch_sentinel import Finding

if TYPE_CHECKING:
    from losses.frameworks import FrameworkCase

STEPS = 30
#: The kinds a loss case speaks to: a healthy case must produce none of them, not even as info.
LOSS_KINDS = frozenset({"invalid_loss_input", "invalid_target", "loss_broadcast", "probabilities_as_logits"})


@dataclasses.dataclass
class Outcome:
    findings: list[Finding]
    error: Optional[BaseException] = None

    def got(self) -> str:
        """What the run said, for the table: ``kind/clause`` per finding (``kind`` when the
        finding names no clause), or the error that escaped."""
        if self.error is not None:
            return f"raised {type(self.error).__name__}"
        if not self.findings:
            return "quiet"
        seen = []
        for f in self.findings:
            clause = f.evidence.get("clause")
            label = f"{f.kind}/{clause}" if clause else f.kind
            label += f" ({f.severity})"
            if label not in seen:
                seen.append(label)
        return ", ".join(seen)


def matches(finding: Finding, expect: tuple[str, str], clause_required: bool = True) -> bool:
    kind, clause = expect
    if finding.kind != kind:
        return False
    return finding.evidence.get("clause") == clause or not clause_required


def verdict(case: Case | FrameworkCase, outcome: Outcome, clause_required: bool = True) -> bool:
    """Whether the run said what the case expects."""
    if case.raises is not None:
        return isinstance(outcome.error, case.raises)
    if outcome.error is not None:
        return False
    if case.expect is None:
        return not [f for f in outcome.findings if f.is_fault or f.kind in LOSS_KINDS]
    return any(matches(f, case.expect, clause_required) for f in outcome.findings)


def run(case: Case, form: str, steps: int = STEPS) -> Outcome:
    """Train ``case`` in ``form`` with the sentinel attached; the findings it reported."""
    torch.manual_seed(0)
    model = case.build()
    crit = None if form == "in-model" else criterion(case.loss, form, **case.kwargs)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    sentinel = torch_sentinel.attach(model, opt, **case.attach)  # the one line
    error: Optional[BaseException] = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own broadcast warning, among others
            for _ in range(steps):
                batch = case.batch(g)
                opt.zero_grad()
                loss = case.step(crit, model, batch)  # type: ignore[arg-type]
                loss.backward()
                opt.step()
    except Exception as exc:  # a misuse torch refuses; or a NonFiniteError
        error = exc
    findings = sentinel.report().findings
    sentinel.detach()
    return Outcome(list(findings), error)


def params() -> list[tuple[Case, str]]:
    return [(case, form) for case in CASES for form in case.forms]


def case_id(case: Case, form: str) -> str:
    return f"{case.name}[{form}]"
