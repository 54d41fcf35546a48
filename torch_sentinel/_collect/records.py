"""Host-side records: plain numbers describing one optimizer step. Never a live tensor."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from .ledger import SlotRange

__all__ = ["StepMeta", "StepRecord", "TensorEvidence", "shape_and_dtype"]


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
    validation: Optional[float] = None
    validation_on_device: bool = False
    #: Free-form host facts added by detectors' taps (plain values only).
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


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


class StepRecord:
    """One step's slots copied to the host, with the step's host-side meta."""

    __slots__ = ("blocks", "meta", "values")

    def __init__(self, meta: StepMeta, values: np.ndarray, blocks: dict[str, SlotRange]) -> None:
        self.meta = meta
        self.values = values
        self.blocks = blocks

    @property
    def step(self) -> int:
        return self.meta.step

    def has(self, name: str) -> bool:
        return name in self.blocks

    def array(self, name: str) -> np.ndarray:
        b = self.blocks[name]
        return self.values[b.start : b.stop]

    def keys(self, name: str) -> list[str]:
        return self.blocks[name].keys

    def mapping(self, name: str) -> dict[str, float]:
        b = self.blocks[name]
        return dict(zip(b.keys, self.values[b.start : b.stop].tolist()))

    def value(self, name: str, key: str) -> float:
        b = self.blocks[name]
        return float(self.values[b.index(key)])

    @property
    def loss(self) -> Optional[float]:
        """The training loss of this step: the explicit one when given, else the sum of the
        losses that ``backward()`` was called on (so ``(loss / k).backward()`` over k
        micro-batches records the mean)."""
        if self.meta.loss_explicit:
            return self.value("loss", "explicit")
        if self.meta.backward_calls:
            return self.value("loss", "auto")
        return None

    @property
    def validation(self) -> Optional[float]:
        if self.meta.validation_on_device:
            return self.value("loss", "validation")
        return self.meta.validation
