"""The facts a detector can read from a :class:`~torch_sentinel.StepRecord`, by type.

Declare the ones a detector needs in its ``reads`` and ask a record for them with
``record.fact(GradNorms)``; each is a frozen dataclass of host numbers (never a live tensor),
or None on a step that has none. Every fact is declared next to the probe that collects it; this
module only gathers the public ones. The training loss itself is ``record.loss`` (and
``record.validation``), and the learning rates ``record.meta.lrs``.
"""

from ._collect.amp import LossScale
from ._collect.probes.data import InputRange
from ._collect.probes.forward import Activations
from ._collect.probes.norms import GradNorms, StaleGradients, WeightNorms
from ._collect.probes.outgrad import OutputGradients
from ._collect.probes.updates import UpdateNorms
from ._record import Fact
from .precision.probe import PrecisionRows

__all__ = [
    "Activations",
    "Fact",
    "GradNorms",
    "InputRange",
    "LossScale",
    "OutputGradients",
    "PrecisionRows",
    "StaleGradients",
    "UpdateNorms",
    "WeightNorms",
]
