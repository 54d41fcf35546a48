"""Findings: what a detector concluded, with the numbers that made it conclude so."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, Optional

__all__ = ["BOUNDARIES", "Boundary", "Finding", "Severity"]

Boundary = Literal["data", "shapes", "forward", "loss", "gradients", "updates", "curves"]

#: The evidence ladder, in the order it is walked: the first rung with wrong evidence decides
#: the next check.
BOUNDARIES: tuple[Boundary, ...] = (
    "data",
    "shapes",
    "forward",
    "loss",
    "gradients",
    "updates",
    "curves",
)

Severity = Literal["error", "warning", "info"]
_SEVERITIES = ("error", "warning", "info")


def _plain(value: Any) -> Any:
    """Evidence must be JSON-ready plain numbers: no tensors, no numpy scalars."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "item") and callable(value.item):  # numpy scalar (never a live tensor here)
        return _plain(value.item())
    return str(value)


@dataclasses.dataclass(frozen=True)
class Finding:
    """One diagnosed fault or observation.

    ``kind`` is a stable public name (users filter on it); ``boundary`` is a rung of the ladder;
    ``module`` is a qualified name relative to the attached model, or None; ``step`` is 0-based:
    the step at which the detector concluded. ``onset_step`` is the step where the evidence
    began (the first still step, the first step of the climb, the first dead window): the fault
    is at least that old, and ``step - onset_step`` is the detector's latency.
    ``evidence`` holds the figures (fractions, norms, ratios, steps) behind the message, and
    ``next_check`` the next action in the ladder's vocabulary.
    """

    kind: str
    boundary: Boundary
    message: str
    module: Optional[str] = None
    step: Optional[int] = None
    severity: Severity = "warning"
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)
    next_check: Optional[str] = None
    rank: Optional[int] = None
    onset_step: Optional[int] = None
    #: The one-line hypothesis the evidence supports (the detector's), for the report.
    hypothesis: Optional[str] = None

    def __post_init__(self) -> None:
        if self.boundary not in BOUNDARIES:
            raise ValueError(f"unknown boundary {self.boundary!r}; expected one of {BOUNDARIES}")
        if self.severity not in _SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}; expected one of {_SEVERITIES}")
        object.__setattr__(self, "evidence", _plain(dict(self.evidence)))
        if self.onset_step is None and self.step is not None:
            # a detector that knows no earlier evidence concluded on the step it saw it
            object.__setattr__(self, "onset_step", self.step)
        elif self.onset_step is not None and self.step is not None and self.onset_step > self.step:
            object.__setattr__(self, "onset_step", self.step)

    @property
    def is_fault(self) -> bool:
        """Errors and warnings are faults; info findings are observations."""
        return self.severity != "info"

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if out["hypothesis"] is None:
            del out["hypothesis"]  # findings written before detectors carried one read the same
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def __str__(self) -> str:
        where = f" in {self.module}" if self.module else ""
        at = f" at step {self.step}" if self.step is not None else ""
        return f"[{self.severity}] {self.kind} ({self.boundary}){where}{at}: {self.message}"
