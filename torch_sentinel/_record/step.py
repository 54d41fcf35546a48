"""The host side of one optimizer step: what is known about it without reading the device.

A :class:`StepMeta` is created when its step opens (``_collect/open_step.py``), filled by the
probes while the step runs (plain Python values only, never a live tensor), and sealed with the
step's row of device slots into a :class:`~torch_sentinel._record.record.StepRecord` once the
row reaches the host.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from .fact import Fact

__all__ = ["StepMeta", "TensorEvidence", "shape_and_dtype"]


def shape_and_dtype(entry: Optional[tuple[Any, Any]]) -> tuple[Optional[tuple[int, ...]], Optional[str]]:
    """A ``StepMeta.shapes`` entry as plain values: ``((8, 16), "float32")``."""
    if not entry:
        return None, None
    shape, dtype = entry
    return tuple(int(s) for s in shape), str(dtype).replace("torch.", "")


@dataclasses.dataclass
class StepMeta:
    """What the host knows about a step without reading the device."""

    step: int
    #: Rows closed before this one: consecutive, where ``step`` follows a framework's numbering
    #: (Lightning's manual optimization with two optimizers numbers steps 0, 2, 4, ...).
    row: int = 0
    backward_calls: int = 0
    forward_calls: int = 0
    loss_explicit: bool = False
    amp: bool = False
    amp_skipped: bool = False
    lrs: list[Optional[float]] = dataclasses.field(default_factory=list)
    lr_names: list[str] = dataclasses.field(default_factory=list)
    #: Parameter names that had no .grad at the optimizer step.
    grad_missing: tuple[str, ...] = ()
    #: Parameters that were trainable (requires_grad) at the step, by name; None means all.
    frozen: tuple[str, ...] = ()
    #: Output-gradient slots (indices into the outgrad block) in the order backward reached them.
    bwd_order: list[int] = dataclasses.field(default_factory=list)
    #: (torch.Size, torch.dtype) of the last tensor reduced into each forward slot; kept raw on
    #: the hot path, formatted by :func:`shape_and_dtype` when a fault is reported.
    shapes: dict[int, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
    #: Every module output's gradient was reduced in this step (otherwise only the outputs
    #: that feed custom modules, functional code or the loss: see _plan_gradient_watch).
    outgrad_complete: bool = False
    #: The weight norms in ``param_norm`` were taken at this step's optimizer pre-step hook.
    weights_recorded: bool = False
    updates_sampled: bool = False
    stale_grads: int = 0
    #: Parameters whose gradient or weight L2 norm overflowed float32 although every value was
    #: finite (confirmed exactly on CPU); their slot holds float32's max instead of +inf.
    norm_overflow: list[str] = dataclasses.field(default_factory=list)
    #: The loop clipped this model's gradients in the step (``clip_grad_norm_``).
    clipped: bool = False
    #: With several optimizers: the indices of those that stepped in this row. A generator
    #: stepping once per five critic steps leaves rows where its weights do not move by
    #: design, so detectors judge a parameter only in its optimizer's rows.
    stepped: list[int] = dataclasses.field(default_factory=list)
    validation: Optional[float] = None
    validation_on_device: bool = False
    #: The step was abandoned mid-way (a fault raised before ``optimizer.step()``): the record
    #: holds what the step saw up to the fault, and its gradients were never read.
    partial: bool = False
    #: Facts the probes published on the host during the step, by type (see ``fact.py``).
    facts: dict[type[Fact], Fact] = dataclasses.field(default_factory=dict)
    #: Device facts whose slots the probes wrote in this step's row (decoded once it landed;
    #: a fact a probe writes only on some steps is absent from the others).
    in_row: set[type[Fact]] = dataclasses.field(default_factory=set)

    def publish(self, fact: Fact) -> None:
        """Attach ``fact`` to this step (one fact per type: a later one replaces it)."""
        self.facts[type(fact)] = fact


@dataclasses.dataclass
class TensorEvidence:
    """The facts about one offending tensor."""

    shape: Optional[tuple[int, ...]] = None
    dtype: Optional[str] = None
    nan: Optional[int] = None
    posinf: Optional[int] = None
    neginf: Optional[int] = None
    min: Optional[float] = None
    max: Optional[float] = None
