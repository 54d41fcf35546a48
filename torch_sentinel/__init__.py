"""torch_sentinel: find training faults early in an existing PyTorch loop, and say where they start.

    sentinel = torch_sentinel.attach(model, optimizer, log_dir="runs/exp")

Evidence is checked along a ladder: data → shapes → forward → loss → gradients → updates → curves.
"""

from __future__ import annotations

from ._api import Sentinel
from ._attach import attach
from ._errors import (
    InstrumentationError,
    NonFiniteError,
    OptionError,
    ReplicaDivergenceError,
    SentinelError,
    ShapeContractError,
)
from ._findings import BOUNDARIES, Finding
from ._record import StepRecord
from .detectors import Detector, RunContext, Threshold
from .diagnosis import Report
from .repro import check_determinism, replay, seed_everything
from .shapes import check_shapes, expect

__version__ = "0.1.0"

__all__ = [
    "BOUNDARIES",
    "Detector",
    "Finding",
    "InstrumentationError",
    "NonFiniteError",
    "OptionError",
    "ReplicaDivergenceError",
    "Report",
    "RunContext",
    "Sentinel",
    "SentinelError",
    "ShapeContractError",
    "StepRecord",
    "Threshold",
    "__version__",
    "attach",
    "check_determinism",
    "check_shapes",
    "expect",
    "replay",
    "seed_everything",
]
