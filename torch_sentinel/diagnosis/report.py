"""The Report returned by ``Sentinel.report()``: findings along the ladder, read top to bottom."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

from .._findings import BOUNDARIES, Finding
from .ladder import hypothesis_for, lead_order, next_check_for
from .spikes import LONG_EVIDENCE, spike_timeline

__all__ = ["Report"]

def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list) and len(value) > 8:
        return "[" + ", ".join(_fmt(v) for v in value[:8]) + f", … {len(value) - 8} more]"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


@dataclasses.dataclass
class Report:
    """What the sentinel concluded.

    ``boundary`` is the rung of the leading fault (None when healthy): the first failing rung
    of the ladder, unless a fault on a later rung explains it (cause over symptom:
    ``ladder.lead_order``); ``next_check`` is that fault's next action, ``ok`` whether no fault
    was found. Findings are kept in that order: the cause first.
    """

    findings: list[Finding]
    steps: int = 0
    notes: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.findings = lead_order(self.findings)

    @property
    def boundary(self) -> Optional[str]:
        lead = next((f for f in self.findings if f.is_fault), None)
        return lead.boundary if lead is not None else None

    @property
    def ok(self) -> bool:
        return not any(f.is_fault for f in self.findings)

    @property
    def next_check(self) -> str:
        return next_check_for(self.findings)

    def by_kind(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    def kinds(self) -> set[str]:
        return {f.kind for f in self.findings}

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "boundary": self.boundary,
            "next_check": self.next_check,
            "steps": self.steps,
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def __str__(self) -> str:
        lines = [f"torch_sentinel diagnosis after {self.steps} step(s)"]
        first = self.boundary
        for b in BOUNDARIES:
            here = [f for f in self.findings if f.boundary == b]
            faults = [f for f in here if f.is_fault]
            if faults:
                mark = "FAIL"
            elif here:
                mark = "note"
            else:
                mark = "ok"
            arrow = "  <- first failing boundary" if b == first else ""
            lines.append(f"  {b:10s} {mark}{arrow}")
        if not self.findings:
            lines.append("")
            lines.append("No faults found.")
        for f in self.findings:
            lines.append("")
            where = f" in {f.module or '<model>'}" if f.module is not None else ""
            at = f" at step {f.step}" if f.step is not None else ""
            lines.append(f"[{f.severity}] {f.kind} ({f.boundary}){where}{at}")
            lines.append(f"  symptom:    {f.message}")
            if f.evidence:
                ev = ", ".join(f"{k}={_fmt(v)}" for k, v in f.evidence.items()
                               if v is not None and k not in LONG_EVIDENCE)
                lines.append(f"  evidence:   {ev}")
            timeline = spike_timeline(f)
            if timeline:
                lines.append("  timeline:")
                lines.extend(f"    {line}" for line in timeline)
            hyp = hypothesis_for(f)
            if hyp:
                lines.append(f"  hypothesis: {hyp}")
            if f.next_check:
                lines.append(f"  next check: {f.next_check}")
        for note in self.notes:
            lines.append("")
            lines.append(f"[note] step {note.get('step')}: " + ", ".join(
                f"{k}={v}" for k, v in note.items() if k not in ("step", "kind") and v))
        lines.append("")
        lines.append(f"next check: {self.next_check}")
        return "\n".join(lines)
