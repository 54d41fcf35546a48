"""Non-finite values: find the first boundary and module where they appeared, and say so.

Two paths lead here. In immediate mode a hook found the offending tensor itself (a
:class:`Fault` with exact counts). In deferred mode a step's row arrived on the host with a
non-finite slot, and :func:`locate` walks the ladder over that row: data, forward (modules in
execution order), loss, gradients (backward order), updates.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, Callable, Optional

import numpy as np

from .._collect.probes.spikes import SpikeProbe
from .._collect.rungs import first_bad, groups
from .._errors import NonFiniteError, format_message
from .._findings import Finding
from .._record import StepRecord, TensorEvidence, shape_and_dtype
from .._record.fault import DATA_SHAPE_KEYS, Fault
from ..diagnosis.causes import rank_causes
from .base import Detector, RunContext

_log = logging.getLogger(__name__)

__all__ = ["NonFiniteDiagnosis", "core_rows_finite", "locate"]

_FP16_MAX = 65504.0


def core_rows_finite(values: np.ndarray, width: int) -> bool:
    return bool(np.isfinite(values[:width]).all())


def _flags(lo: float, hi: float) -> TensorEvidence:
    """What a (min, max) pair says about the kinds of non-finite values present."""
    ev = TensorEvidence()
    ev.nan = None
    ev.min = lo if math.isfinite(lo) else None
    ev.max = hi if math.isfinite(hi) else None
    return ev


def _present(lo: float, hi: float) -> str:
    kinds = []
    if math.isnan(lo) or math.isnan(hi):
        kinds.append("NaN")
    if hi == math.inf:
        kinds.append("+Inf")
    if lo == -math.inf:
        kinds.append("-Inf")
    return ", ".join(kinds) or "non-finite values"


def locate(record: StepRecord, ctx: RunContext, core_width: int) -> Optional[Fault]:
    """The first boundary (and module) with a non-finite slot in this step's row, or None.

    The order of the rungs, and what counts as non-finite at each, is ``_collect.rungs.LADDER``
    (the same table the cross-rank agreement uses); the fault is described by
    :meth:`Fault.at_rung`, as there, from what the row holds.
    """
    v = record.values
    if core_rows_finite(v, core_width):
        return None
    order = ctx.forward_order()
    hit = first_bad(v, record.blocks, record.meta, order, ctx.exact_norms)
    if hit is None:
        return None
    spec, i, key = hit
    kind = spec.kind
    detail: dict[str, object] = {}
    evidence = None
    value: Optional[float] = None
    previous: Optional[int] = None
    if len(spec.blocks) == 2:  # a (min, max) pair: what it holds, and the tensor's shape
        lo, hi = record.value(spec.blocks[0], key), record.value(spec.blocks[1], key)
        evidence = _flags(lo, hi)
        shapes = record.meta.shapes
        evidence.shape, evidence.dtype = shape_and_dtype(shapes.get(DATA_SHAPE_KEYS[i] if kind == "data" else i))
        detail["present"] = _present(lo, hi)
    else:
        value = record.value(spec.blocks[0], key)
    if kind == "forward":
        detail["module_type"] = ctx.module_types.get(ctx.module_names[i], "")
    elif kind == "loss":
        detail["present"] = _present(value if value is not None else math.nan, value if value is not None else math.nan)
        evidence = TensorEvidence(shape=(), dtype=None)
    elif kind == "outgrad":
        slots = [slot for slot, _, _ in groups(spec, record.blocks, order, record.meta)]
        at = slots.index(i)
        previous = slots[at - 1] if at > 0 else None  # the module whose backward produced it
    return Fault.at_rung(kind, record.step, i, key, ctx.module_names, ctx.owner, previous=previous,
                         value=value, evidence=evidence, **detail)


def update_ratio(records: Sequence[StepRecord], before_step: int, weights: Optional[set[str]] = None,
                 groups: Sequence[Sequence[str]] = ()) -> Optional[dict[str, Any]]:
    """The update/weight ratio of the last sampled step before ``before_step``, as
    ``update_ratio`` reads it (over the layer ``weights``, per optimizer): the evidence for
    'learning rate too high'. Its largest single-parameter ratio is kept as a detail only."""
    from ..diagnosis.causes import global_ratios

    for rec in reversed(records):
        if rec.step >= before_step or not rec.meta.updates_sampled:
            continue
        ratios = global_ratios(rec, weights, groups)
        if not ratios:
            continue
        ratio, who = max(ratios)
        upd = rec.array("update_norm").astype(np.float64)
        par = rec.array("param_norm").astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            per = np.where(par > 0, upd / np.maximum(par, 1e-30), 0.0)
        per = np.where(np.isfinite(per), per, 0.0)
        i = int(np.argmax(per)) if per.size else 0
        return {
            "step": rec.step,
            "ratio": ratio,
            "of": who,
            "max_ratio": float(per[i]) if per.size else 0.0,
            "max_ratio_param": rec.keys("update_norm")[i] if per.size else None,
        }
    return None


def _ratio_hint(ratio: Optional[dict[str, Any]], band: tuple[float, float]) -> str:
    """The last sampled update/weight ratio, read against the same band ``update_ratio`` uses,
    on the figure it prints: never "looks sane" for a value outside it, never "above" for one
    inside it."""
    if ratio is None:
        return ""
    low, high = band
    r = ratio["ratio"]
    if r > high:
        verdict = f"above the healthy band [{low:.0e}, {high:.3g}]: a learning rate too high is likely."
    elif r < low:
        verdict = (f"below the healthy band [{low:.0e}, {high:.3g}]: the weights were barely moving, "
                   "so the update is not what blew up.")
    else:
        verdict = f"inside the healthy band [{low:.0e}, {high:.3g}], so the update size is not the cause."
    who = ratio.get("of", "the layer weights")
    return f" The update/weight ratio at step {ratio['step']} was {r:.3g} (over {who}), " + verdict


def _found_in_weights(fault: Fault) -> bool:
    """Whether an ``updates`` fault is non-finite weights found when the next step began."""
    return "param_norm" in fault.detail or str(fault.detail.get("present", "")).startswith("non-finite parameter")


def _next_check(fault: Fault, ratio: Optional[dict[str, Any]],
                band: tuple[float, float] = (1e-7, 0.1)) -> str:
    b = fault.boundary
    ev = fault.evidence
    mtype = str(fault.detail.get("module_type", ""))
    if b == "data":
        return ("inspect the batch and its preprocessing: a NaN from division by a zero std "
                "(a constant feature), a log of zero or negative values, or missing values "
                "read as NaN. The model did not produce it.")
    hint_ratio = _ratio_hint(ratio, band)
    if b == "forward":
        big = max(abs(ev.min or 0.0), abs(ev.max or 0.0))
        if ev.dtype == "float16" or (big and big > _FP16_MAX * 0.5 and ev.dtype in ("float16", None)):
            return ("an fp16 overflow (|x| > 65504): use bfloat16 autocast, or scale the "
                    "activations down." + hint_ratio)
        if not fault.detail.get("inputs_finite", True):
            return ("the inputs of the first non-finite submodule were already non-finite: "
                    "look at the functional code in this module's forward (log of a "
                    "non-positive value? sqrt of a negative? division by a zero std?)." + hint_ratio)
        if mtype in ("Linear", "Conv1d", "Conv2d", "Conv3d", "Embedding", "Bilinear"):
            return ("check this layer's weights: they were finite before the step, so an update "
                    "blew them up (learning rate too high?) or its input is extreme." + hint_ratio)
        return ("check what this module computes: log of a non-positive value? division by a "
                "zero std or zero count? exp overflow (use a max-shifted softmax)?" + hint_ratio)
    if b == "loss":
        return ("the model's outputs were finite, so look at the loss: log of a probability that "
                "reached 0 (use log_softmax / BCEWithLogits), division by a zero count of "
                "valid targets, or a target outside the valid range.")
    if b == "gradients":
        if fault.detail.get("source") == "loss backward":
            return ("the gradient of the loss itself is non-finite: a loss whose derivative is "
                    "infinite at the point reached (log or sqrt at 0).")
        return ("this module's backward produced a non-finite gradient from a finite one: a "
                "function with an infinite derivative at the point reached (sqrt or norm at 0, "
                "log at 0, pow with a fractional exponent): add an epsilon." + hint_ratio)
    if b == "updates":
        if _found_in_weights(fault):
            return ("the weights were already non-finite when the next step began: made by this "
                    "optimizer step (a learning rate too high, an optimizer eps of 0, a non-finite "
                    "lr) or by code that changed them between steps (a checkpoint load, weight "
                    "surgery)." + hint_ratio)
        return ("gradients were finite but the optimizer step produced non-finite weights: a "
                "learning rate too high, an optimizer eps of 0, or a non-finite lr." + hint_ratio)
    return "inspect the evidence at this boundary."


class NonFiniteDiagnosis:
    """Turns a :class:`Fault` into a :class:`NonFiniteError` and a matching :class:`Finding`."""

    kind = "non_finite"

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        #: The spike probe's check for weights written between optimizer steps (None: no ring).
        self._weights_moved: Optional[Callable[[int], list[tuple[str, float, float]]]] = None

    def use_weight_norms(self, detectors: Sequence[Detector]) -> None:
        """Read the last weight norms of a detector's spike ring (``loss_spike``'s), so that a
        weight rewritten between two steps is named as the cause of what it then made
        non-finite."""
        for detector in detectors:
            for probe in detector.probes():
                if isinstance(probe, SpikeProbe):
                    self._weights_moved = probe.weights_moved
                    return

    def _moved(self, fault: Fault) -> list[tuple[str, float, float]]:
        """The weights rewritten since the optimizer's last step, for a fault the weights as they
        are now could have made: in the forward, the loss or backward of ``fault.step``, or
        weights found non-finite when the step after ``fault.step`` began (then: rewritten after
        that step's update, when the update itself left them finite)."""
        if self._weights_moved is None:
            return []
        if fault.boundary in ("forward", "loss", "gradients"):
            since = fault.step
        elif fault.boundary == "updates" and _found_in_weights(fault):
            since = fault.step + 1
        else:
            return []
        try:
            return self._weights_moved(since)
        except Exception as exc:  # the description of a fault must not fail on its evidence
            _log.debug("weight norms for the non-finite diagnosis not read: %r", exc)
            return []

    def _layer_weights(self) -> Optional[set[str]]:
        """The weights of Linear/Conv/RNN layers (``update_ratio``'s), or None when the run
        context names no module (then every parameter counts)."""
        from ._layers import is_layer_weight

        if not self.ctx.module_types:
            return None
        chosen = {p for p in self.ctx.param_names
                  if is_layer_weight(p, self.ctx.module_types.get(self.ctx.owner(p) or "", ""))}
        return chosen or None

    def error(self, fault: Fault, recent: Sequence[StepRecord], rank: Optional[int] = None) -> NonFiniteError:
        ev = fault.evidence
        weights = self._layer_weights()
        groups = self.ctx.optimizer_groups
        ratio = update_ratio(recent, fault.step, weights, groups)
        band = (self.ctx.threshold("update_ratio.low", 1e-7), self.ctx.threshold("update_ratio.high", 0.1))
        local = _next_check(fault, ratio, band)
        causes = rank_causes(fault.boundary, fault.detail, recent, fault.step, band, local=local,
                             weights=weights, groups=groups, moved=self._moved(fault))
        first = causes[0]
        if first.name.startswith("local_") or first.name == "data":
            advice = local
        else:
            others = "; ".join(f"({i}) {c.text}" for i, c in enumerate(causes[1:3], start=2))
            advice = (f"likely causes, most likely first: (1) {first.text}."
                      + (f" Then: {others}" if others else ""))
        if fault.boundary == "loss" and self.ctx.adversarial():
            # A GAN's generator loss runs through the discriminator: a value that model made
            # (its outputs, its weights after its own step) reaches this loss without passing
            # through any module of this one, and its own sentinel names where it started.
            fault.detail["loss_through_other_model"] = True
            advice = ("this loss also runs through another attached model (a backward reached both: "
                      "an adversarial loop such as a GAN's), so a non-finite value that model made, in "
                      "its outputs or in its weights after its own step, arrives here first: check that "
                      "model's report at this step. Otherwise: " + advice)
        if fault.module is not None and fault.module in self.ctx.module_types:
            # the type of the module named, never of the child whose output first went bad
            # (a NaN from F.softmax in CausalSelfAttention.forward is not the Linear's)
            if fault.detail.get("module_type") and fault.detail["module_type"] != self.ctx.module_types[fault.module]:
                fault.detail.setdefault("first_nonfinite_output_type", fault.detail["module_type"])
            fault.detail["module_type"] = self.ctx.module_types[fault.module]
        elif fault.module is not None and not fault.detail.get("module_type"):
            fault.detail["module_type"] = self.ctx.module_types.get(fault.module, "")
        module_txt = (f"module {fault.module or '<model>'!r}" + (
            f" ({fault.detail['module_type']})" if fault.detail.get("module_type") else "")
            if fault.module is not None else "no module (" + _boundary_subject(fault) + ")")
        counts: str
        if ev.nan is not None:
            counts = f"{ev.nan} NaN, {ev.posinf} +Inf, {ev.neginf} -Inf"
        else:
            present = fault.detail.get("present", "non-finite values")
            kinds = fault.detail.get("kinds")
            counts = (f"{kinds} present ({present}; exact counts need check='immediate')" if kinds
                      else f"{present} present (exact counts need check='immediate')")
        shape = f"shape {tuple(ev.shape)}" if ev.shape is not None else "shape unknown"
        dtype = f"dtype {ev.dtype}" if ev.dtype else "dtype unknown"
        rank_txt = f" on rank {rank}" if rank is not None else ""
        extra = ""
        if "incoming_to" in fault.detail:
            extra = f"; the gradient flowing into {fault.detail['incoming_to']!r} was the first non-finite one"
        if "parameter" in fault.detail:
            extra = f"; parameter {fault.detail['parameter']!r}"
        if fault.detail.get("inputs_finite") is False:
            extra = f"; first non-finite output came from {fault.detail.get('first_nonfinite_output_of')!r} whose inputs were already non-finite"
        message = format_message(
            f"non-finite values first appeared at step {fault.step}, boundary {fault.boundary!r}, "
            f"{module_txt}{rank_txt}; likely cause: {_CAUSE_NAMES.get(first.name, first.name)}",
            expected=_expected(fault.boundary),
            arrived=f"a tensor of {shape}, {dtype} with {counts}",
            where=f"step {fault.step} (0-based: optimizer steps completed before it), "
                  f"{module_txt}{extra}",
            next_check=advice,
        )
        evidence = {
            "nan": ev.nan, "posinf": ev.posinf, "neginf": ev.neginf,
            "shape": list(ev.shape) if ev.shape is not None else None, "dtype": ev.dtype,
            "finite_min": ev.min, "finite_max": ev.max, **fault.detail,
        }
        if ratio is not None:
            evidence["update_ratio_before"] = ratio
        evidence["likely_cause"] = first.name
        evidence["likely_causes"] = [c.to_dict() for c in causes[:4]]
        return NonFiniteError(
            message, step=fault.step, boundary=fault.boundary, module=fault.module,
            nan=ev.nan, posinf=ev.posinf, neginf=ev.neginf,
            shape=tuple(ev.shape) if ev.shape is not None else None, dtype=ev.dtype,
            rank=rank, evidence=evidence,
        )

    def finding(self, err: NonFiniteError) -> Finding:
        return Finding(
            kind="non_finite", boundary=err.boundary,  # type: ignore[arg-type]
            module=err.module, step=err.step, severity="error",
            message=str(err).splitlines()[0], evidence=err.evidence,
            next_check=_CAUSE_CHECK.get(str(err.evidence.get("likely_cause")))
            or _NEXT_CHECK.get(err.boundary, "inspect_boundary"), rank=err.rank,
        )


_CAUSE_NAMES = {
    "learning_rate": "learning rate too high",
    "accumulating_gradients": "gradients accumulating across steps (zero_grad() missing)",
    "data": "the batch",
    "local_forward": "the computation in this module",
    "local_loss": "the loss computation",
    "local_gradients": "a backward with an infinite derivative",
    "local_updates": "the optimizer step",
    "weights_changed": "a weight changed between optimizer steps",
}

_CAUSE_CHECK = {
    "weights_changed": "inspect_weight_writes_between_steps",
    "learning_rate": "lower_learning_rate",
    "accumulating_gradients": "clear_gradients_every_step",
}

_NEXT_CHECK = {
    "data": "inspect_data_pipeline",
    "forward": "inspect_forward_values",
    "loss": "inspect_loss_definition",
    "gradients": "inspect_backward_path",
    "updates": "inspect_optimizer_update",
}


def _boundary_subject(fault: Fault) -> str:
    return {
        "data": "the batch fed to the model",
        "loss": "the loss computed from the model's outputs",
        "gradients": "the gradient of the loss",
        "updates": "the optimizer step",
    }.get(fault.boundary, fault.boundary)


def _expected(boundary: str) -> str:
    return {
        "data": "a batch of finite values",
        "forward": "finite outputs from every module, given finite inputs",
        "loss": "a finite loss from finite model outputs",
        "gradients": "finite gradients from every module's backward, given a finite incoming gradient",
        "updates": "finite parameters after the optimizer step, given finite gradients",
    }.get(boundary, "finite values")
