"""A non-finite fault, described once: where it was first seen, and what was there.

Three paths find a fault: a hook in immediate mode (the tensor itself in hand: exact counts),
the host walking a landed row in deferred mode (``detectors/nonfinite.locate``), and the
cross-rank agreement (``_distributed.RankSync``: the rung and rank only). Each builds its
:class:`Fault` with the constructors below, one per rung of the ladder, so the same fault reads
the same whichever path found it; the error, the finding, TensorBoard, the report and the
agreement all render that record (``detectors/nonfinite.NonFiniteDiagnosis``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional

from .step import TensorEvidence

__all__ = ["DATA_SHAPE_KEYS", "Fault"]

#: ``StepMeta.shapes`` keys of the main and the extra model inputs (module slots are >= 0).
DATA_SHAPE_KEYS = (-1, -2)


class Fault:
    """Non-finite values first seen at ``step``, ``boundary`` and ``module`` (None: no module).

    ``evidence`` is what is known of the offending tensor (exact NaN/Inf counts when a hook had
    it in hand); ``detail`` holds the rung's own facts (the parameter, the input, the module
    whose backward made a gradient, how it was located), which become the error's evidence.
    """

    __slots__ = ("boundary", "detail", "evidence", "module", "step")

    def __init__(self, step: int, boundary: str, module: Optional[str], evidence: TensorEvidence,
                 detail: dict[str, Any]) -> None:
        self.step = step
        self.boundary = boundary
        self.module = module
        self.evidence = evidence
        self.detail = detail

    # -- one constructor per rung ---------------------------------------------------------
    @classmethod
    def data(cls, step: int, evidence: TensorEvidence, input_name: str, **detail: Any) -> Fault:
        """The batch (or an extra input) arrived non-finite."""
        return cls(step, "data", None, evidence, {"input": input_name, **detail})

    @classmethod
    def forward(cls, step: int, module: str, evidence: TensorEvidence, module_type: str, *,
                caller: Optional[tuple[str, str]] = None, **detail: Any) -> Fault:
        """``module``'s output was the first non-finite one. With ``caller`` (its name and
        type), the module's inputs were already non-finite: the caller's functional code made
        them, and the fault is charged to it."""
        info: dict[str, Any] = {"module_type": module_type, **detail}
        if caller is not None:
            info.update(inputs_finite=False, first_nonfinite_output_of=module,
                        first_nonfinite_output_type=module_type, module_type=caller[1])
            module = caller[0]
        return cls(step, "forward", module, evidence, info)

    @classmethod
    def loss(cls, step: int, evidence: TensorEvidence, key: str = "auto", **detail: Any) -> Fault:
        """The loss was non-finite although the model's outputs were finite."""
        info: dict[str, Any] = {"loss": key, **detail}
        if key == "explicit":
            info["explicit"] = True
        return cls(step, "loss", None, evidence, info)

    @classmethod
    def output_gradient(cls, step: int, incoming_to: str, made_by: Optional[str],
                        evidence: TensorEvidence, **detail: Any) -> Fault:
        """The gradient arriving at ``incoming_to``'s output was the first non-finite one in
        backward order: ``made_by``'s backward produced it (None: the loss's own backward)."""
        source = "module backward" if made_by is not None else "loss backward"
        return cls(step, "gradients", made_by, evidence, {"incoming_to": incoming_to, "source": source, **detail})

    @classmethod
    def gradient_norm(cls, step: int, module: Optional[str], parameter: str, norm: Optional[float],
                      **detail: Any) -> Fault:
        info: dict[str, Any] = {"present": "non-finite gradient norm", "parameter": parameter, **detail}
        if norm is not None:
            info.update(grad_norm=norm, kinds=norm_kinds(norm))
        return cls(step, "gradients", module, TensorEvidence(), info)

    @classmethod
    def stale_gradients(cls, step: int, norm: Optional[float], **detail: Any) -> Fault:
        info: dict[str, Any] = {"present": "non-finite gradients carried over from the previous step", **detail}
        if norm is not None:
            info["kinds"] = norm_kinds(norm)
        return cls(step, "gradients", None, TensorEvidence(), info)

    @classmethod
    def weights(cls, step: int, module: Optional[str], parameter: str, norm: Optional[float] = None,
                evidence: Optional[TensorEvidence] = None, **detail: Any) -> Fault:
        """Weights found non-finite at the start of ``step``: the update of the step before made
        them (at step 0: the initial weights, or a checkpoint, were already non-finite)."""
        present = ("non-finite parameter before the first step (initialisation or checkpoint)" if step == 0
                   else "non-finite parameter after the optimizer step")
        info: dict[str, Any] = {"present": present, "parameter": parameter, **detail}
        if norm is not None:
            info.update(param_norm=norm, kinds=norm_kinds(norm))
        return cls(max(step - 1, 0), "updates", module, evidence or TensorEvidence(), info)

    @classmethod
    def update(cls, step: int, module: Optional[str], parameter: str, norm: Optional[float],
               **detail: Any) -> Fault:
        info: dict[str, Any] = {"present": "non-finite update", "parameter": parameter, **detail}
        if norm is not None:
            info["kinds"] = norm_kinds(norm)
        return cls(step, "updates", module, TensorEvidence(), info)

    @classmethod
    def at_rung(cls, kind: str, step: int, index: int, key: str, module_names: Sequence[str],
                owner: Callable[[str], Optional[str]], *, previous: Optional[int] = None,
                value: Optional[float] = None, evidence: Optional[TensorEvidence] = None,
                **detail: Any) -> Fault:
        """The fault at one rung of the ladder (``_collect/rungs.LADDER``'s ``kind``), from the
        row: the slot's ``index`` and ``key``, its ``value`` where the row is in hand, and for
        an output gradient the module reached ``previous``ly in backward order."""
        ev = evidence or TensorEvidence()
        if kind == "weights":
            return cls.weights(step, owner(key), key, value, ev, **detail)
        if kind == "data":
            return cls.data(step, ev, "args[0]" if index == 0 else "extra input", **detail)
        if kind == "forward":
            return cls.forward(step, module_names[index], ev, detail.pop("module_type", ""), **detail)
        if kind == "loss":
            return cls.loss(step, ev, key, **detail)
        if kind == "outgrad":
            made_by = module_names[previous] if previous is not None else None
            return cls.output_gradient(step, module_names[index], made_by, ev, **detail)
        if kind == "grad_norm":
            return cls.gradient_norm(step, owner(key), key, value, **detail)
        if kind == "update_norm":
            return cls.update(step, owner(key), key, value, **detail)
        return cls.stale_gradients(step, value, **detail)


def norm_kinds(norm: float) -> str:
    """What a non-finite L2 norm says about its tensor: NaN propagates; +inf means an Inf of
    either sign (or a NaN-free overflow, which the caller rules out)."""
    return "NaN" if norm != norm else "Inf"
