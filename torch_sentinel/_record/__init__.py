"""The step record: everything known about one optimizer step, on its way from the collectors
(``_collect``) to the detectors, the diagnosis and the sinks."""

from .fact import Fact
from .record import FactSources, StepRecord
from .step import StepMeta, TensorEvidence, shape_and_dtype

__all__ = ["Fact", "FactSources", "StepMeta", "StepRecord", "TensorEvidence", "shape_and_dtype"]
