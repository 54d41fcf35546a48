"""The evidence ladder: which rung fails first, and what to check next in the seeds' vocabulary.

What each finding kind means is declared by its producer: a detector's ``next_check`` and
``hypothesis`` class attributes (carried by every finding it gives), and :data:`KINDS` below for
the two kinds no detector gives (``non_finite``, raised at the step; ``shape_mismatch``, a note
on a shape error). This module orders findings along the ladder and falls back to each
rung's generic check for a finding that names none (one read back from an older file).

Cause over symptom: when one fault triggers several kinds, the kind on the cause side leads. The
ladder's order already puts most causes first (updates before curves: weights that never move
come before the loss that does not fall); where it does not (a learning rate too high, on the
updates rung, makes gradients explode on the gradients rung; accumulating gradients and an
explosion share a rung), a detector declares what it explains (``Detector.explains``) and
:func:`lead_order` moves each fault ahead of the faults it explains.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from typing import Optional

from .._findings import BOUNDARIES, Finding

__all__ = ["BOUNDARY_CHECKS", "BOUNDARY_HYPOTHESES", "HEALTHY_NEXT_CHECK", "KINDS", "KindInfo",
           "explains", "first_failing_boundary", "hypothesis_for", "kind_info", "lead_order", "next_check_for",
           "sort_key"]

HEALTHY_NEXT_CHECK = "continue_training_or_collect_more_evidence"


@dataclasses.dataclass(frozen=True)
class KindInfo:
    """What a finding kind tells the user: its rung, its next check and its hypothesis."""

    kind: str
    rung: str
    next_check: str
    hypothesis: str
    #: The kinds whose evidence a fault of this kind accounts for.
    explains: tuple[str, ...] = ()


#: The kinds that no detector gives.
KINDS: tuple[KindInfo, ...] = (
    KindInfo("non_finite", "forward", "inspect_first_nonfinite_module",
             "a NaN/Inf starts at this boundary and propagates downstream"),
    KindInfo("shape_mismatch", "shapes", "name_the_axes_and_fix_the_layer_contract",
             "the data/layer contract does not represent the intended operation"),
)

BOUNDARY_CHECKS: dict[str, str] = {
    "data": "inspect_data_and_targets",
    "shapes": "name_the_axes_and_fix_the_layer_contract",
    "forward": "inspect_forward_values",
    "loss": "inspect_loss_definition",
    "gradients": "inspect_backward_path",
    "updates": "inspect_optimizer_update",
    "curves": "investigate_generalization",
}

#: For kinds without their own hypothesis.
BOUNDARY_HYPOTHESES: dict[str, str] = {
    "data": "the batch is not what the model expects",
    "shapes": "the data/layer contract does not represent the intended operation",
    "forward": "a module computes something unintended from valid inputs",
    "loss": "the objective does not use the intended representation",
    "gradients": "the backward path is broken or badly scaled",
    "updates": "the optimizer does not move the parameters as intended",
    "curves": "learning itself goes wrong: stall, divergence or poor generalization",
}


@functools.cache
def _known() -> dict[str, KindInfo]:
    from ..detectors import builtin_detectors

    known = {k.kind: k for k in KINDS}
    for cls in builtin_detectors():
        known[cls.kind] = KindInfo(cls.kind, cls.rung, cls.next_check, cls.hypothesis, tuple(cls.explains))
    return known


def kind_info(kind: str) -> Optional[KindInfo]:
    """What a built-in kind means (None for a user's detector's kind)."""
    return _known().get(kind)


def _rank(boundary: str) -> int:
    return BOUNDARIES.index(boundary)


def first_failing_boundary(findings: Iterable[Finding]) -> Optional[str]:
    faults = [f for f in findings if f.is_fault]
    if not faults:
        return None
    return min((f.boundary for f in faults), key=_rank)


def explains(cause: str, symptom: str) -> bool:
    """Whether a fault of kind ``cause`` accounts for the evidence of kind ``symptom``."""
    info = kind_info(cause)
    return info is not None and symptom in info.explains


def lead_order(findings: Iterable[Finding]) -> list[Finding]:
    """Findings in ladder order (:func:`sort_key`), then each fault moved ahead of the faults
    whose kind it explains: the cause leads its symptoms."""
    ordered = sorted(findings, key=sort_key)
    for _ in range(len(ordered)):
        moved = False
        for i, f in enumerate(ordered):
            if not f.is_fault:
                continue
            first = next((j for j in range(i) if ordered[j].is_fault and explains(f.kind, ordered[j].kind)
                          and not explains(ordered[j].kind, f.kind)), None)
            if first is not None:
                ordered.insert(first, ordered.pop(i))
                moved = True
                break
        if not moved:
            break
    return ordered


def next_check_for(findings: Iterable[Finding]) -> str:
    """The next check of the leading fault: the first failing rung's most severe, earliest
    finding, unless another fault explains it (:func:`lead_order`)."""
    faults = lead_order(f for f in findings if f.is_fault)
    if not faults:
        return HEALTHY_NEXT_CHECK
    first = faults[0]
    info = kind_info(first.kind)
    return first.next_check or (info.next_check if info else "") or BOUNDARY_CHECKS[first.boundary]


def hypothesis_for(finding: Finding) -> str:
    info = kind_info(finding.kind)
    return finding.hypothesis or (info.hypothesis if info else "") or BOUNDARY_HYPOTHESES[finding.boundary]


def sort_key(f: Finding) -> tuple[int, int, int, str]:
    severity = {"error": 0, "warning": 1, "info": 2}[f.severity]
    return (_rank(f.boundary), severity, f.step if f.step is not None else 1 << 60, f.kind)
