"""From a loss call's figures to a verdict per clause, on the host, at flush.

:class:`ContractJudge` takes plain numbers: each probed call's host facts (:class:`LossCall`)
with the figures its device checks left in the step's row. Per call site and clause it counts
the probed calls where the clause held and where it was broken, and concludes once:

- a clause read from host facts alone (``loss_broadcast``; ``class_dim`` from a softmax's dim)
  at its first breach: the fact is exact;
- a clause read from device figures when it was broken on at least ``min_probes`` probed steps
  and on at least half of them, so one odd batch never decides.

Severity is ``warning`` when the figures leave one reading (every row of an ``nll_loss`` input
log-sum-exps far from 0; a target outside [0, 1]), ``info`` when the fact admits a healthy
reading (only some rows off 0; an (N, L, C) Linear output read with classes at dim 1 could be a
per-class Linear over time; KL rows over a dim guessed as the last). ``loss_broadcast`` keeps
its ``error``.

When one call breaks several clauses, the most specific cause is named alone: probabilities fed
to ``nll_loss`` break ``log_probabilities`` too, but the cause is ``probabilities_as_logits``;
log-probabilities over the wrong dim break it too, but the cause is ``class_dim``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from .calls import NONNEGATIVE_OPS, LossCall
from .contracts import CLAUSES, by_function
from .messages import explain

__all__ = ["ContractJudge", "Limits", "Verdict"]


@dataclasses.dataclass(frozen=True)
class Limits:
    """Thresholds; the detectors pass their own (``attach(thresholds=...)``)."""

    #: Largest |row sum - 1| (or |log-sum-exp|) of a float32 tensor read as normalised.
    tolerance: float = 1e-3
    #: Probed steps on which a figure-read clause must be broken before it is reported.
    min_probes: int = 3


@dataclasses.dataclass(frozen=True)
class Verdict:
    kind: str
    clause: str
    loss: str
    site: str
    module: Optional[str]
    severity: str
    message: str
    step: int
    onset: int
    evidence: dict[str, Any]


#: Clauses concluded from host facts at their first breach.
_HOST_CLAUSES = ("loss_broadcast",)


@dataclasses.dataclass
class _Tally:
    """One (site, clause): how often it was judged and broken, and the latest breach."""

    probes: int = 0
    broken: int = 0
    steps: list[int] = dataclasses.field(default_factory=list)
    worst: dict[str, Any] = dataclasses.field(default_factory=dict)
    severity: str = "warning"
    call: Optional[LossCall] = None
    host_fact: bool = False
    done: bool = False


def _tol(call: LossCall, limits: Limits) -> float:
    half = call.input_dtype in ("float16", "bfloat16")
    return max(limits.tolerance, 2e-2) if half else limits.tolerance


def _get(f: dict[str, Optional[float]], name: str) -> Optional[float]:
    v = f.get(name)
    return v if v is not None and math.isfinite(v) else None


def judge_call(call: LossCall, f: dict[str, Optional[float]], limits: Limits) -> dict[str, Optional[tuple[str, dict[str, Any]]]]:
    """Each applicable clause of one call: None when it held, ``(severity, figures)`` when broken."""
    contract = by_function(call.loss)
    clauses = contract.clauses if contract is not None else ()
    tol = _tol(call, limits)
    out: dict[str, Optional[tuple[str, dict[str, Any]]]] = {}
    x_min, x_max, dev = _get(f, "x_min"), _get(f, "x_max"), _get(f, "x_sum_dev_max")
    if "probabilities_as_logits" in clauses and x_min is not None:
        if call.loss == "binary_cross_entropy_with_logits":
            # logits of a fresh model can all lie in [0, 1] by chance: only a sigmoid's output counts
            prob = x_min >= 0.0 and x_max is not None and x_max <= 1.0 and call.producer == "sigmoid"
        else:
            prob = dev is not None and x_min >= 0.0 and dev <= tol
        out["probabilities_as_logits"] = ("warning", {"min": x_min, "max": x_max, "max_rowsum_deviation": dev}) \
            if prob else None
    if "class_dim" in clauses and call.class_dim is not None:
        out["class_dim"] = _class_dim(call)
    if "log_probabilities" in clauses and _get(f, "x_lse_off") is not None:
        off = _get(f, "x_lse_off") or 0.0
        positive = call.loss == "kl_div" and x_max is not None and x_max > tol
        broken = off >= 0.5 or positive
        # every row off 0 (scores, not log-probabilities), or a positive "log-probability": one reading
        every_row = off >= 0.999 and call.dim_known
        severity = "warning" if positive or every_row else "info"
        figs = {"lse_min": _get(f, "x_lse_lo"), "lse_max": _get(f, "x_lse_hi"), "rows_off": off,
                "min": x_min, "max": x_max}
        already = out.get("probabilities_as_logits") or out.get("class_dim")
        out["log_probabilities"] = (severity, figs) if broken and not already else None
    if "log_input" in clauses and x_min is not None:
        log_input = bool(call.option("log_input", True))
        rate_op = call.producer in NONNEGATIVE_OPS
        broken = (log_input and rate_op and x_min >= 0.0) or (not log_input and x_min < 0.0)
        out["log_input"] = ("warning", {"min": x_min, "max": x_max, "log_input": log_input}) if broken else None
    if "loss_broadcast" in clauses:
        out["loss_broadcast"] = ("error", {}) if call.broadcast_shape is not None else None
    t_min, t_max = _get(f, "t_min"), _get(f, "t_max")
    if "target_range" in clauses and t_min is not None and t_max is not None:
        broken = t_min < -1e-6 or t_max > 1.0 + 1e-6
        out["target_range"] = ("warning", {"target_min": t_min, "target_max": t_max}) if broken else None
    if "target_nonnegative" in clauses and t_min is not None:
        out["target_nonnegative"] = ("warning", {"target_min": t_min}) if t_min < 0.0 else None
    if "target_signs" in clauses and _get(f, "t_off") is not None:
        off = _get(f, "t_off") or 0.0
        out["target_signs"] = ("warning", {"targets_not_pm1": off}) if off > 0.0 else None
    if "target_indices" in clauses and _get(f, "t_repeat") is not None:
        rep = _get(f, "t_repeat") or 0.0
        out["target_indices"] = ("warning", {"rows_repeating_a_class": rep}) if rep > 0.0 else None
    if "target_not_blank" in clauses and _get(f, "t_blank") is not None:
        blank = _get(f, "t_blank") or 0.0
        out["target_not_blank"] = ("warning", {"labels_blank": blank, "blank": call.option("blank", 0)}) \
            if blank > 0.0 else None
    if "target_probabilities" in clauses and t_min is not None and call.target_dim is not None:
        out["target_probabilities"] = _target_distribution(call, f, tol)
    return out


def _class_dim(call: LossCall) -> Optional[tuple[str, dict[str, Any]]]:
    shape = call.input_shape
    if call.producer in ("log_softmax", "softmax") and call.producer_dim is not None \
            and call.producer_dim != call.class_dim:
        return "warning", {"normalised_dim": call.producer_dim}
    if call.producer_linear and len(shape) >= 3 and call.class_dim == 1:
        return "info", {"normalised_dim": None}
    return None


def _target_distribution(call: LossCall, f: dict[str, Optional[float]], tol: float) -> Optional[tuple[str, dict[str, Any]]]:
    t_min, t_max = _get(f, "t_min"), _get(f, "t_max")
    sum_off, lse_off = _get(f, "t_sum_off") or 0.0, _get(f, "t_lse_off") or 0.0
    figs = {"target_min": t_min, "target_max": t_max, "rows_off": sum_off}
    if call.loss == "kl_div" and call.option("log_target", False):
        figs["rows_off"] = lse_off
        broken = (t_max is not None and t_max > tol) or lse_off > 0.0
        sure = t_max is not None and t_max > tol
    else:
        out_of_range = (t_min is not None and t_min < -tol) or (t_max is not None and t_max > 1.0 + tol)
        broken = out_of_range or sum_off > 0.0
        sure = out_of_range
    if not broken:
        return None
    return ("warning" if sure or call.dim_known else "info"), figs


class ContractJudge:
    """The verdicts of every loss contract clause, from probed calls and their figures."""

    def __init__(self, limits: Limits = Limits()) -> None:
        self.limits = limits
        self._tallies: dict[tuple[str, str, str], _Tally] = {}
        #: A breach came in since the last :meth:`conclude` (nothing new: nothing to conclude).
        self._fresh = False

    def update(self, call: LossCall, figures: dict[str, Optional[float]]) -> None:
        """One probed call of a loss (its host facts) and the figures its checks measured."""
        for clause, result in judge_call(call, figures, self.limits).items():
            tally = self._tallies.setdefault((call.loss, call.site, clause), _Tally())
            if tally.done:
                continue
            tally.probes += 1
            if result is None:
                continue
            severity, figs = result
            self._fresh = True
            tally.broken += 1
            if len(tally.steps) < 16:
                tally.steps.append(call.step)
            tally.worst, tally.severity, tally.call = figs, severity, call
            tally.host_fact = clause in _HOST_CLAUSES or (clause == "class_dim" and severity == "warning")

    def conclude(self) -> list[Verdict]:
        """The verdicts whose evidence is complete since the last call; each is given once."""
        if not self._fresh:
            return []
        self._fresh = False
        out = []
        for (loss, site, clause), tally in self._tallies.items():
            if tally.done or tally.call is None:
                continue
            enough = tally.broken >= 1 if tally.host_fact else (
                tally.broken >= self.limits.min_probes and tally.broken * 2 >= tally.probes)
            if not enough:
                continue
            tally.done = True
            call = tally.call
            evidence = {"loss": loss, "clause": clause, "site": site, "probes": tally.probes,
                        "probes_violating": tally.broken, "steps": tally.steps[:8],
                        "input_shape": list(call.input_shape),
                        "target_shape": list(call.target_shape) if call.target_shape is not None else None,
                        "producer_op": call.producer, **dict(call.options), **tally.worst}
            if call.broadcast_shape is not None:
                evidence["broadcast_shape"] = list(call.broadcast_shape)
            step = tally.steps[min(self.limits.min_probes, len(tally.steps)) - 1] if not tally.host_fact \
                else tally.steps[0]
            out.append(Verdict(CLAUSES[clause], clause, loss, site, call.module, tally.severity,
                               explain(clause, call, tally.worst, tally.broken, tally.probes), step,
                               tally.steps[0], evidence))
        return out
