"""What a detector comparing consecutive steps keeps of the previous one: plain data (it is
checkpointed with the detector's state), never the record itself."""

from __future__ import annotations

import dataclasses
from typing import Optional

from .._collect.probes.norms import GradNorms, WeightNorms
from .._record import StepRecord

__all__ = ["PreviousStep"]


@dataclasses.dataclass
class PreviousStep:
    """What a comparison needs of the previous step (plain data: it is checkpointed)."""

    step: int
    row: int
    #: A backward ran and the AMP scaler did not skip the step.
    trained: bool
    lrs: list[Optional[float]]
    frozen: tuple[str, ...]
    grad_missing: tuple[str, ...]
    stepped: list[int]
    #: Weight norms as the step found them (None where they were not read).
    weights: Optional[dict[str, float]]
    #: The gradient norms the step applied (after clipping: a gradient clipped to 0 moves nothing).
    grads: dict[str, float]

    @classmethod
    def of(cls, rec: StepRecord) -> PreviousStep:
        meta, w, g = rec.meta, rec.fact(WeightNorms), rec.fact(GradNorms)
        return cls(rec.step, meta.row, bool(meta.backward_calls) and not meta.amp_skipped, list(meta.lrs),
                   meta.frozen, meta.grad_missing, list(meta.stepped), w.by_name() if w is not None else None,
                   dict(zip(g.names, g.at_step.tolist())) if g is not None else {})
