"""What the run record and the incident recorder read of the sentinel.

Declared here, as a protocol, so that ``repro/`` does not import ``_api`` (which imports
``repro/`` to build them): the dependency runs one way, even for type checking.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

import torch
from torch import nn

from .._collect.probe import Probe
from .._errors import NonFiniteError
from .._findings import Finding
from .._record import StepRecord

__all__ = ["SentinelView"]


class SentinelView(Protocol):
    """The part of :class:`~torch_sentinel.Sentinel` that ``repro/`` uses."""

    manifest: dict[str, Any]
    rank: Optional[int]
    check_mode: str

    @property
    def options(self) -> Any: ...

    @property
    def root(self) -> nn.Module: ...

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]: ...

    @property
    def step(self) -> int: ...

    @property
    def findings(self) -> list[Finding]: ...

    @property
    def on_nonfinite_callbacks(self) -> list[Callable[[NonFiniteError, Any], None]]: ...

    def recent_records(self) -> list[StepRecord]: ...

    def add_probe(self, probe: Probe) -> None: ...
