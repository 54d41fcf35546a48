"""Findings and the run manifest as what TensorBoard's text and HParams plugins take."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .._findings import Finding
from ..diagnosis.ladder import hypothesis_for, kind_info, next_check_for
from ..diagnosis.spikes import LONG_EVIDENCE
from .step_scalars import module_tag

__all__ = ["finding_markdown", "flat_hparams"]

#: The HParams plugin shows at most this many manifest leaves; the rest stay in run/manifest.
_MAX_HPARAMS = 200


def finding_markdown(findings: Sequence[Finding]) -> str:
    """Findings of one kind at one step, as the text plugin's markdown."""
    parts = []
    for f in findings:
        where = f" in `{module_tag(f.module)}`" if f.module is not None else ""
        lines = [
            f"**[{f.severity}] {f.kind}** ({f.boundary}){where}",
            "",
            f.message.replace("\n", "  \n"),
        ]
        if f.evidence:
            ev = ", ".join(
                f"{k}={v}"
                for k, v in f.evidence.items()
                if v is not None and k not in LONG_EVIDENCE
            )
            lines += ["", f"evidence: `{ev}`"]
        if f.hypothesis or kind_info(f.kind) is not None:
            lines += ["", f"hypothesis: {hypothesis_for(f)}"]
        if f.is_fault:
            lines += ["", f"next check: `{next_check_for([f])}`"]
        parts.append("\n".join(lines))
    return "\n\n---\n\n".join(parts)


def flat_hparams(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's scalar leaves as ``a/b/c`` keys, the types the HParams plugin takes."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if len(out) >= _MAX_HPARAMS:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}" if prefix else str(k), v)
        elif isinstance(value, (bool, int, float, str)):
            out[prefix] = value
        elif value is not None:
            out[prefix] = json.dumps(value, default=str)

    walk("", manifest)
    return out
