"""The model's inputs: min and max of the batch and of any extra input, checked for non-finite values."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

from ..._record import Fact, StepRecord
from ..._record.fault import DATA_SHAPE_KEYS, Fault
from ..probe import Probe, ProbeHost
from ..tensors import tensor_evidence

__all__ = ["DataProbe", "InputRange"]


@dataclasses.dataclass(frozen=True)
class InputRange(Fact):
    """The smallest and largest value of the model's floating inputs in the step: the batch
    (``inputs``) and any extra input such as an attention mask (``aux``)."""

    inputs: tuple[float, float]
    aux: tuple[float, float]


class DataProbe(Probe):
    name = "data"
    publishes = (InputRange,)

    def setup(self, host: ProbeHost) -> None:
        self.host = host
        self.lo, self.hi = host.ledger.add_minmax_block("data", ["inputs", "aux"])
        host.provide(InputRange, _input_range)

    def on_data(self, t: torch.Tensor, main: bool, name: Optional[str], compiling: bool) -> None:
        host = self.host
        k = 0 if main else 1
        lo, hi = self.lo.start + k, self.hi.start + k
        host.reduce_into(t, lo, hi, compiling, "data")
        if compiling:
            return
        host.meta.shapes[DATA_SHAPE_KEYS[k]] = (t.shape, t.dtype)
        if host.immediate:
            # Additive masks legitimately hold -inf, so only the main input must be free of it.
            low = host.host_value(lo)
            if not host.finite(hi) or math.isnan(low) or (main and math.isinf(low)):
                host.on_fault(Fault.data(host.step, tensor_evidence(t), name or ("args[0]" if main else "extra input")))


def _input_range(record: StepRecord) -> Optional[InputRange]:
    if not record.has("data.min"):
        return None
    lo, hi = record.array("data.min").tolist(), record.array("data.max").tolist()
    return InputRange((lo[0], hi[0]), (lo[1], hi[1]))
