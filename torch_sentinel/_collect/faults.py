"""What an immediate-mode check hands to the Sentinel: a :class:`Fault` (the policy is applied there)."""

from __future__ import annotations

from typing import Any, Optional

from .._record import TensorEvidence

__all__ = ["DATA_SHAPE_KEYS", "Fault", "weight_fault"]

#: meta.shapes keys of the main and the extra model inputs (module slots are >= 0).
DATA_SHAPE_KEYS = (-1, -2)


class Fault:
    """A hook found a non-finite value in immediate mode; the Sentinel applies the policy."""

    __slots__ = ("boundary", "detail", "evidence", "module", "step")

    def __init__(
        self,
        step: int,
        boundary: str,
        module: Optional[str],
        evidence: TensorEvidence,
        detail: dict[str, Any],
    ) -> None:
        self.step = step
        self.boundary = boundary
        self.module = module
        self.evidence = evidence
        self.detail = detail


def weight_fault(step: int, module: Optional[str], parameter: str, norm: Optional[float],
                 evidence: Optional[TensorEvidence] = None) -> Fault:
    """Weights found non-finite at the start of ``step``: the update of the step before made
    them (at step 0: the initial weights, or a checkpoint, were already non-finite)."""
    detail: dict[str, Any] = {"present": "non-finite parameter after the optimizer step", "parameter": parameter}
    if norm is not None:
        detail["param_norm"] = norm
    if step == 0:
        detail["present"] = "non-finite parameter before the first step (initialisation or checkpoint)"
    return Fault(max(step - 1, 0), "updates", module, evidence or TensorEvidence(), detail)
