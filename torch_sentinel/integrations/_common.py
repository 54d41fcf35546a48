"""What the framework callbacks share: unwrapping optimizers, detaching quietly."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Callable, Optional

import torch

from .._api import Sentinel
from .._unwrap import unwrap_optimizer
from ..sinks.framework import FrameworkSink

__all__ = ["detach_quietly", "forward_findings", "torch_optimizers"]

logger = logging.getLogger("torch_sentinel")


def torch_optimizers(optimizers: Iterable[Any]) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside framework wrappers (accelerate's ``AcceleratedOptimizer``,
    Lightning's ``LightningOptimizer``): the step hooks must sit on the object that steps."""
    found = []
    for opt in optimizers:
        opt = unwrap_optimizer(opt)
        if isinstance(opt, torch.optim.Optimizer):
            found.append(opt)
    return found


def detach_quietly(sentinel: Optional[Sentinel]) -> None:
    """Detach while another exception may be propagating: never mask it."""
    if sentinel is None or not sentinel.attached:
        return
    try:
        sentinel.detach(quiet=True)
    except Exception as exc:
        logger.debug("torch_sentinel: detach after an exception failed: %s", exc)


def forward_findings(sink: FrameworkSink, warn: Callable[..., Any], step_name: str) -> None:
    """New findings to the framework's console logger, one line each, in its step numbering."""
    for f in sink.take_findings():
        where = f" in {f.module or '<model>'}" if f.module is not None else ""
        at = f" at {step_name} {f.step}" if f.step is not None else ""
        warn("torch_sentinel: [%s] %s (%s)%s%s: %s", f.severity, f.kind, f.boundary, where, at,
             f.message.splitlines()[0] if f.message else "")
