"""What differs between two runs' manifests, grouped into factors, and whether the rule
"one change at a time" held."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

__all__ = ["Change", "ManifestDiff", "diff_manifests"]

#: Fields that differ between any two runs and say nothing about the experiment.
_IGNORED = ("created", "cwd", "rank", "git.root", "result.")
#: Context that follows from other changes (a different command line sets a different lr);
#: counted as a factor only when nothing else explains the difference.
_CONTEXT = ("command",)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = value
    return out


def _factor(key: str) -> str:
    """The experimental factor a manifest field belongs to."""
    parts = key.split(".")
    if parts[0] == "optimizers":
        # optimizers.0.param_groups.1.lr -> optimizer.lr (one factor whatever the group)
        if len(parts) >= 5 and parts[2] == "param_groups":
            return f"optimizer.{parts[4]}"
        return "optimizer." + ".".join(parts[2:]) if len(parts) > 2 else "optimizer"
    if parts[0] in ("versions", "devices", "determinism"):
        return f"{parts[0]}.{parts[1]}" if len(parts) > 1 else parts[0]
    if parts[0] == "git":
        return "code"
    if parts[0] == "seed_source":
        return "seed"
    return parts[0]


@dataclasses.dataclass(frozen=True)
class Change:
    key: str
    factor: str
    a: Any
    b: Any


@dataclasses.dataclass
class ManifestDiff:
    """``changes`` field by field; ``factors`` the experimental factors they amount to."""

    changes: list[Change]
    result_a: dict[str, Any]
    result_b: dict[str, Any]
    names: tuple[str, str] = ("A", "B")

    @property
    def factors(self) -> list[str]:
        real = sorted({c.factor for c in self.changes if c.factor not in _CONTEXT})
        if real:
            return real
        return sorted({c.factor for c in self.changes})

    @property
    def one_change(self) -> bool:
        return len(self.factors) <= 1

    def loss_comparison(self) -> Optional[str]:
        la, lb = self.result_a.get("final_loss"), self.result_b.get("final_loss")
        if not isinstance(la, (int, float)) and not isinstance(lb, (int, float)):
            return None
        def show(v: Any, r: dict[str, Any]) -> str:
            if not isinstance(v, (int, float)):
                return f"{v!r}"
            return f"{v:.6g} (step {r.get('final_loss_step')})"
        text = f"final loss: {self.names[0]} {show(la, self.result_a)}, {self.names[1]} {show(lb, self.result_b)}"
        if isinstance(la, (int, float)) and isinstance(lb, (int, float)):
            if la == lb:
                text += ": identical"
            else:
                rel = (lb - la) / abs(la) if la else math.inf
                text += f": B - A = {lb - la:+.4g} ({rel:+.2%})"
        return text

    def __str__(self) -> str:
        a, b = self.names
        lines = [f"torch-sentinel diff  A={a}  B={b}"]
        if not self.changes:
            lines.append("  no recorded factor differs")
        width = max([len(c.key) for c in self.changes] + [5])
        for c in sorted(self.changes, key=lambda c: (c.factor, c.key)):
            lines.append(f"  {c.key:{width}}  {_show(c.a)}  ->  {_show(c.b)}")
        factors = self.factors
        if factors:
            lines.append("")
            lines.append(f"changed factors ({len(factors)}): {', '.join(factors)}")
        if len(factors) > 1:
            lines.append(
                f"warning: {len(factors)} factors changed at once. Change one thing at a time: a "
                "difference in results cannot be traced to any one of them."
            )
        loss = self.loss_comparison()
        if loss:
            lines.append("")
            lines.append(loss)
        return "\n".join(lines)


def _show(value: Any) -> str:
    if isinstance(value, list):
        text = " ".join(map(str, value))
        return text if len(text) <= 80 else text[:77] + "..."
    return "<absent>" if value is _MISSING else repr(value)


_MISSING = object()


def diff_manifests(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str] = ("A", "B")) -> ManifestDiff:
    fa, fb = _flatten(a), _flatten(b)
    changes = []
    for key in sorted(set(fa) | set(fb)):
        if key.startswith(_IGNORED) or key in _IGNORED:
            continue
        va, vb = fa.get(key, _MISSING), fb.get(key, _MISSING)
        if va != vb:
            changes.append(Change(key, _factor(key), va, vb))
    return ManifestDiff(changes, dict(a.get("result") or {}), dict(b.get("result") or {}), names)
